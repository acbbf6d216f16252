"""bench/rag_long_texts.py on a tiny label-free build of a judged collection: every cell and aggregation is
measured, a long text sent ad hoc scores as the store's, and the per-passage way is computed from the same
passages' neural scores; bench/ad_hoc_windows_cost.py times the same build's cold requests both ways."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from conftest import build_tiny_label_free, write_judged_collection

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import ad_hoc_windows_cost  # noqa: E402
import rag_long_texts  # noqa: E402

pytestmark = pytest.mark.slow  # Java (the BM25 stage)


def test_the_bench_measures_every_cell_on_a_tiny_build(tmp_path, tiny_base):
    coll = write_judged_collection(
        tmp_path / "coll", random.Random(3), 30, (20, 3), {"test": ["q0", "q1", "q2"]}
    )
    judged = [(f"q{k}", f"d{2 * k + j}") for k in range(3) for j in (0, 1)]
    out = tmp_path / "b"
    build_tiny_label_free(coll, out, tiny_base, max_queries=20)
    result = tmp_path / "r.json"
    args = [
        "--build",
        str(out),
        "--collection",
        str(coll),
        "--depth",
        "12",
        "--threads",
        "1",
        "--out",
        str(result),
    ]
    assert rag_long_texts.main(args) == 0
    record = json.loads(result.read_text())
    rows = {(r["cell"], r["aggregation"]): r for r in record["rows"]}
    cells = ("stored", "ad-hoc", "ad-hoc/passage", "buried", "buried/passage")
    assert set(rows) == {(c, a) for c in cells for a in rag_long_texts.AGGREGATIONS}
    assert record["queries"] == 3 and 0 < rows[("buried", "maxp")]["relevant_texts"] <= len(judged)
    for a in rag_long_texts.AGGREGATIONS:  # the docid's way, ad hoc or stored: the same ranking here
        assert rows[("ad-hoc", a)]["per_query"] == pytest.approx(rows[("stored", a)]["per_query"], abs=1e-9)
        assert "vs_per_passage" in rows[("ad-hoc", a)] and "vs_per_passage" in rows[("buried", a)]
        assert "vs_per_passage" not in rows[("stored", a)]
    # what the window prior costs: both cells timed on texts never sent before
    cost = tmp_path / "cost.json"
    args = [
        "--build",
        str(out),
        "--collection",
        str(coll),
        "--texts",
        "5",
        "--rounds",
        "2",
        "--out",
        str(cost),
    ]
    assert ad_hoc_windows_cost.main([*args, "--threads", "1"]) == 0
    record = json.loads(cost.read_text())
    assert [r["cell"] for r in record["rows"]] == ["window", "no window"]
    assert record["window_entries"] == 2 * 5  # the window cell's texts, each cut and embedded once
    assert (
        all(len(r["seconds"]) == 2 and min(r["seconds"]) > 0 for r in record["rows"]) and record["ratio"] > 0
    )
    for r in record["rows"]:  # a request held the thread at most its whole time at once
        assert len(r["longest_turns"]) == 2
        assert all(0 < turn <= whole for turn, whole in zip(r["longest_turns"], r["seconds"], strict=True))

    with pytest.raises(SystemExit, match="30 documents, 40 needed"):
        ad_hoc_windows_cost.main([*args[:4], "--texts", "10", "--rounds", "2", "--out", str(cost)])


def test_the_longest_turn_is_the_longest_stretch_between_two_yields(monkeypatch):
    from types import SimpleNamespace

    from aheadrank.services import turns

    now = [0.0]
    monkeypatch.setattr(turns, "time", SimpleNamespace(perf_counter=lambda: now[0]))  # the turns' clock only

    def steps(stretches):  # each stretch of work advances the clock, then a turn
        for stretch in stretches:
            now[0] += stretch
            yield

    assert ad_hoc_windows_cost.longest_turn(steps([1.0, 5.0, 2.0])) == 5.0
    assert ad_hoc_windows_cost.longest_turn(steps([])) == 0.0
