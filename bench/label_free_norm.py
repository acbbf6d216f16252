"""How the served score puts its features on one scale: the per-query z-score against the alternatives.

The served score of a label-free build is ``sum_f w_f n(f)`` over the neural score, BM25, the bi-encoder's cosine
(``dense``) and, where the window prior is on, the best window, with ``n`` the per-query z-score over BM25's top
100. Bruch, Gai and Ingber ("An analysis of fusion functions for hybrid retrieval", TOIS 2023) found a convex
combination after a *theoretical* min-max normalisation (TM2C2) the most robust label-free choice for lexical +
dense fusion. The alternatives measured here, each per query over the candidates:

- ``minmax``: ``(x - min) / (max - min)``;
- ``tmm``: ``(x - m_f) / (max - m_f)`` with ``m_f`` the feature's theoretical minimum where it has one (BM25 0, a
  cosine -1) and the observed minimum otherwise (the neural score);
- ``rank``: ``(rank - 1) / (N - 1)`` by ascending score (ties share their mean rank), i.e. Borda.

The rule, fixed in the commit that added this file before any of it was run (the same as
``bench/label_free_prf.py``'s, whose functions it uses):

- grid: the z-score (the served score as built; "none"), ``minmax``, ``tmm``, ``rank``, with the build's weights,
  applied to each ranker's served score (and, for display, to the equal-weight fusion of BM25 and the bi-encoder);
- for a target collection T: the point with the largest mean, over the other collections and the three rankers,
  of served nDCG@10 minus that collection's better of RRF and the equal-weight (z-score) fusion; ties go to the
  z-score;
- the product adopts the all-collections choice only if it is not the z-score and no collection serves worse (mean
  of the three rankers) at its held-out point than with the z-score (a veto that reads every collection's
  judgments).

Nothing is built or trained; the bi-encoder's vectors come from ``bench/label_free_passages.py``'s cache, the
neural scores from committed label-free builds' pure runs.

    .venv/bin/python bench/label_free_norm.py --collections scifact cranfield vaswani \\
        --neural bench/results/label-free:mores-2ib-s2 bench/results/label-free:prettr-l5-e128 \\
                 bench/results/label-free:tk-6l-base --out bench/results/label-free/norm

Writes ``--out``: ``label_free_norm.{json,md}`` and ``<collection>/runs/{VARIANT+priors,fusion-equal}+norm.trec.zst``
(at the point chosen without that collection).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_norm")
NONE = "z"
GRID = (NONE, "minmax", "tmm", "rank")
THEORETICAL_MIN = {"bm25": 0.0, "dense": -1.0, "window": -1.0}


def point_name(p: str) -> str:
    return "none" if p == NONE else p  # none: the z-score, as built


def parse_args(argv=None):
    from label_free_prf import parse_args as probe_args

    return probe_args(argv, __doc__, "norm")


def normalise(kind: str, feature: str, x: np.ndarray) -> np.ndarray:
    """One feature's scores over one query's candidates on the scale ``kind``; a constant list becomes zeros."""
    from scipy.stats import rankdata

    from aheadrank.priors import zscore

    x = np.asarray(x, dtype=np.float64)
    if kind == "z":
        return zscore(x)
    if kind == "rank":
        return (rankdata(x) - 1) / (len(x) - 1) if len(x) > 1 and np.ptp(x) > 0 else np.zeros_like(x)
    if kind not in ("minmax", "tmm"):
        raise ValueError(f"unknown normalisation {kind!r}")
    low = min(THEORETICAL_MIN.get(feature, x.min()), x.min()) if kind == "tmm" else x.min()
    span = x.max() - low
    return (x - low) / span if span > 0 else np.zeros_like(x)


def normalised_run(
    per_q: list[tuple[str, list[str], dict[str, np.ndarray]]], weights: dict, kind: str
) -> dict:
    """{qid: {docid: score}} of ``sum_f w_f n(f)`` over ``per_q`` (qid, docids, {feature: scores})."""
    run = {}
    for q, docids, feats in per_q:
        s = sum(w * normalise(kind, f, feats[f]) for f, w in weights.items() if w)
        run[q] = dict(zip(docids, np.asarray(s, dtype=np.float64).tolist(), strict=True))
    return run


def main(argv=None) -> int:
    from label_free_prf import Grid, feature_runs, loo_probe

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    grid = Grid(GRID, NONE, point_name, "change of scale", "norm")
    fields = {"theoretical_min": THEORETICAL_MIN}
    return loo_probe(
        args,
        argv,
        grid,
        lambda name: feature_runs(args, name, GRID, normalised_run),
        "label_free_norm",
        fields,
    )


if __name__ == "__main__":
    raise SystemExit(main())
