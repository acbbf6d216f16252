"""How deep the served score should rerank: BM25's top 100 (as built) against its top 50, 30 and 20.

A label-free build serves its fused score over BM25's top 100. Reranking fewer candidates costs proportionally
less (the neural score dominates a query's time) and keeps more of BM25's precision where the other features are
noisy; reranking more lets the bi-encoder lift documents BM25 ranked low. Here the served score (and, for display,
the equal-weight fusion) is computed over BM25's top k only (its z-scores over those k); the candidates below k
follow in BM25's order, so nDCG@10 reads only the reranked top k.

The rule, fixed in the commit that added this file before any of it was run (the same as
``bench/label_free_prf.py``'s, whose functions it uses):

- grid: k = 100 (as built; "none"), 50, 30, 20, with the build's weights, for each ranker's served score;
- for a target collection T: the depth with the largest mean, over the other collections and the three rankers,
  of served nDCG@10 minus that collection's better of RRF and the equal-weight fusion (both over the top 100); ties
  go to 100;
- the service's default changes only if the all-collections choice is not 100 and no collection serves worse
  (mean of the three rankers) at its held-out depth than at 100 (a veto that reads every collection's judgments).

Nothing is built or trained; the bi-encoder's vectors come from ``bench/label_free_passages.py``'s cache, the
neural scores from committed label-free builds' pure runs.

    .venv/bin/python bench/label_free_depth.py --collections scifact cranfield vaswani \\
        --neural bench/results/label-free:mores-2ib-s2 bench/results/label-free:prettr-l5-e128 \\
                 bench/results/label-free:tk-6l-base --out bench/results/label-free/depth

Writes ``--out``: ``label_free_depth.{json,md}`` and ``<collection>/runs/{VARIANT+priors,fusion-equal}+depth
.trec.zst`` (at the depth chosen without that collection).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_depth")
NONE = 100
GRID = (NONE, 50, 30, 20)


def point_name(k: int) -> str:
    return "none" if k == NONE else f"top{k}"  # none: BM25's top 100, as built


def parse_args(argv=None):
    from label_free_prf import parse_args as probe_args

    return probe_args(argv, __doc__, "depth")


def reranked_run(
    per_q: list[tuple[str, list[str], dict[str, np.ndarray]]], weights: dict, depth: int
) -> dict:
    """{qid: {docid: score}}: ``sum_f w_f z(f)`` over BM25's first ``depth`` candidates (``per_q``'s docids in
    BM25's order), then the rest in BM25's order below them."""
    from aheadrank.priors import zscore

    run = {}
    for q, docids, feats in per_q:
        bm25 = np.asarray(feats["bm25"], dtype=np.float64)
        if np.any(np.diff(bm25) > 0):
            raise ValueError(f"query {q!r}: candidates not in BM25's order")
        k = min(depth, len(docids))
        top = sum(w * zscore(np.asarray(feats[f], dtype=np.float64)[:k]) for f, w in weights.items() if w)
        top = np.asarray(top, dtype=np.float64)
        below = (top.min() if k else 0.0) - 1.0 - np.arange(len(docids) - k, dtype=np.float64)
        run[q] = dict(zip(docids, np.concatenate([top, below]).tolist(), strict=True))
    return run


def main(argv=None) -> int:
    from label_free_prf import Grid, feature_runs, loo_probe

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    grid = Grid(GRID, NONE, point_name, "shallower reranking", "depth")
    return loo_probe(
        args,
        argv,
        grid,
        lambda name: feature_runs(args, name, GRID, reranked_run),
        "label_free_depth",
        {"depths": list(GRID)},
    )


if __name__ == "__main__":
    raise SystemExit(main())
