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
import re
from dataclasses import dataclass
from pathlib import Path

from aheadrank.indexer.collections import Collection, join_title_text

from aheadrank.textio import EDGE_PUNCTUATION

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


# ---- label-free training: pseudo-queries for any collection (titles, sentences, spans, keywords) ----------------
# Each pseudo-query is matched against a copy of its source document with the query's own words taken out
# (inverse cloze): the copy is a document of its own, ``ALIAS_PREFIX + qid``, that replaces the source in the
# query's candidates, so the model cannot win by spotting the query inside its document, while every other
# document keeps its full text as indexed.
ALIAS_PREFIX = "pq:"
LABEL_FREE_KINDS = ("title", "sentence", "span", "keywords")
SENTENCE_WORDS = (6, 40)  # a sentence is a query when it has this many words (inclusive)
# how often a query is cut out of the copy of its document (inverse cloze). Cut every time (1.0), the positive is
# the one candidate that lacks the query's words while BM25's negatives have them: on SciFact, Cranfield and Vaswani
# the trained rankers learnt that shortcut (the pseudo-queries' validation rose, the real queries' nDCG@10 fell:
# MORES 2xIB 0.44, TK 0.04 on SciFact; bench/results/label-free/cut-always/)
CUT = 0.0
SPAN_WORDS = (6, 12)  # a span query: this many consecutive words, for texts without usable sentences
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# short-text collections (product names, FAQ questions, paper titles alone): where fewer than half of the documents
# have SHORT_BELOW words or more (the least a span query needs), each document too short for a title, sentence or
# span query gives a keyword query instead: KEYWORD_WORDS of its content words, in their order (a searcher's words
# for an item, not a phrase cut from it). Collections of longer texts are left as they were (the same queries).
SHORT_BELOW = SPAN_WORDS[0] + 10
SHORT_SHARE = 0.5
KEYWORD_WORDS = (2, 5)
KEYWORD_MIN_WORDS = 3  # content words a document needs for a keyword query (one at least is left out of it)
_STOP = frozenset(
    "a an and are as at be but by for from has have in into is it its of on or that the their this to was were"
    " which with without".split()
)


@dataclass
class LabelFreeQueries:
    """Pseudo-queries {qid: text}, their one relevant document each {qid: {alias: 1}}, the texts
    {docid or alias: text} they are matched against, the alias -> source docid map and each query's kind."""

    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]
    texts: dict[str, str]
    aliases: dict[str, str]
    kinds: dict[str, str]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for k in self.kinds.values():
            out[k] = out.get(k, 0) + 1
        return out


def sentences(body: str) -> list[str]:
    """The sentences of a text: split after ``. ! ?`` followed by white space (empty pieces dropped)."""
    return [s.strip() for s in _SENTENCE_END.split(body) if s.strip()]


def sentence_passages(title: str, body: str, size: int = 2) -> list[str]:
    """A document as overlapping windows of ``size`` consecutive sentences (stride one sentence), each joined
    with the title (:func:`~aheadrank.indexer.collections.join_title_text`); a body of at most ``size``
    sentences is one passage, the document's whole text. What ``bench/label_free_passages.py`` scores with the
    bi-encoder (the best window's cosine: a label-free feature for documents longer than a claim)."""
    if size < 1:
        raise ValueError(f"a passage needs at least 1 sentence, got {size}")
    parts = sentences(body)
    if len(parts) <= size:
        return [join_title_text(title, body)]
    return [join_title_text(title, " ".join(parts[i : i + size])) for i in range(len(parts) - size + 1)]


def stored_windows(title: str, body: str, size: int = 2) -> list[str]:
    """The windows a document has in a store's ``windows/`` (store/windows.py): its :func:`sentence_passages`
    where it is two or more, else none (its one window is the whole document: the dense field's row)."""
    windows = sentence_passages(title, body, size)
    return windows if len(windows) > 1 else []


def _cut(text: str, piece: str) -> str:
    """``text`` without any occurrence of ``piece`` (whitespace tidied)."""
    return " ".join(text.replace(piece, " ").split())


