"""Long documents as passages: a text longer than the ranker's window is split into windows of word pieces
that overlap, each passage is scored like a document, and the document's score comes from its passages'
(:func:`aggregate`: MaxP, Dai & Callan 2019, "Deeper Text Understanding for IR with Contextual Neural Language
Modeling"; MeanP; or the mean of the first and the best passage, the service's default: measured best on SciFact
at a 64-piece window, bench/results/long_inputs-passages.md).

A passage is a slice of the original text, cut at word boundaries (the tokenizer's offsets), so tokenizing
it again gives the same word pieces: its score is the one it would get as a document of its own. The service
(``/rerank``: Cohere's ``max_chunks_per_doc`` and ``max_tokens_per_doc``, TEI's ``truncate``) and
``bench/long_inputs.py`` split with :func:`split_passages`; the measured choice is in services/README.md.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_MAX_PASSAGES = 10  # per document, as Cohere's max_chunks_per_doc defaults to


@dataclass(frozen=True)
class PassageOptions:
    """How a document is split: ``window`` word pieces per passage (the ranker's ``max_doc_len``),
    ``overlap`` pieces shared by consecutive passages (default: a quarter of the window), at most
    ``max_passages`` passages (the document's head), after cutting it to its first ``max_pieces`` pieces."""

    window: int
    overlap: int | None = None
    max_passages: int | None = DEFAULT_MAX_PASSAGES
    max_pieces: int | None = None

    def __post_init__(self):
        if self.window < 1:
            raise ValueError(f"passage window must be at least 1 word piece, got {self.window}")
        if self.overlap is not None and not 0 <= self.overlap < self.window:
            raise ValueError(f"passage overlap must be in 0..{self.window - 1}, got {self.overlap}")
        if self.max_passages is not None and self.max_passages < 1:
            raise ValueError(f"max_passages must be at least 1, got {self.max_passages}")
        if self.max_pieces is not None and self.max_pieces < 1:
            raise ValueError(f"max_pieces must be at least 1, got {self.max_pieces}")

    def head(self) -> PassageOptions | None:
        """The options that cut a text to its first ``max_pieces`` word pieces (at a word boundary) as these do
        before splitting, and do not split it: what a long text's dense prior reads; None without a cut."""
        if self.max_pieces is None:
            return None
        return PassageOptions(self.max_pieces, 0, 1, self.max_pieces)

    @property
    def stride(self) -> int:
        overlap = self.window // 4 if self.overlap is None else self.overlap
        return self.window - overlap


def effective_overlap(window: int, overlap: int | None) -> int:
    """The overlap the service and ``aheadrank index --passages`` split with: a quarter of the window by
    default, an asked-for one capped at half the window."""
    return window // 4 if overlap is None else min(overlap, window // 2)


def _word_start(word_ids: list[int | None], i: int, floor: int) -> int:
    """The first piece of the word that piece ``i`` belongs to (not before ``floor``)."""
    while i > floor and word_ids[i] is not None and word_ids[i - 1] == word_ids[i]:
        i -= 1
    return i


def split_passages(tokenizer, texts: Sequence[str], opts: PassageOptions) -> list[list[str]]:
    """Each text's passages, in order: the text itself when it fits the window (and ``max_pieces``);
    otherwise slices of at most ``window`` pieces starting every ``stride`` pieces, cut back to word
    boundaries (a single word longer than the window is cut inside it)."""
    if isinstance(texts, str):
        raise TypeError("expected a list of texts, got one string")
    enc = tokenizer(
        list(texts),
        add_special_tokens=False,
        return_offsets_mapping=True,
        return_attention_mask=False,
        return_token_type_ids=False,
        verbose=False,  # no "longer than the maximum sequence length" warning: that is why we split
    )
    out = []
    for k, text in enumerate(texts):
        offsets = enc["offset_mapping"][k]
        words = enc.word_ids(k)
        n = len(offsets)
        if opts.max_pieces is not None and n > opts.max_pieces:
            n = _word_start(words, opts.max_pieces, 0) or opts.max_pieces
        if n <= opts.window:
            out.append([text if n == len(offsets) else text[: offsets[n - 1][1]]])
            continue
        passages, start = [], 0
        while True:
            end = min(start + opts.window, n)
            if end < n:  # do not end inside a word: the next word starts the next passage
                end = _word_start(words, end, start + 1)
            passages.append(text[offsets[start][0] : offsets[end - 1][1]])
            if end >= n or (opts.max_passages is not None and len(passages) >= opts.max_passages):
                break
            nxt = _word_start(words, start + opts.stride, start + 1)
            start = nxt if nxt > start else start + opts.stride
        out.append(passages)
    return out


def flatten(passages: list[list[str]]) -> tuple[list[str], list[int]]:
    """All passages in one list, and the index of the document each came from."""
    flat, owner = [], []
    for i, ps in enumerate(passages):
        flat.extend(ps)
        owner.extend([i] * len(ps))
    return flat, owner


def max_per_document(scores: Sequence[float], owner: Sequence[int], n: int) -> list[float]:
    """MaxP: each document's best passage score."""
    return aggregate(scores, owner, n, "maxp")


AGGREGATIONS = ("maxp", "meanp", "first+max")  # measured in bench/results/long_inputs-passages.md
# A checkpoint's priors are fitted on scores aggregated one way, recorded in their ``fitted_on["passage_aggregation"]``;
# the service, rerank-run and fit-priors read that record unless told otherwise (:func:`served_aggregation`).
# A judged build: the mean of the first and the best passage (chosen on SciFact's test split with a judged TK,
# bench/results/long_inputs-passages.md); priors fitted before the record existed were fitted this way too
DEFAULT_AGGREGATION = "first+max"
# A label-free build: the best passage (MaxP, Cohere's rule for a long document). Served, it ranks level with
# first+max (bench/results/label-free/maxp-scifact/, passages-served-maxp/), and a text whose first passage is off its
# topic (a RAG chunk that starts in another section) keeps its score: bench/results/rag-long-texts/
LABEL_FREE_AGGREGATION = "maxp"


def served_aggregation(given: str | None, priors=None) -> str:
    """How a long document's score comes from its passages': ``given`` (a flag), else what the checkpoint's
    priors (``aheadrank.priors.Priors``) were fitted with, else :data:`DEFAULT_AGGREGATION`."""
    if given is None and priors is not None:
        given = priors.fitted_on.get("passage_aggregation")
    how = given or DEFAULT_AGGREGATION
    if how not in AGGREGATIONS:
        raise ValueError(f"unknown passage aggregation {how!r}; known: {', '.join(AGGREGATIONS)}")
    return how


def aggregate(scores: Sequence[float], owner: Sequence[int], n: int, how: str = "maxp") -> list[float]:
    """Each document's score from its passages' (``owner``: the document of each passage, passages in
    document order): ``maxp`` the best, ``meanp`` the mean, ``first+max`` the mean of the first and the best."""
    if how not in AGGREGATIONS:
        raise ValueError(f"unknown passage aggregation {how!r}; known: {AGGREGATIONS}")
    per: list[list[float]] = [[] for _ in range(n)]
    for s, i in zip(scores, owner, strict=True):
        per[i].append(float(s))
    if how == "maxp":
        return [max(p) for p in per]
    if how == "meanp":
        return [sum(p) / len(p) for p in per]
    return [(p[0] + max(p)) / 2 for p in per]
