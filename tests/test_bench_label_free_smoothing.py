"""bench/label_free_smoothing.py: each candidate's neighbours are its k most similar other candidates (weights its
positive cosines, normalised), and a smoothed score mixes its own z-score with its neighbours'."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_smoothing as sm  # noqa: E402


def test_neighbours_are_the_k_most_similar_other_candidates_with_positive_weights():
    v = np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [-1.0, 0.0]])
    w = sm.neighbours(v, 1)
    assert np.all(np.diag(w) == 0)  # never itself
    assert w[0] == pytest.approx([0, 1, 0, 0]) and w[1] == pytest.approx([1, 0, 0, 0])
    assert w[2] == pytest.approx([0, 1, 0, 0])  # doc 1 leans towards doc 2 more than doc 0 does
    assert w[3] == pytest.approx([0, 0, 0, 0])  # its nearest other is at cosine < 0: no neighbour
    w2 = sm.neighbours(v * 3, 2)  # lengths do not matter
    c01, c02 = 1.0, 0.0
    c12 = 0.1 / np.hypot(0.9, 0.1)
    c10 = 0.9 / np.hypot(0.9, 0.1)
    assert w2[1] == pytest.approx(np.array([c10, 0, c12, 0]) / (c10 + c12))
    assert w2[0].sum() == pytest.approx(1.0) and c01 > c02


def test_a_smoothed_score_mixes_its_own_z_score_with_its_neighbours():
    from aheadrank.priors import zscore

    s = np.array([3.0, 1.0, 0.0, 2.0])
    w = np.array([[0, 1, 0, 0], [1, 0, 0, 0], [0, 0, 0, 1], [0, 0, 1, 0]], dtype=float)
    z = zscore(s)
    assert sm.smooth(s, w, 0.0) == pytest.approx(z)
    got = sm.smooth(s, w, 0.25)
    assert got == pytest.approx(0.75 * z + 0.25 * z[[1, 0, 3, 2]])
    assert [sm.point_name(p) for p in sm.GRID[:2]] == ["none", "k5-a0.1"]
    features = {
        "qids": ["q"],
        "docids": {"q": ["a", "b"]},
        "docs": {"a": np.array([1.0, 0]), "b": np.array([1.0, 0.1])},
    }
    runs = {"r": {"q": {"a": 1.0, "b": 0.0}}}
    assert sm.smoothed_runs(features, runs, sm.NONE) is runs
    out = sm.smoothed_runs(features, runs, (1, 0.5))["r"]["q"]
    assert out["a"] == pytest.approx(0.5 * 1 + 0.5 * -1) and out["b"] == pytest.approx(0.5 * -1 + 0.5 * 1)
