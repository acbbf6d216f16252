"""The compatibility endpoints: ad-hoc texts in the shapes of the clients users already have (Cohere v1 / v2,
Jina, Voyage, TEI, vLLM, Infinity; LiteLLM through them). POST /v2/rerank, /rerank and /infinity/rerank are
here; /v1/rerank with `documents` comes here from services/native.py."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from typing import Any

from aheadrank.services.backend import RequestError, StageClock, Work
from aheadrank.services.errors import ERRORS, ApiError, request_id_of
from aheadrank.services.handlers import Handler, server_timing
from aheadrank.services.schemas import CompatRerankResponse, DocumentsRequest, DocumentTooLong, TeiRank
from aheadrank.services.shapes import SHAPES
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse


def probability(log_odds: float) -> float:
    """The sigmoid, without overflow for any finite score (a blank text's BLANK_SCORE gives 0.0)."""
    if log_odds >= 0:
        return 1.0 / (1.0 + math.exp(-log_odds))
    e = math.exp(log_odds)
    return e / (1.0 + e)


class TextsHandler(Handler):
    """Ad-hoc texts: their document side is looked up in the store, the text cache, or encoded online."""

    async def rank_documents(
        self, req: DocumentsRequest, request: Request, endpoint: str, style: str
    ) -> JSONResponse:
        """Ad-hoc texts (the document side runs online), answered in the shape of the API `style` names."""
        self.check_query(req.query)
        try:
            docs, items = req.docs(), req.items(self.settings.max_document_chars)
        except DocumentTooLong as exc:
            raise ApiError(413, str(exc), "document_too_long") from exc
        except ValueError as exc:
            raise ApiError(422, f"{exc}. {SHAPES[endpoint]}", "validation") from exc
        if not items:
            raise ApiError(422, "documents must not be empty", "validation")
        if len(items) > self.settings.max_documents:
            raise ApiError(
                413,
                f"{len(items)} documents; the limit is {self.settings.max_documents} per request",
                "too_many_documents",
            )
        long = [i for i, t in enumerate(items) if len(t) > self.settings.max_document_chars]
        if long:
            raise ApiError(
                413,
                f"document(s) {long[:10]} over the limit of {self.settings.max_document_chars} characters",
                "document_too_long",
            )
        arrival = request.state.arrival
        clock = StageClock()

        def work(w: Work):
            clock.seconds["queue"] = time.perf_counter() - arrival
            if self.backend.blank_query(req.query):
                raise RequestError(
                    "query: makes no word piece (only spaces, zero-width or control characters): nothing to rank by",
                    "validation",
                    422,
                )
            if req.refuse_long():
                over = self.backend.overlong(items)
                if over:
                    raise RequestError(
                        f"{len(over)} text(s) longer than the model reads ({self.backend.max_doc_len()} word pieces), "
                        f"e.g. texts.{over[0][0]} with {over[0][1]}: `truncate: false` refuses instead of "
                        "cutting (send `truncate: true` to cut them, or leave it out to score them as passages)",
                        "input_too_long",
                        413,
                    )
            passages = self.backend.passage_options(
                req.max_chunks_per_doc, req.max_tokens_per_doc, req.cut_long()
            )
            return (yield from self.backend.score_texts_steps(req.query, items, clock, w, passages=passages))

        scores, tokens = await self.model.run(work, request, endpoint)
        shown = [probability(s) if not req.raw_scores else s for s in scores]
        order = sorted(range(len(items)), key=lambda i: (-scores[i], i))
        if req.keep():
            order = order[: req.keep()]
        total = time.perf_counter() - arrival
        self.metrics.observe_stages(endpoint, clock.seconds)
        self.metrics.candidates.labels(endpoint).observe(len(items))
        kind = self.backend.score_kind()  # calibrated / relative / uncalibrated (services/README.md)
        headers = {"Server-Timing": server_timing(clock.seconds, total), "X-Relevance-Score": kind}
        timings = {**clock.ms(), "total_ms": round(total * 1e3, 3)}
        if style == "tei":
            ranks = [
                TeiRank(index=i, score=shown[i], text=items[i] if req.return_text else None) for i in order
            ]
            return JSONResponse([r.model_dump(exclude_none=True) for r in ranks], headers=headers)

        def as_object(i: int) -> dict:  # Cohere / Jina / vLLM: {text, ...the client's own fields, e.g. id}
            d = docs[i]
            return dict(d) if isinstance(d, dict) else {"text": d}

        want = bool(req.return_documents)
        results = []
        for i in order:
            result: dict[str, Any] = {"index": i, "relevance_score": shown[i]}
            if want:
                result["document"] = items[i] if style == "infinity" else as_object(i)
            results.append(result)
        request_id = request_id_of(request) or uuid.uuid4().hex
        if style == "infinity":
            body: dict[str, Any] = {
                "object": "rerank",
                "id": request_id,
                "created": int(time.time()),
                "model": self.backend.model_name,
                "results": results,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
            return JSONResponse(body, headers=headers)
        body = {
            "id": request_id,
            "model": self.backend.model_name,
            "results": results,
            "usage": {"total_tokens": tokens},
            "meta": {
                "api_version": {"version": "2" if style == "v2" else "1"},
                "billed_units": {"search_units": 1},
                "timings": timings,
                "relevance_score": kind,
            },
        }
        if (
            style == "v1"
        ):  # Voyage reads `data` (its `document` is the text); Cohere v1 and Jina read `results`
            body["object"] = "list"
            body["data"] = [{**r, "document": items[r["index"]]} if want else dict(r) for r in results]
        return JSONResponse(body, headers=headers)


def compat_routes(app: FastAPI, h: TextsHandler, require_key: Callable) -> None:
    """/v2/rerank (Cohere v2), /rerank (TEI, vLLM / Cohere), /infinity/rerank (Infinity)."""

    @app.post(
        "/v2/rerank",
        response_model=None,
        tags=["rerank"],
        dependencies=[Depends(require_key)],
        responses={200: {"model": CompatRerankResponse}, **ERRORS},
    )
    async def rerank_v2(req: DocumentsRequest, request: Request):
        """Cohere v2: `{model, query, documents, top_n?, max_tokens_per_doc?}` → `{id, results: [{index,
        relevance_score}], meta}` (`document` only with `return_documents: true`, as the v5 SDKs asked)."""
        return await h.rank_documents(req, request, "/v2/rerank", "v2")

    @app.post(
        "/rerank",
        response_model=None,
        tags=["rerank"],
        dependencies=[Depends(require_key)],
        responses={200: {"model": CompatRerankResponse | list[TeiRank]}, **ERRORS},
    )
    async def rerank_compat(req: DocumentsRequest, request: Request):
        """TEI `{query, texts, return_text?, raw_scores?, truncate?}` → `[{index, score, text?}]`; vLLM / Cohere
        `{query, documents, ...}` → `{id, model, results: [{index, relevance_score, document?}], usage}`."""
        return await h.rank_documents(req, request, "/rerank", "tei" if req.texts is not None else "vllm")

    @app.post(
        "/infinity/rerank",
        response_model=None,
        tags=["rerank"],
        dependencies=[Depends(require_key)],
        responses={200: {"model": CompatRerankResponse}, **ERRORS},
    )
    async def rerank_infinity(req: DocumentsRequest, request: Request):
        """Infinity's `/rerank` (LiteLLM `infinity/…` with `api_base=<server>/infinity`): `document` is a string."""
        return await h.rank_documents(req, request, "/infinity/rerank", "infinity")
