"""Request and response models of the service (pydantic; they are the OpenAPI schema at ``/docs``)."""

from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must contain at least one non-space character")
    return value


class Timings(BaseModel):
    """Milliseconds per stage; also sent as the ``Server-Timing`` response header."""

    queue_ms: float = 0.0
    bm25_ms: float = 0.0
    query_ms: float = 0.0
    fetch_ms: float = 0.0
    score_ms: float = 0.0
    encode_ms: float = 0.0
    priors_ms: float = 0.0
    total_ms: float = 0.0


# ---- POST /v1/rerank: BM25 (or given) candidates through the stored representations ---------------


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    query: str = Field(min_length=1, description="the query text")
    candidates: list[str] | None = Field(
        None, description="docids to re-rank, in first-stage order; default: BM25 top-`depth`"
    )
    depth: int | None = Field(None, ge=1, description="BM25 candidates to fetch (default: the server's)")
    top_n: int | None = Field(None, ge=1, description="return only the best `top_n` results")
    time_budget_ms: float | None = Field(
        None,
        gt=0,
        allow_inf_nan=False,
        le=3_600_000,
        description="re-rank the head of the candidate list as deep as fits this end-to-end budget; "
        "the tail keeps first-stage order",
    )
    return_text: bool = Field(False, description="include each document's text (from the Lucene raw store)")
    pure: bool = Field(
        False,
        description="rank by the ranker's neural score alone (default: the served score, the neural score "
        "combined with the checkpoint's fitted BM25 and dense priors)",
    )

    _check_query = field_validator("query")(_not_blank)


class RerankResult(BaseModel):
    docid: str
    rank: int
    score: float | None = Field(
        description="re-ranker score; null for the tail a time budget left in BM25 order"
    )
    bm25_score: float | None = Field(
        description="BM25 score (of a given candidate too, where the server has the index and its priors weigh "
        "BM25); null otherwise"
    )
    neural_score: float | None = Field(
        None, description="the ranker's own score (the `score` itself when served pure); null in the tail"
    )
    dense_score: float | None = Field(
        None, description="cosine of the bi-encoder embeddings (the dense prior); null when not used"
    )
    window_score: float | None = Field(
        None,
        description="the best sentence window's cosine with the query (the window prior, a store with "
        "sentence windows); null when not used",
    )
    text: str | None = None


class BudgetReport(BaseModel):
    time_budget_ms: float
    planned_depth: int = Field(description="depth the latency model predicted to fit when scoring began")
    per_doc_ms: float = Field(description="the latency model's cost per candidate (fetch + score)")


class RerankResponse(BaseModel):
    results: list[RerankResult]
    reranked: int = Field(description="how many candidates (from the head) were re-ranked")
    candidates: int = Field(description="how many candidates there were")
    missing_from_store: list[str] = Field(
        default_factory=list, description="BM25 hits absent from the store: kept in BM25 order below the rest"
    )
    model: str
    scoring: str = Field(
        "neural",
        description="what `score` combines: 'neural' (pure) or e.g. 'neural+bm25+dense' (the fitted priors)",
    )
    budget: BudgetReport | None = None
    timings: Timings
    request_id: str


# ---- ad-hoc texts: Cohere v1/v2, Jina, Voyage (/v1/rerank, /v2/rerank), TEI, vLLM, Infinity (/rerank) --------

_SURROGATE = re.compile("[\ud800-\udfff]")


def _readable(document: Any) -> Any:
    """Refuse a document holding what can be neither tokenized nor echoed back as JSON: a lone UTF-16 surrogate
    (in a string or a key, anywhere in an object document) or a NaN or infinite number."""
    stack = [document]
    while stack:  # nesting is bounded before parsing (services/jsonguard.py)
        value = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                raise ValueError(
                    "holds a lone UTF-16 surrogate (e.g. \\ud83d, half of an emoji cut in two), which is not a "
                    "character: send whole characters"
                )
        elif isinstance(value, float):
            if not math.isfinite(value):
                raise ValueError(
                    "holds NaN or an infinite number, which JSON does not have: send null instead"
                )
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return document


Document = Annotated[str | dict[str, Any], AfterValidator(_readable)]


