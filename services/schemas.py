"""Request and response models of the service (pydantic; they are the OpenAPI schema at ``/docs``)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


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
        le=3_600_000,
        description="re-rank the head of the candidate list as deep as fits this end-to-end budget; "
        "the tail keeps first-stage order",
    )
    return_text: bool = Field(False, description="include each document's text (from the Lucene raw store)")

    _check_query = field_validator("query")(_not_blank)


class RerankResult(BaseModel):
    docid: str
    rank: int
    score: float | None = Field(
        description="re-ranker score; null for the tail a time budget left in BM25 order"
    )
    bm25_score: float | None = Field(description="BM25 score; null for candidates given by the client")
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
    budget: BudgetReport | None = None
    timings: Timings
    request_id: str


# ---- POST /rerank: the Cohere / Jina / TEI shape, ad-hoc texts ---------------------------------------


class DocumentObject(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: str


class CompatRerankRequest(BaseModel):
    """Cohere / Jina: ``{query, documents, top_n, return_documents}``; TEI: ``{query, texts, return_text,
    raw_scores}``. Unknown fields that those clients send (``model``, ``max_chunks_per_doc``,
    ``truncate``...) are accepted and ignored."""

    model_config = ConfigDict(extra="ignore")

    query: str = Field(min_length=1)
    documents: list[str | DocumentObject] | None = Field(None, description="Cohere / Jina documents")
    texts: list[str] | None = Field(None, description="TEI texts (the response is then TEI's list shape)")
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = False
    return_text: bool = False
    raw_scores: bool = Field(False, description="raw model scores instead of sigmoid(score) in [0, 1]")
    model: str | None = None

    _check_query = field_validator("query")(_not_blank)

    def items(self) -> list[str]:
        if self.documents is not None and self.texts is not None:
            raise ValueError("give either `documents` (Cohere/Jina) or `texts` (TEI), not both")
        if self.texts is not None:
            return list(self.texts)
        if self.documents is None:
            raise ValueError("`documents` (or TEI's `texts`) is required")
        return [d if isinstance(d, str) else d.text for d in self.documents]


class CompatDocument(BaseModel):
    text: str


class CompatResult(BaseModel):
    index: int
    relevance_score: float
    document: CompatDocument | None = None


class Usage(BaseModel):
    total_tokens: int


class CompatRerankResponse(BaseModel):
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


class InfoResponse(BaseModel):
    model: dict
    store: dict | None
    index: dict | None
    device: str
    limits: dict
    latency: dict
    version: str
