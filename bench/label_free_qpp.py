"""A new label-free signal for the served score: per-query weights from a query-performance predictor.

The served score of a label-free build is a fixed mix of per-query z-scores, ``sum_f w_f z_f(q)`` over the
neural score, BM25, the bi-encoder's cosine (``dense``) and, where the window prior is on, the best window. The
same weights hold for every query, but a feature is not equally good on every query. Query-performance
prediction (Shtok et al. 2012's NQC; Cronen-Townsend et al.'s clarity; for fusion, e.g. Markovits et al. 2012) says
how much to trust one ranking for one query without any judgment. Here each feature ``f`` of query ``q`` gets
``w_f(q) = w_f * r_f(q) ** gamma`` with ``r_f(q) = p_f(q) / mean over the collection's test queries of p_f`` (the
mean reads only the queries' scores, no judgment; a build would take it from its priors stage's calibration
pseudo-queries) and one of two predictors over the query's candidates:

- ``head``: the mean of the 10 largest ``z_f`` (with mean 0 and unit variance over the candidates, how far the
  feature's top 10 stand out from the rest: NQC's spread, measured on the scale the fusion uses);
- ``agree``: the Pearson correlation of ``z_f`` with the weighted sum of the other features' ``z`` (how much the
  feature agrees with the rest of the served score), floored at ``FLOOR``.

The rule, fixed in the commit that added this file before any of it was run (the same as
``bench/label_free_prf.py``'s, whose functions it uses):

- grid: no per-query weights, and ``(predictor, gamma)`` in {head, agree} x {0.5, 1, 2}, applied to each
  ranker's served score as built (and, for display, to the equal-weight fusion of BM25 and the bi-encoder);
- for a target collection T: the point with the largest mean, over the other collections and the three rankers,
  of served nDCG@10 minus that collection's better of RRF and the equal-weight fusion; ties go to none;
- the product adopts the all-collections choice only if it is not "none" and no collection serves worse (mean of
  the three rankers) at its held-out point than without it (a veto that reads every collection's judgments).

Nothing is built or trained; the bi-encoder's vectors come from ``bench/label_free_passages.py``'s cache, the
neural scores from committed label-free builds' pure runs.

    .venv/bin/python bench/label_free_qpp.py --collections scifact cranfield vaswani \\
        --neural bench/results/label-free:mores-2ib-s2 bench/results/label-free:prettr-l5-e128 \\
                 bench/results/label-free:tk-6l-base --out bench/results/label-free/qpp

Writes ``--out``: ``label_free_qpp.{json,md}`` and ``<collection>/runs/{VARIANT+priors,fusion-equal}+qpp.trec.zst``
(at the point chosen without that collection).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_qpp")
NONE = ("none", 0.0)
GRID = (NONE, *((p, g) for p in ("head", "agree") for g in (0.5, 1.0, 2.0)))
HEAD = 10
FLOOR = 0.01


def point_name(p: tuple[str, float]) -> str:
    return "none" if p == NONE else f"{p[0]}-g{p[1]:g}"


def parse_args(argv=None):
    from label_free_prf import parse_args as probe_args

    return probe_args(argv, __doc__, "qpp")


def predictor(kind: str, z: dict[str, np.ndarray], weights: dict[str, float]) -> dict[str, float]:
    """``p_f`` of one query for each feature of ``z`` (its per-query z-scores over the candidates)."""
    if kind == "head":
        return {f: max(float(np.sort(v)[-HEAD:].mean()), FLOOR) for f, v in z.items()}
    if kind != "agree":
        raise ValueError(f"unknown predictor {kind!r}")
    out = {}
    for f, v in z.items():
        rest = sum(weights[g] * z[g] for g in z if g != f)
        ok = np.std(v) > 0 and np.std(rest) > 0
        out[f] = max(float(np.corrcoef(v, rest)[0, 1]) if ok else 0.0, FLOOR)
    return out


def adaptive_run(per_q: list[tuple[str, list[str], dict[str, np.ndarray]]], weights: dict, point) -> dict:
    """{qid: {docid: score}} of ``sum_f w_f(q) z_f(q)`` over ``per_q`` (qid, docids, {feature: scores}); at
    ``NONE`` the served score as built."""
    from aheadrank.priors import zscore

    used = [f for f, w in weights.items() if w]
    zs = [{f: zscore(feats[f]) for f in used} for _, _, feats in per_q]
    if point == NONE:
        ratios = [dict.fromkeys(used, 1.0) for _ in zs]
        gamma = 0.0
    else:
        kind, gamma = point
        preds = [predictor(kind, z, weights) for z in zs]
        mean = {f: float(np.mean([p[f] for p in preds])) for f in used}
        ratios = [{f: p[f] / mean[f] for f in used} for p in preds]
    run = {}
    for (q, docids, _), z, r in zip(per_q, zs, ratios, strict=True):
        s = sum(weights[f] * r[f] ** gamma * z[f] for f in used)
        run[q] = dict(zip(docids, np.asarray(s, dtype=np.float64).tolist(), strict=True))
    return run


def main(argv=None) -> int:
    from label_free_prf import Grid, feature_runs, loo_probe

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    grid = Grid(GRID, NONE, point_name, "per-query weights", "qpp")
    fields = {"predictors": {"head": f"mean of the top {HEAD} z-scores", "agree": "corr with the rest"}}
    return loo_probe(
        args,
        argv,
        grid,
        lambda name: feature_runs(args, name, GRID, adaptive_run),
        "label_free_qpp",
        fields | {"floor": FLOOR},
    )


if __name__ == "__main__":
    raise SystemExit(main())