class DocumentsRequest(BaseModel):
    """The union of what the Cohere (v1, v2), Jina, Voyage, TEI, vLLM and Infinity clients send. Fields those
    clients send that do not change the ranking (``model``, ``truncation_direction``, ``priority``...) are
    accepted and ignored; Cohere's ``max_chunks_per_doc`` / ``max_tokens_per_doc`` and TEI's ``truncate`` say
    how a document longer than the ranker's window is read (split into passages by default)."""

    model_config = ConfigDict(extra="ignore")

    query: str = Field(min_length=1)
    documents: list[Document] | None = Field(
        None, description="texts, or objects with a `text` field (other fields, e.g. `id`, are echoed back)"
    )
    texts: list[Document] | None = Field(
        None, description="TEI texts (the response is then TEI's list shape)"
    )
    top_n: int | None = Field(None, ge=1)
    top_k: int | None = Field(None, ge=1, description="Voyage's name for top_n")
    return_documents: bool | None = Field(None, description="echo each document (default: false)")
    return_text: bool = Field(False, description="TEI: echo each text")
    raw_scores: bool = Field(False, description="raw model scores instead of sigmoid(score) in [0, 1]")
    truncate: bool | None = Field(
        None,
        description="TEI: false refuses a text longer than the model reads (413); true cuts it to the first "
        "window; absent: a long text is split into passages and scored by its best one",
    )
    truncation: bool | None = Field(None, description="Voyage: false refuses over-long texts, like TEI's")
    rank_fields: list[str] | None = Field(
        None, max_length=64, description="Cohere v1: the fields of object documents to rank on (at most 64)"
    )
    max_chunks_per_doc: int | None = Field(
        None,
        ge=1,
        description="Cohere v1: at most this many passages of a long document are scored (default and "
        "upper bound: the server's --max-chunks-per-doc); the document's score is its best passage's",
    )
    max_tokens_per_doc: int | None = Field(
        None, ge=1, description="Cohere v2: each document is cut to its first this many word pieces"
    )
    model: str | None = None

    _check_query = field_validator("query")(_not_blank)

    def keep(self) -> int | None:
        return self.top_n or self.top_k

    def refuse_long(self) -> bool:
        return self.truncate is False or self.truncation is False

    def cut_long(self) -> bool:
        """TEI's ``truncate: true`` / Voyage's ``truncation: true``: read the first window only."""
        return self.truncate is True or self.truncation is True

    def docs(self) -> list[Document]:
        if self.documents is not None and self.texts is not None:
            raise ValueError("give either `documents` (Cohere/Jina/Voyage/vLLM) or `texts` (TEI), not both")
        if self.texts is not None:
            return list(self.texts)
        if self.documents is None:
            raise ValueError("`documents` (or TEI's `texts`) is required")
        return list(self.documents)

    def items(self, max_chars: int | None = None) -> list[str]:
        """The text to rank of each document, in order; a message that names the document if one has none.
        With ``max_chars``, a document built from ``rank_fields`` stops (ValueError) as soon as it is longer:
        its size is never more than the limit plus one field, whatever the fields hold."""
        out = []
        fields = list(dict.fromkeys(self.rank_fields or ()))  # a field named twice is ranked on once
        for i, d in enumerate(self.docs()):
            if isinstance(d, str):
                out.append(d)
            elif fields:
                missing = [f for f in fields if f not in d]
                if missing:
                    raise ValueError(f"documents.{i} has no field(s) {missing[:10]} named in rank_fields")
                out.append(_joined(d, fields, i, max_chars))
            elif isinstance(d.get("text"), str):
                out.append(d["text"])
            else:
                raise ValueError(
                    f"documents.{i}: an object document needs a string `text` field (or name its fields in "
                    "rank_fields)"
                )
        return out


def _joined(doc: dict[str, Any], fields: list[str], i: int, max_chars: int | None) -> str:
    parts, size = [], 0
    for f in fields:
        parts.append(f"{f}: {_as_text(doc[f])}")
        size += len(parts[-1]) + 1
        if max_chars is not None and size - 1 > max_chars:
            raise DocumentTooLong(
                f"documents.{i}: its rank_fields make more than {max_chars} characters "
                "(--max-document-chars / AHEADRANK_MAX_DOCUMENT_CHARS)"
            )
    return "\n".join(parts)


class DocumentTooLong(ValueError):
    """A document's text is over ``max_document_chars`` (answered 413)."""


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class DocumentsV1Request(DocumentsRequest):
    """``POST /v1/rerank`` with ``documents``: Cohere v1, Jina, Voyage."""

    documents: list[Document] = Field(description="texts, or objects with a `text` field")


class CompatResult(BaseModel):
    model_config = ConfigDict(extra="allow")

    index: int
    relevance_score: float
    document: dict[str, Any] | str | None = None


class Usage(BaseModel):
    model_config = ConfigDict(extra="allow")

    total_tokens: int


class CompatRerankResponse(BaseModel):
    """Cohere v1/v2 and Jina (``results``), Voyage (``data``, ``object``), vLLM and Infinity (``results``)."""

    model_config = ConfigDict(extra="allow")

    id: str
    model: str
    results: list[CompatResult]
    usage: Usage
    meta: dict = Field(default_factory=dict)


class TeiRank(BaseModel):
    index: int
    score: float
    text: str | None = None


# ---- info, errors -----------------------------------------------------------------------------------


class ErrorResponse(BaseModel):
    error: str = Field(description="what is wrong")
    kind: str = Field(description="machine-readable error kind")
    request_id: str | None = None
    message: str | None = Field(None, description="the same as `error` (the field Cohere's SDKs read)")


class InfoResponse(BaseModel):
    model: dict
    store: dict | None
    index: dict | None
    device: str
    limits: dict
    latency: dict
    priors: dict | None = Field(
        None, description="the fitted priors' weights per feature set (null: the pure neural score is served)"
    )
    relevance_score: str = Field(
        "uncalibrated",
        description="what /rerank's relevance_score is: 'calibrated' (the probability of relevance, the same "
        "for a text in any request), 'relative' (priors without calibration: depends on the request's other "
        "texts) or 'uncalibrated' (the ranker's own score through a sigmoid: not a probability)",
    )
    warnings: list[str] = Field(default_factory=list, description="what the server serves without, and why")
    version: str
