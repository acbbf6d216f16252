"""What a user would pick instead of a trained re-ranker, computed the same way as the rankers' runs:
the BM25 list, the base bi-encoder alone (cosine of the store's dense field), and BM25 + bi-encoder fused
(z-scored linear interpolation with the weight chosen on validation queries, or reciprocal-rank fusion)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aheadrank.errors import StoreError
from aheadrank.evaluation import Run, best_first
from aheadrank.priors import QueryFeatures, fit_weights, rrf, zscore


def dense_features(
    dense_store: str | Path,
    queries: dict[str, str],
    candidates: dict[str, list[tuple[str, float]]],
    qrels: dict[str, dict[str, int]] | None = None,
    device: str = "cpu",
    base: str | Path | None = None,
) -> dict[str, QueryFeatures]:
    """Per query: its BM25 candidates with their BM25 scores and dense cosines (the store's dense field)."""
    from aheadrank.rankers.dense import dense_encoder
    from aheadrank.rerank import dense_cosines
    from aheadrank.store import StoreReader
    from aheadrank.store.manifest import DENSE_DIR

    enc = dense_encoder(base, device=device)
    qids = sorted(q for q in queries if candidates.get(q))
    qvecs = enc.encode_queries([queries[q] for q in qids])
    out = {}
    with StoreReader(dense_store) as reader:
        if reader.spec.fingerprint != enc.fingerprint:
            hint = (  # a ranker's store given for its dense field, which is the store's dense/ folder
                f"; the dense field of that store is {Path(dense_store) / DENSE_DIR}"
                if (Path(dense_store) / DENSE_DIR / "manifest.json").is_file()
                else ""
            )
            raise StoreError(
                f"{dense_store} was written by another dense encoder ({reader.spec.fingerprint[:12]}) than "
                f"this base's ({enc.fingerprint[:12]}){hint}"
            )
        for qid, qvec in zip(qids, qvecs, strict=True):
            docids = [d for d, _ in candidates[qid]]
            out[qid] = QueryFeatures(
                docids,
                {
                    "bm25": np.array([s for _, s in candidates[qid]], dtype=np.float64),
                    "dense": dense_cosines(reader, qvec, docids),
                },
                (qrels or {}).get(qid, {}),
            )
    return out


EQUAL_FUSION = {
    "bm25": 0.5,
    "dense": 0.5,
}  # the label-free fusion: z-scored BM25 and bi-encoder, equal weights


def feature_run(features: dict[str, QueryFeatures], weights: dict[str, float]) -> Run:
    """Σ w_f · zscore(f) per query (one feature with weight 1: that feature's own order)."""
    run = {}
    for qid, q in features.items():
        s = sum(w * zscore(q.features[f]) for f, w in weights.items() if w)
        run[qid] = dict(zip(q.docids, np.asarray(s, dtype=np.float64).tolist(), strict=True))
    return run


def fit_fusion(val: list[QueryFeatures]) -> tuple[dict[str, float], float]:
    """BM25 + dense weights with the best validation nDCG@10."""
    return fit_weights(val, ["bm25", "dense"])


def rrf_run(features: dict[str, QueryFeatures], names: tuple[str, ...] = ("bm25", "dense")) -> Run:
    run = {}
    for qid, q in features.items():
        orders = [[q.docids[i] for i in best_first(q.docids, q.features[f])] for f in names]
        fused = rrf(orders)
        run[qid] = {d: fused[d] for d in q.docids}
    return run


def fusion_teacher(
    dense_store: str | Path,
    index: str | Path,
    data,
    val_qids: list[str],
    depth: int = 100,
    base: str | Path | None = None,
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The BM25 + bi-encoder fusion as a listwise teacher for training: its weight is fitted on the held-out
    ``val_qids`` (never trained on), then it scores every query's BM25 top-``depth``. Returns (teacher
    scores per query, weights)."""
    from aheadrank.runs import bm25_candidates

    cands = bm25_candidates(index, data.queries, depth)
    feats = dense_features(dense_store, data.queries, cands, data.qrels, base=base)
    val = [feats[q] for q in val_qids if q in feats]
    weights, _ = fit_fusion(val) if val else ({"bm25": 0.5, "dense": 0.5}, 0.0)
    return feature_run(feats, weights), weights


# the fusion-passages label-free teacher (aheadrank build --teacher, aheadrank.build.TEACHER_NAMES): the bi-encoder's
# best window of PASSAGE_SENTENCES sentences beside BM25 and the bi-encoder, 1/3 each (the weights and the window
# were fixed before anything was measured: bench/results/label-free/passages/, "fusion-passages")
PASSAGE_SENTENCES = 2
PASSAGE_FUSION = {"bm25": 1 / 3, "dense": 1 / 3, "passage": 1 / 3}


def passage_cosines(
    queries: dict[str, str],
    hits: dict[str, list[tuple[str, float]]],
    titled: dict[str, tuple[str, str]],
    base: str | Path | None = None,
    device: str = "cpu",
    sentences: int = PASSAGE_SENTENCES,
    progress: bool = False,
) -> dict[str, np.ndarray]:
    """Per query, in ``hits`` order: each candidate's best window of ``sentences`` sentences (title in front,
    :func:`aheadrank.indexer.pseudo_queries.sentence_passages`), by its cosine with the query under the base
    bi-encoder. ``titled``: {docid: (title, body)} of every listed document (a missing one is an error). Each
    document's windows are embedded once, however many queries list it."""
    from aheadrank.indexer.pseudo_queries import sentence_passages
    from aheadrank.rankers.dense import dense_encoder

    enc = dense_encoder(base, device=device)
    qids = sorted(q for q in queries if hits.get(q))
    docids = sorted({d for q in qids for d, _ in hits[q]})
    missing = [d for d in docids if d not in titled]
    if missing:
        raise KeyError(f"no text for listed documents {missing[:5]}")
    flat, first = [], {}
    for d in docids:
        windows = sentence_passages(*titled[d], size=sentences)
        first[d] = (len(flat), len(flat) + len(windows))
        flat.extend(windows)
    vecs = encode_in_chunks(enc, flat, progress)
    qvecs = enc.encode_queries([queries[q] for q in qids])
    out = {}
    for q, qv in zip(qids, qvecs, strict=True):
        sims = vecs @ qv
        out[q] = np.array([sims[slice(*first[d])].max() for d, _ in hits[q]], dtype=np.float64)
    return out


