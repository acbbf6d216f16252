"""bench/label_free_prf.py: Rocchio feedback on the bi-encoder's query moves it towards the first pass's best
documents (and only those), its features are the cosines with the moved query, and a collection's feedback
setting is chosen on the other collections only, ties going to no feedback."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_prf as prf  # noqa: E402


def test_rocchio_moves_the_query_towards_the_first_pass_top_k_and_stays_a_unit_vector():
    q = np.array([1.0, 0.0, 0.0])
    docs = np.array([[0.0, 2.0, 0.0], [0.0, 0.0, 3.0], [5.0, 5.0, 0.0]])
    first = np.array([0.9, 0.1, 0.5])  # best: doc 0, then doc 2
    assert prf.rocchio(q * 4, first, docs, 0, 1.0) == pytest.approx(q)  # no feedback: q itself, normalised
    one = prf.rocchio(q, first, docs, 1, 1.0)
    assert one == pytest.approx(
        np.array([1.0, 1.0, 0.0]) / np.sqrt(2)
    )  # unit vectors, so doc 0's length is moot
    two = prf.rocchio(q, first, docs, 2, 0.5)
    mean = (np.array([0.0, 1.0, 0.0]) + np.array([1.0, 1.0, 0.0]) / np.sqrt(2)) / 2
    expect = q + 0.5 * mean
    assert two == pytest.approx(expect / np.linalg.norm(expect))
    assert two[2] == 0.0  # doc 1, outside the top 2, pulls nothing
    assert np.linalg.norm(prf.rocchio(q, first, docs, 5, 1.0)) == pytest.approx(1.0)  # k past the candidates


def test_features_are_the_cosines_with_the_moved_query_and_each_document_s_best_window():
    rng = np.random.default_rng(1)
    q = rng.normal(size=8)
    docs = rng.normal(size=(4, 8))
    windows = rng.normal(size=(6, 8))
    owner_rows = [[0], [1, 2], [3], [4, 5]]
    bm25 = np.array([3.0, 1.0, 2.0, 0.5])
    plain = prf.query_features(q, bm25, docs, windows, owner_rows, prf.NONE)
    unit_d, unit_w, unit_q = prf.unit(docs), prf.unit(windows), prf.unit(q)
    assert plain["dense"] == pytest.approx(unit_d @ unit_q)
    assert plain["window"][1] == pytest.approx(max(unit_w[1] @ unit_q, unit_w[2] @ unit_q))
    assert plain["bm25"] == pytest.approx(bm25)
    moved = prf.query_features(q, bm25, docs, windows, owner_rows, (2, 1.0))
    from aheadrank.priors import zscore

    first = 0.5 * zscore(bm25) + 0.5 * zscore(unit_d @ unit_q)
    q2 = prf.rocchio(q, first, docs, 2, 1.0)
    assert moved["dense"] == pytest.approx(unit_d @ q2)
    assert moved["window"][3] == pytest.approx(max(unit_w[4] @ q2, unit_w[5] @ q2))
    assert not np.allclose(moved["dense"], plain["dense"])


def test_a_collection_s_point_is_chosen_on_the_others_and_ties_go_to_no_feedback():
    k3 = (3, 1.0)
    margins = {
        "a": dict.fromkeys(prf.GRID, 0.0) | {k3: 0.02},
        "b": dict.fromkeys(prf.GRID, 0.0) | {k3: 0.01, (1, 0.5): 0.04},
        "t": dict.fromkeys(prf.GRID, -1.0) | {prf.NONE: 1.0},  # the target's own margins must not matter
    }
    assert prf.choose(margins, ["a", "b"]) == (1, 0.5)  # mean 0.02 against k3's 0.015
    assert prf.choose(margins, ["a"]) == k3
    assert prf.choose({"a": dict.fromkeys(prf.GRID, 0.0)}, ["a"]) == prf.NONE  # a tie: no feedback
    assert prf.choose(margins, ["t"]) == prf.NONE
    assert [prf.point_name(p) for p in prf.GRID[:3]] == ["none", "k1-b0.5", "k1-b1"]
