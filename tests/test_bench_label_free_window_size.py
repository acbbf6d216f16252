"""bench/label_free_window_size.py: a collection's window size is chosen on the other collections' mean served
score, and only a size that beats the current one by more than rounding replaces it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_window_size as ws  # noqa: E402


def test_a_collection_s_size_is_chosen_on_the_others_and_the_current_size_keeps_ties():
    assert ws.CURRENT == 2 and ws.CURRENT in ws.SIZES
    served = {
        "a": {1: 0.50, 2: 0.48, 3: 0.47},
        "b": {1: 0.40, 2: 0.41, 3: 0.42},
        "flat": {1: 0.30, 2: 0.30, 3: 0.30},  # no sentence breaks: the same at every size
        "t": {1: 0.0, 2: 1.0, 3: 0.0},  # the target's own numbers never count
    }
    assert ws.choose(served, ["a"]) == 1
    assert ws.choose(served, ["b"]) == 3
    assert ws.choose(served, ["a", "b"]) == 1  # means 0.45 / 0.445 / 0.445
    assert ws.choose(served, ["flat"]) == 2  # nothing to choose on: the current size
    assert ws.choose(served, ["a", "flat"]) == 1
    # a lead within rounding keeps the current size
    assert ws.choose({"c": {1: 0.41003, 2: 0.41, 3: 0.40}}, ["c"]) == 2
    assert ws.choose({"c": {1: 0.4102, 2: 0.41, 3: 0.40}}, ["c"]) == 1


def test_the_build_s_window_size_is_the_one_the_probe_calls_current():
    from aheadrank.build import WINDOW_SENTENCES

    assert ws.CURRENT == WINDOW_SENTENCES


def test_a_collection_s_runs_may_come_from_another_folder(capsys):
    args = ws.parse_args(
        ["--neural", "r:mores-2ib-s2", "--runs-of", "scifact=bench/results/label-free/maxp-scifact"]
    )
    assert args.runs_of == {"scifact": Path("bench/results/label-free/maxp-scifact")}
    assert ws.parse_args(["--neural", "r:mores-2ib-s2"]).runs_of == {}
    with pytest.raises(SystemExit):
        ws.parse_args(["--neural", "r:mores-2ib-s2", "--runs-of", "scifact"])
    assert "--runs-of: expected COLLECTION=DIR" in capsys.readouterr().err


def test_a_document_s_windows_pool_into_one_feature():
    sims = np.array([0.2, 0.9, 0.5])
    assert ws.pool(sims, "max") == pytest.approx(0.9)
    assert ws.pool(sims, "first+max") == pytest.approx(0.55)
    assert ws.pool(sims, "top2") == pytest.approx(0.7)
    one = np.array([0.4])  # one window: every pool is that window
    assert [ws.pool(one, how) for how in ws.POOLS] == pytest.approx([0.4] * len(ws.POOLS))
    with pytest.raises(ValueError, match="unknown window pooling"):
        ws.pool(sims, "mean")


def test_the_pooling_probe_chooses_among_pools_and_keeps_max_on_ties():
    import label_free_window_pool as wp

    probe = wp.POOL_PROBE
    assert probe.current == "max" and probe.setting("top2") == (2, "top2")
    served = {"a": {"max": 0.40, "first+max": 0.39, "top2": 0.42}, "flat": {p: 0.3 for p in ws.POOLS}}
    assert ws.choose(served, ["a"], probe) == "top2"
    assert ws.choose(served, ["flat"], probe) == "max"