def encode_in_chunks(
    enc, texts: list[str], progress: bool, desc: str = "teacher windows", chunk: int = 1024
) -> np.ndarray:
    """``enc.encode_documents(texts)`` [N, n] a chunk at a time, with a progress bar of windows."""
    from aheadrank.logs import progress_bar

    bar = progress_bar(total=len(texts), unit="window", desc=desc, disable=not progress)
    vecs = []
    for k in range(0, len(texts), chunk):
        vecs.append(enc.encode_documents(texts[k : k + chunk]))
        bar.update(len(vecs[-1]))
    bar.close()
    return np.concatenate(vecs) if vecs else np.zeros((0, int(enc.bert["hidden_size"])), np.float32)


def label_free_teacher(
    dense_store: str | Path,
    queries: dict[str, str],
    hits: dict[str, list[tuple[str, float]]],
    aliases: dict[str, str],
    qrels: dict[str, dict[str, int]],
    base: str | Path | None = None,
    device: str = "cpu",
    titled: dict[str, tuple[str, str]] | None = None,
    progress: bool = False,
) -> dict[str, dict[str, float]]:
    """The equal-weight BM25 + bi-encoder fusion (:data:`EQUAL_FUSION`, no judgments) over each pseudo-query's
    BM25 ``hits``, as a listwise teacher: the source document of a query is scored as itself (its full text,
    which the query came from) and renamed to the alias the query is trained against (``qrels``). With
    ``titled`` ({docid: (title, body)}: the ``fusion-passages`` teacher) the bi-encoder's best 2-sentence window
    of each candidate is a third feature (:data:`PASSAGE_FUSION`)."""
    feats = dense_features(dense_store, queries, hits, base=base, device=device)
    weights = EQUAL_FUSION
    if titled is not None:
        best = passage_cosines(queries, hits, titled, base=base, device=device, progress=progress)
        for q, f in feats.items():
            f.features["passage"] = best[q]
        weights = PASSAGE_FUSION
    run = feature_run(feats, weights)
    out = {}
    for q, scores in run.items():
        alias = next(iter(qrels[q]))
        source = aliases[alias]
        out[q] = {alias if d == source else d: s for d, s in scores.items()}
    return out
