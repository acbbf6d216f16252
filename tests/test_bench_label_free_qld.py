"""bench/label_free_qld.py: query likelihood takes half of BM25's weight, a candidate it did not rank gets its lowest
score, and the option is chosen on the other collections."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_qld as qld  # noqa: E402
import label_free_window_size as ws  # noqa: E402


def test_query_likelihood_takes_half_of_bm25s_weight_and_the_others_keep_theirs():
    w = {"neural": 0.25, "bm25": 0.25, "dense": 0.25, "window": 0.25}
    got = qld.with_qld(w)
    assert got == {"neural": 0.25, "bm25": 0.125, "dense": 0.25, "window": 0.25, "qld": 0.125}
    assert sum(got.values()) == pytest.approx(sum(w.values()))
    assert w["bm25"] == 0.25  # the build's weights are not changed in place


def test_a_candidate_query_likelihood_did_not_rank_gets_its_lowest_score():
    hits = [("a", 9.0), ("b", 7.5), ("c", 3.0)]
    assert qld.candidate_scores(hits, ["c", "x", "a"]) == pytest.approx(np.array([3.0, 3.0, 9.0]))
    assert qld.candidate_scores([], ["x", "y"]) == pytest.approx(np.zeros(2))


def test_the_probe_keeps_the_build_on_ties_and_chooses_on_the_others():
    probe = qld.QLD_PROBE
    assert probe.current == "none" and probe.options == ("none", "qld")
    assert ws.choose({"a": {"none": 0.40, "qld": 0.41}}, ["a"], probe) == "qld"
    assert ws.choose({"a": {"none": 0.40, "qld": 0.40003}}, ["a"], probe) == "none"
    assert (
        ws.choose({"a": {"none": 0.40, "qld": 0.39}, "t": {"none": 0.0, "qld": 1.0}}, ["a"], probe) == "none"
    )
