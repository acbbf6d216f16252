"""Training queries without judgments, from the collection itself (issue 14): a document's title is a query
for its body.

SciFact's titles read much like its claims (a short statement of one finding), and every collection with
titles has as many of them as documents, against a few hundred judged training queries. The title is taken
out of *every* document's text for this task — the body alone is what a title query is matched against —
so the model cannot win by spotting the title inside its own document; documents that share a title are
all relevant to it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from aheadrank.indexer.collections import Collection

PSEUDO_KINDS = ("title",)
QID_PREFIX = "title:"


@dataclass
class PseudoQueries:
    """Queries {qid: title}, judgments {qid: {docid: 1}} and the texts they are matched against {docid: body}."""

    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    texts: dict[str, str]


def _normalised(title: str) -> str:
    return " ".join(title.lower().split()).rstrip(".")


def title_queries(
    collection: str | Path, *, min_words: int = 3, max_queries: int | None = None, seed: int = 0
) -> PseudoQueries:
    """One query per distinct title of at least ``min_words`` words whose document has a body (``max_queries``:
    that many, drawn with ``seed``). Texts are every document's body (its title when it has no body)."""
    texts: dict[str, str] = {}
    by_title: dict[str, list[str]] = {}
    first: dict[str, str] = {}
    for docid, title, body in Collection(collection).titled():
        texts[docid] = body or title
        if body and len(title.split()) >= min_words:
            key = _normalised(title)
            by_title.setdefault(key, []).append(docid)
            first.setdefault(key, title)
    keys = sorted(by_title)
    if max_queries is not None and max_queries < len(keys):
        keys = sorted(random.Random(seed).sample(keys, max_queries))
    queries = {QID_PREFIX + by_title[k][0]: first[k] for k in keys}
    qrels = {QID_PREFIX + by_title[k][0]: {d: 1 for d in by_title[k]} for k in keys}
    return PseudoQueries(queries, qrels, texts)
