"""bench/label_free_qpp.py: each feature's per-query weight is its fixed weight times its predictor's ratio to the
collection's mean, raised to gamma; without per-query weights it is the served score as built."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_qpp as qpp  # noqa: E402


def test_head_is_the_mean_of_the_ten_largest_z_scores_and_agree_the_correlation_with_the_rest():
    from aheadrank.priors import zscore

    rng = np.random.default_rng(0)
    a = rng.normal(size=100)
    z = {"a": zscore(a), "b": zscore(a + 0.1 * rng.normal(size=100)), "c": zscore(rng.normal(size=100))}
    w = {"a": 1.0, "b": 1.0, "c": 1.0}
    head = qpp.predictor("head", z, w)
    assert head["a"] == pytest.approx(np.sort(z["a"])[-10:].mean())
    agree = qpp.predictor("agree", z, w)
    assert agree["a"] == pytest.approx(np.corrcoef(z["a"], z["b"] + z["c"])[0, 1])
    assert agree["c"] < agree["a"]  # c is noise the other two do not share
    opposite = qpp.predictor("agree", {"a": z["a"], "b": -z["a"]}, w)
    # a negative correlation is floored, never a negative weight
    assert opposite == {"a": qpp.FLOOR, "b": qpp.FLOOR}
    flat = qpp.predictor("head", {"a": np.zeros(20)}, w)
    assert flat == {"a": qpp.FLOOR}
    with pytest.raises(ValueError, match="unknown predictor"):
        qpp.predictor("clarity", z, w)


def test_per_query_weights_scale_each_feature_by_its_predictor_s_ratio_to_the_collection_mean():
    from label_free import runs_from

    from aheadrank.priors import QueryFeatures, zscore

    rng = np.random.default_rng(1)
    docids = [f"d{i}" for i in range(30)]
    per_q = [
        (q, docids, {"x": rng.normal(size=30), "y": rng.normal(size=30) * 5, "u": rng.normal(size=30)})
        for q in ("q1", "q2", "q3")
    ]
    w = {"x": 0.5, "y": 0.25, "u": 0.0}  # a feature at weight 0 is not read
    as_built = runs_from([(q, QueryFeatures(d, f, {})) for q, d, f in per_q], w)
    got = qpp.adaptive_run(per_q, w, qpp.NONE)
    assert got.keys() == as_built.keys()
    for q in got:
        assert list(got[q].values()) == pytest.approx(list(as_built[q].values()))
    run = qpp.adaptive_run(per_q, w, ("head", 2.0))
    heads = [{f: np.sort(zscore(f_[f]))[-10:].mean() for f in ("x", "y")} for _, _, f_ in per_q]
    mean = {f: np.mean([h[f] for h in heads]) for f in ("x", "y")}
    q, d, f = per_q[1]
    want = sum(w[k] * (heads[1][k] / mean[k]) ** 2 * zscore(f[k]) for k in ("x", "y"))
    assert list(run[q].values()) == pytest.approx(want.tolist())
    assert [qpp.point_name(p) for p in qpp.GRID] == [
        "none",
        "head-g0.5",
        "head-g1",
        "head-g2",
        "agree-g0.5",
        "agree-g1",
        "agree-g2",
    ]
