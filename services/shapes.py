"""The paths the service answers and the request shapes each takes: what a body of the wrong shape is told,
and how /v1/rerank tells its two shapes apart (services/README.md, "Dispatch rule")."""

from __future__ import annotations

from typing import Annotated, Any

from aheadrank.services.schemas import DocumentsV1Request, RerankRequest
from pydantic import Discriminator, Tag

ENDPOINTS = (
    "/v1/rerank",
    "/v2/rerank",
    "/rerank",
    "/infinity/rerank",
    "/v1/info",
    "/health",
    "/ready",
    "/metrics",
)
NATIVE = "{query, candidates?, depth?, top_n?, time_budget_ms?, return_text?}"
# what a body of the wrong shape is told: which shape each path takes, and where the others go
SHAPES = {
    "/v1/rerank": f"POST /v1/rerank takes the native shape {NATIVE} (BM25 or stored docids) or, with `documents`, "
    "the Cohere v1 / Jina / Voyage shape {query, documents, top_n?, return_documents?}; "
    "TEI's {query, texts} goes to POST /rerank, Cohere v2 to POST /v2/rerank",
    "/v2/rerank": "POST /v2/rerank takes Cohere v2's shape {query, documents, top_n?}; "
    f"BM25 / docid re-ranking is POST /v1/rerank {NATIVE}",
    "/rerank": "POST /rerank takes TEI's {query, texts} or vLLM's / Cohere's {query, documents}; "
    f"BM25 / docid re-ranking is POST /v1/rerank {NATIVE}",
    "/infinity/rerank": "POST /infinity/rerank takes Infinity's shape {query, documents, top_n?, return_documents?}; "
    f"BM25 / docid re-ranking is POST /v1/rerank {NATIVE}",
}


SHAPE_TAGS = ("native shape", "documents shape")


def _v1_shape(body: Any) -> str:
    """/v1/rerank serves two shapes: a body with `documents` is Cohere v1 / Jina / Voyage, any other native."""
    return SHAPE_TAGS[1] if isinstance(body, dict) and "documents" in body else SHAPE_TAGS[0]


V1Body = Annotated[
    Annotated[RerankRequest, Tag(SHAPE_TAGS[0])] | Annotated[DocumentsV1Request, Tag(SHAPE_TAGS[1])],
    Discriminator(_v1_shape),
]
