"""bench/label_free_norm.py: the served score's features put on one scale per query by the z-score (as built),
min-max, min-max from the feature's theoretical minimum, or rank."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_norm as nm  # noqa: E402


def test_each_scale_maps_one_query_s_scores_as_its_definition_says():
    from aheadrank.priors import zscore

    x = np.array([2.0, 4.0, 3.0, 4.0])
    assert nm.normalise("z", "bm25", x) == pytest.approx(zscore(x))
    assert nm.normalise("minmax", "bm25", x) == pytest.approx([0, 1, 0.5, 1])
    assert nm.normalise("tmm", "bm25", x) == pytest.approx([0.5, 1, 0.75, 1])  # BM25 from 0
    cos = np.array([0.2, 0.6, 0.4])
    assert nm.normalise("tmm", "dense", cos) == pytest.approx((cos + 1) / 1.6)  # a cosine from -1
    assert nm.normalise("tmm", "neural", np.array([-3.0, 1.0])) == pytest.approx([0, 1])  # observed minimum
    assert nm.normalise("rank", "bm25", x) == pytest.approx([0, 2.5 / 3, 1 / 3, 2.5 / 3])  # ties share a rank
    for kind in nm.GRID:
        flat = nm.normalise(kind, "bm25", np.full(5, 7.0))
        assert np.all(flat == flat[0]) and np.all(np.isfinite(flat))  # a constant list orders nothing
    with pytest.raises(ValueError, match="unknown normalisation"):
        nm.normalise("softmax", "bm25", x)


def test_the_z_scale_is_the_served_score_as_built_and_another_scale_changes_the_order():
    from label_free import runs_from

    from aheadrank.priors import QueryFeatures

    rng = np.random.default_rng(2)
    docids = [f"d{i}" for i in range(40)]
    per_q = [
        (
            q,
            docids,
            {
                "bm25": rng.gamma(2.0, size=40) * 5,
                "dense": rng.uniform(-0.2, 0.8, 40),
                "neural": rng.normal(size=40) ** 3,
            },
        )
        for q in ("q1", "q2")
    ]
    w = {"neural": 1 / 3, "bm25": 1 / 3, "dense": 1 / 3}
    as_built = runs_from([(q, QueryFeatures(d, f, {})) for q, d, f in per_q], w)
    got = nm.normalised_run(per_q, w, nm.NONE)
    assert got.keys() == as_built.keys() == {"q1", "q2"}
    for q in got:
        assert got[q] == pytest.approx(as_built[q])
    ranked = nm.normalised_run(per_q, w, "rank")["q1"]
    f = per_q[0][2]
    want = sum(w[k] * nm.normalise("rank", k, f[k]) for k in w)
    assert list(ranked.values()) == pytest.approx(want.tolist())
    assert [nm.point_name(p) for p in nm.GRID] == ["none", "minmax", "tmm", "rank"]
