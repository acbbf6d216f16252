"""The native endpoint, POST /v1/rerank: BM25 top-`depth` (or the given docids) re-ranked through the stored
representations. The same path takes Cohere v1 / Jina / Voyage bodies (with `documents`), answered by
services/compat.py."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated

from aheadrank.services.backend import StageClock
from aheadrank.services.compat import TextsHandler
from aheadrank.services.errors import ERRORS, ApiError, request_id_of
from aheadrank.services.handlers import Handler, server_timing
from aheadrank.services.schemas import (
    BudgetReport,
    CompatRerankResponse,
    DocumentsRequest,
    RerankRequest,
    RerankResponse,
    RerankResult,
    Timings,
)
from aheadrank.services.shapes import V1Body
from fastapi import Body, Depends, FastAPI, Request
from fastapi.responses import JSONResponse


class NativeHandler(Handler):
    """The native shape: candidates from BM25 or the request, scored from the store."""

    async def rerank_native(self, req: RerankRequest, request: Request) -> JSONResponse:
        self.check_query(req.query)
        if req.candidates is not None:
            if len(req.candidates) > self.settings.max_candidates:
                raise ApiError(
                    413,
                    f"{len(req.candidates)} candidates; the limit is {self.settings.max_candidates}",
                    "too_many_candidates",
                )
            if not req.candidates:
                raise ApiError(
                    422, "candidates must not be empty (leave it out for BM25 candidates)", "validation"
                )
            limit = self.settings.max_docid_chars
            long = next((i for i, d in enumerate(req.candidates) if len(d) > limit), None)
            if long is not None:  # before any lookup is sized by it
                raise ApiError(
                    413,
                    f"candidates.{long} has {len(req.candidates[long])} characters; the limit for a docid is "
                    f"{limit} (--max-docid-chars / AHEADRANK_MAX_DOCID_CHARS)",
                    "docid_too_long",
                )
        depth = req.depth or min(self.settings.default_depth, self.settings.max_candidates)
        if depth > self.settings.max_candidates:
            raise ApiError(
                413,
                f"depth {depth} is over the limit of {self.settings.max_candidates}",
                "too_many_candidates",
            )
        arrival = request.state.arrival
        clock = StageClock()
        out = await self.model.run(
            lambda work: self.backend.rerank_steps(
                req.query,
                req.candidates,
                depth,
                req.time_budget_ms,
                arrival,
                clock,
                req.return_text,
                work,
                req.pure,
            ),
            request,
            "/v1/rerank",
        )
        shown = out.ranked[: req.top_n] if req.top_n else out.ranked
        results = [
            RerankResult(
                docid=d,
                rank=i + 1,
                score=s,
                bm25_score=b,
                neural_score=out.parts.get(d, (None, None, None))[0],
                dense_score=out.parts.get(d, (None, None, None))[1],
                window_score=out.parts.get(d, (None, None, None))[2],
                text=out.texts.get(d) if req.return_text else None,
            )
            for i, (d, s, b) in enumerate(shown)
        ]
        total = time.perf_counter() - arrival
        self.metrics.observe_stages("/v1/rerank", clock.seconds)
        self.metrics.candidates.labels("/v1/rerank").observe(out.candidates)
        self.metrics.reranked.observe(out.reranked)
        budget = None
        if req.time_budget_ms is not None:
            budget = BudgetReport(
                time_budget_ms=req.time_budget_ms,
                planned_depth=out.planned_depth or 0,
                per_doc_ms=self.backend.latency.per_doc_s * 1e3,
            )
        body = RerankResponse(
            results=results,
            reranked=out.reranked,
            candidates=out.candidates,
            missing_from_store=out.missing,
            model=self.backend.model_name,
            scoring=out.scoring,
            budget=budget,
            timings=Timings(**clock.ms(), total_ms=round(total * 1e3, 3)),
            request_id=request_id_of(request) or "",
        )
        return JSONResponse(
            body.model_dump(mode="json"), headers={"Server-Timing": server_timing(clock.seconds, total)}
        )


def native_routes(app: FastAPI, h: NativeHandler, texts: TextsHandler, require_key: Callable) -> None:
    """/v1/rerank: the native shape, or Cohere v1 / Jina / Voyage with `documents` (answered by ``texts``)."""

    @app.post(
        "/v1/rerank",
        response_model=None,
        tags=["rerank"],
        dependencies=[Depends(require_key)],
        responses={200: {"model": RerankResponse | CompatRerankResponse}, **ERRORS},
    )
    async def rerank_v1(body: Annotated[V1Body, Body()], request: Request):
        """The native shape (no `documents`): re-rank BM25 top-`depth` (or the given candidate docids) through
        the stored representations. With `documents`: Cohere v1 / Jina / Voyage re-ranking of ad-hoc texts."""
        if isinstance(body, DocumentsRequest):
            return await texts.rank_documents(body, request, "/v1/rerank", "v1")
        return await h.rerank_native(body, request)
