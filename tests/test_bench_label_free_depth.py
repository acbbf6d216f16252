"""bench/label_free_depth.py: the served score reranks BM25's top k only, the rest follows in BM25's order."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_depth as dp  # noqa: E402


def _query(n: int, seed: int):
    rng = np.random.default_rng(seed)
    bm25 = np.sort(rng.gamma(2.0, size=n) * 5)[::-1]
    return [f"d{i}" for i in range(n)], {
        "bm25": bm25,
        "dense": rng.uniform(-0.2, 0.8, n),
        "neural": rng.normal(size=n),
    }


def test_at_full_depth_it_is_the_served_score_as_built():
    from label_free import runs_from

    from aheadrank.priors import QueryFeatures

    per_q = [(q, *_query(100, i)) for i, q in enumerate(("q1", "q2"))]
    w = {"neural": 0.25, "bm25": 0.5, "dense": 0.25}
    as_built = runs_from([(q, QueryFeatures(d, f, {})) for q, d, f in per_q], w)
    got = dp.reranked_run(per_q, w, dp.NONE)
    assert got.keys() == as_built.keys() == {"q1", "q2"}
    for q in got:
        assert got[q] == pytest.approx(as_built[q])


def test_a_shallow_depth_reranks_only_bm25_s_top_k_with_z_scores_over_them():
    from aheadrank.priors import zscore

    docids, f = _query(12, 3)
    w = {"neural": 1.0, "bm25": 0.0, "dense": 1.0}
    run = dp.reranked_run([("q", docids, f)], w, 5)["q"]
    want = zscore(f["neural"][:5]) + zscore(f["dense"][:5])
    assert [run[d] for d in docids[:5]] == pytest.approx(want.tolist())
    below = [run[d] for d in docids[5:]]
    assert max(below) < min(want)  # everything below the top 5 ranks under it ...
    assert below == sorted(below, reverse=True)  # ... in BM25's order
    shuffled = {k: v[::-1] for k, v in f.items()}
    with pytest.raises(ValueError, match="not in BM25's order"):
        dp.reranked_run([("q", docids, shuffled)], w, 5)
    assert [dp.point_name(k) for k in dp.GRID] == ["none", "top50", "top30", "top20"]