def _one_query(
    docid: str, title: str, body: str, rng: random.Random, title_ok: bool
) -> tuple[str, str, str] | None:
    """(kind, query, the text it is matched against) for one document, or None when it has too little text.
    A title of 3+ words is used for half of the titled documents; else a sentence of the body (6-40 words)
    when the body has two or more; else a span of 6-12 consecutive words (texts without punctuation)."""
    full = " ".join(x for x in (title, body) if x)
    if title_ok and body and len(title.split()) >= 3 and rng.random() < 0.5:
        rest = _cut(body, title.strip())
        if len(rest.split()) >= 10:
            return "title", title.strip(), rest
    parts = sentences(body)
    usable = [s for s in parts if SENTENCE_WORDS[0] <= len(s.split()) <= SENTENCE_WORDS[1]]
    if len(parts) >= 2 and usable:
        s = rng.choice(usable)
        rest = _cut(full, s)
        if len(rest.split()) >= 10:
            return "sentence", s, rest
    words = full.split()
    n = rng.randint(*SPAN_WORDS)
    if len(words) < n + 10:
        return None
    start = rng.randrange(0, len(words) - n + 1)
    return "span", " ".join(words[start : start + n]), " ".join(words[:start] + words[start + n :])


def _keyword_query(text: str, rng: random.Random) -> str | None:
    """A keyword query for a short text: 2-5 of its content words (not stopwords, 2+ characters, edge punctuation
    dropped) in their order, never all of them; None for a text of fewer than KEYWORD_MIN_WORDS content words."""
    words = [w.strip(EDGE_PUNCTUATION) for w in text.split()]
    content = [w for w in words if len(w) >= 2 and w.lower() not in _STOP]
    if len(content) < KEYWORD_MIN_WORDS:
        return None
    k = rng.randint(KEYWORD_WORDS[0], min(KEYWORD_WORDS[1], len(content) - 1))
    return " ".join(content[i] for i in sorted(rng.sample(range(len(content)), k)))


def short_text(texts) -> bool:
    """Whether a collection (its documents' full texts) is one of short texts: fewer than SHORT_SHARE of them have
    SHORT_BELOW words or more."""
    texts = list(texts)
    return sum(len(t.split()) >= SHORT_BELOW for t in texts) < SHORT_SHARE * len(texts)


def label_free_queries(
    collection: str | Path, *, max_queries: int = 3000, seed: int = 0, cut: float | None = None
) -> LabelFreeQueries:
    """Up to ``max_queries`` pseudo-queries, one per document drawn with ``seed``: its title (half of the
    titled documents, where titles are not just the first words of the text), else a sentence, else a span
    (inverse cloze: the query's words are cut from the copy of the document it is matched against); in a
    collection of short texts (:func:`short_text`), else a keyword query."""
    docs = list(Collection(collection).titled())
    texts = {docid: " ".join(x for x in (title, body) if x) for docid, title, body in docs}
    short = short_text(texts.values())
    rng = random.Random(seed)
    order = list(range(len(docs)))
    rng.shuffle(order)
    queries: dict[str, str] = {}
    qrels: dict[str, dict[str, int]] = {}
    aliases: dict[str, str] = {}
    kinds: dict[str, str] = {}
    seen: set[str] = set()
    for i in order:
        if len(queries) >= max_queries:
            break
        docid, title, body = docs[i]
        made = _one_query(docid, title, body, rng, title_ok=True)
        if made is None and short:
            keywords = _keyword_query(texts[docid], rng)
            made = None if keywords is None else ("keywords", keywords, texts[docid])
        if made is None:
            continue
        kind, query, rest = made
        key = _normalised(query)
        if key in seen:  # the same query twice (shared titles, boilerplate sentences): once
            continue
        seen.add(key)
        qid = f"{kind}:{docid}"
        alias = ALIAS_PREFIX + qid
        queries[qid], qrels[qid], kinds[qid] = query, {alias: 1}, kind
        # cut: the query's words taken out of the copy it is matched against (inverse cloze), else the copy is the
        # whole document as indexed
        texts[alias] = rest if rng.random() < (CUT if cut is None else cut) else texts[docid]
        aliases[alias] = docid
    return LabelFreeQueries(queries, qrels, texts, aliases, kinds)
