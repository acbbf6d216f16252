"""bench/label_free_bm25_window.py: a window's BM25 is Lucene's formula over its own words, the feature joins the
served score at BM25's weight, and a collection's choice reads only the other collections that have windows."""

from __future__ import annotations

import math
import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_bm25_window as bw  # noqa: E402


def test_a_window_s_bm25_is_lucene_s_formula_over_its_own_words():
    idf = {"cell": 2.0, "mice": 1.0}
    query = Counter(["cell", "mice", "mice"])  # a word the query repeats counts as often
    window = Counter(["cell", "cell", "growth", "mice"])
    norm = 0.9 * (1 - 0.4 + 0.4 * 4 / 8.0)
    expect = 2.0 * 2 / (2 + norm) + 2 * 1.0 * 1 / (1 + norm)
    assert bw.bm25_text(query, window, idf, 8.0, 0.9, 0.4) == pytest.approx(expect)
    assert bw.bm25_text(Counter(["absent"]), window, idf, 8.0, 0.9, 0.4) == 0.0
    # a longer window with the same matches scores lower (length normalisation)
    longer = window + Counter(["x"] * 12)
    assert bw.bm25_text(query, longer, idf, 8.0, 0.9, 0.4) < expect
    assert math.isfinite(bw.bm25_text(query, Counter(), idf, 8.0, 0.9, 0.4))


def test_the_feature_joins_at_bm25_s_weight_and_the_choice_reads_only_other_collections_with_windows():
    w = bw.with_bm25_window({"neural": 0.25, "bm25": 0.25, "dense": 0.25, "window": 0.25})
    assert w == pytest.approx({k: 0.2 for k in ("neural", "bm25", "dense", "window", "bm25window")})
    w = bw.with_bm25_window({"neural": 1 / 6, "bm25": 5 / 18, "dense": 5 / 18, "window": 5 / 18})
    assert sum(w.values()) == pytest.approx(1.0) and w["bm25window"] == pytest.approx(w["bm25"])
    gains = {"a": 0.01, "b": -0.004, "none": None, "t": -1.0}
    assert bw.choose(gains, ["a", "b", "none"])  # mean 0.003 over the two with windows
    assert not bw.choose(gains, ["b", "none"])
    assert not bw.choose(gains, ["none"])  # nothing to choose on: off
    assert not bw.choose({"a": 0.0}, ["a"])  # no gain: off
