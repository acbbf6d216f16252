"""bench/label_free_maxsim.py: MaxSim is the mean of each query row's best cosine, and a served score taken apart
into z-scored features and put together again is the same run."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_maxsim as lm  # noqa: E402


def test_maxsim_is_the_mean_of_each_query_rows_best_match():
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    d = np.array([[0.6, 0.8], [1.0, 0.0], [0.0, -1.0]])
    assert lm.maxsim(q, d) == pytest.approx((1.0 + 0.8) / 2)
    assert lm.maxsim(q, d[:1]) == pytest.approx((0.6 + 0.8) / 2)
    assert lm.maxsim(q[:1], d) > lm.maxsim(q[:1], d[2:])


def test_features_z_scored_and_combined_give_back_a_weighted_run():
    run_a = {"1": {"x": 3.0, "y": 1.0, "z": 2.0}, "2": {"x": 5.0, "y": 5.0}}
    run_b = {"1": {"x": 0.0, "y": 2.0, "z": 1.0}, "2": {"x": 1.0, "y": 0.0}}
    z = {"a": lm.zscored(run_a), "b": lm.zscored(run_b)}
    assert z["a"]["2"] == {"x": 0.0, "y": 0.0}  # a constant list: zeros
    assert np.mean(list(z["a"]["1"].values())) == pytest.approx(0.0)
    both = lm.combine(z, {"a": 0.5, "b": 0.5})
    assert both["1"]["x"] == pytest.approx(0.5 * z["a"]["1"]["x"] + 0.5 * z["b"]["1"]["x"])
    assert set(both) == {"1", "2"} and set(both["1"]) == {"x", "y", "z"}
    # the served score less its other parts, over the window's weight, is the window feature
    served = lm.combine({**z, "w": z["b"]}, {"a": 0.25, "b": 0.25, "w": 0.5})
    rest = lm.combine(z, {"a": 0.25, "b": 0.25})
    assert all(
        (served[q][d] - rest[q][d]) / 0.5 == pytest.approx(z["b"][q][d]) for q in served for d in served[q]
    )
