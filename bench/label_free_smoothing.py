"""A new label-free signal for the served score: score regularisation over the candidates' neighbourhood.

Every feature of the served score rates a candidate alone. The cluster hypothesis (Diaz 2005, "Regularizing ad
hoc retrieval scores") adds what the candidates say about each other: a document whose nearest neighbours among
the query's candidates score high is more likely relevant than its own score says. Here the neighbourhood is the
bi-encoder's (the dense field's vectors the service already fetches): ``W`` keeps each candidate's k nearest other
candidates by cosine (positive cosines only), rows normalised to sum 1, and a run's final score ``f`` becomes
``(1 - alpha) z(f) + alpha W z(f)`` (``z``: the per-query z-score the served score is built from). At serve time
that is a 100 x 100 product over vectors already in memory.

The rule, fixed in the commit that added this file before any of it was run (the same as
``bench/label_free_prf.py``'s, whose functions it uses):

- grid: no smoothing, and ``(k, alpha)`` in {5, 10} x {0.1, 0.2, 0.3}, applied to each ranker's served score
  as built (and, for display, to the bi-encoder and the equal-weight fusion);
- for a target collection T: the point with the largest mean, over the other collections and the three rankers,
  of served nDCG@10 minus that collection's better of RRF and the equal-weight fusion; ties go to no smoothing;
- the product adopts the all-collections choice only if it is not "none" and no collection serves worse (mean of
  the three rankers) at its held-out point than without smoothing (a veto that reads every collection's
  judgments).

Nothing is built or trained; the vectors come from ``bench/label_free_passages.py``'s cache, the neural scores
from committed label-free builds' pure runs.

    .venv/bin/python bench/label_free_smoothing.py --collections scifact cranfield vaswani \\
        --neural bench/results/label-free:mores-2ib-s2 bench/results/label-free:prettr-l5-e128 \\
                 bench/results/label-free:tk-6l-base --out bench/results/label-free/smoothing

Writes ``--out``: ``label_free_smoothing.{json,md}`` and ``<collection>/runs/{VARIANT+priors,fusion-equal}+smooth
.trec.zst`` (at the point chosen without that collection).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_smoothing")
NONE = (0, 0.0)
GRID = (NONE, *((k, a) for k in (5, 10) for a in (0.1, 0.2, 0.3)))


def point_name(p: tuple[int, float]) -> str:
    return "none" if p == NONE else f"k{p[0]}-a{p[1]:g}"


def parse_args(argv=None) -> argparse.Namespace:
    from label_free_prf import parse_args as probe_args

    return probe_args(argv, __doc__, "smoothing")


def neighbours(vectors: np.ndarray, k: int) -> np.ndarray:
    """``W``: each row's k nearest other rows by cosine (positive cosines only), normalised to sum 1 (a row
    with no positive neighbour stays zero)."""
    v = np.asarray(vectors, dtype=np.float64)
    v = v / np.where((n := np.linalg.norm(v, axis=1, keepdims=True)) > 0, n, 1.0)
    sim = v @ v.T
    np.fill_diagonal(sim, -np.inf)
    w = np.zeros_like(sim)
    top = np.argsort(-sim, axis=1, kind="stable")[:, :k]
    rows = np.arange(len(v))[:, None]
    w[rows, top] = np.maximum(sim[rows, top], 0.0)
    total = w.sum(axis=1, keepdims=True)
    return w / np.where(total > 0, total, 1.0)


def smooth(scores: np.ndarray, w: np.ndarray, alpha: float) -> np.ndarray:
    """``(1 - alpha) z(scores) + alpha W z(scores)``."""
    from aheadrank.priors import zscore

    z = zscore(np.asarray(scores, dtype=np.float64))
    return (1 - alpha) * z + alpha * (w @ z)


def smoothed_runs(features: dict, runs: dict, point: tuple[int, float]) -> dict:
    """Each run of ``runs`` ({name: {qid: {docid: score}}}) smoothed at ``point`` over its query's candidates."""
    if point == NONE:
        return runs
    k, alpha = point
    graphs = {
        q: neighbours(np.stack([features["docs"][d] for d in features["docids"][q]]), k)
        for q in features["qids"]
    }
    out = {}
    for name, run in runs.items():
        out[name] = {}
        for q, scored in run.items():
            docids = features["docids"][q]
            s = smooth(np.array([scored[d] for d in docids]), graphs[q], alpha)
            out[name][q] = dict(zip(docids, s.tolist(), strict=True))
    return out


def main(argv=None) -> int:
    from label_free_prf import NONE as NO_FEEDBACK
    from label_free_prf import Grid, collection_features, collection_runs, loo_probe

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    variants = [v for _, v in args.neural]

    def runs_of(name: str):
        features = collection_features(args, name, grid=(NO_FEEDBACK,))
        plain = collection_runs(features, variants)[NO_FEEDBACK]
        return features, {p: smoothed_runs(features, plain, p) for p in GRID}

    grid = Grid(GRID, NONE, point_name, "smoothing", "smooth")
    return loo_probe(
        args, argv, grid, runs_of, "label_free_smoothing", {"graph": "bi-encoder cosines, top k"}
    )


if __name__ == "__main__":
    raise SystemExit(main())
