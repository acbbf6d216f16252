"""bench/label_free_deeper.py: depth 200 against 100 from two bench/label_free.py runs of the same builds, each
collection's depth chosen on the others."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_deeper as dp  # noqa: E402


def _result(collection: str, depth: int, served: float, fusion: float = 0.5) -> dict:
    v = "mores-2ib-s2"
    return {
        "collection": collection,
        "depth": depth,
        "baselines": {"bm25": 0.4, "bi-encoder": 0.4, "rrf": fusion - 0.01, "fusion-equal": fusion},
        "variants": {v: {"runs": {f"{v}+priors": {"ndcg10": served}}}},
    }


def _bench(folder: Path, depth: int, served: dict[str, float]) -> Path:
    folder.mkdir(parents=True)
    results = [_result(c, depth, s) for c, s in served.items()]
    (folder / "label_free.json").write_text(json.dumps({"results": results}))
    return folder


def test_each_collection_takes_the_depth_the_others_serve_better_at(tmp_path):
    deep = dp.read_bench(_bench(tmp_path / "d", 200, {"a": 0.60, "b": 0.55, "c": 0.50}), 200)
    shallow = dp.read_bench(_bench(tmp_path / "s", 100, {"a": 0.58, "b": 0.56, "c": 0.52}), 100)
    collections, rankers, margins, best = dp.margins_of(deep, shallow)
    assert collections == ["a", "b", "c"] and rankers == ["mores-2ib-s2"] and best["a"] == "fusion-equal"
    assert margins["a"] == pytest.approx({100: 0.08, 200: 0.10})
    assert dp.choose(margins, ["b", "c"]) == 100  # b and c serve better at 100
    assert dp.choose(margins, ["a", "b"]) == 200  # +0.02 and -0.01
    assert dp.choose({"x": {100: 0.1, 200: 0.1}}, ["x"]) == 100  # a tie stays shallow


def test_a_run_at_another_depth_or_a_missing_one_is_refused(tmp_path):
    folder = _bench(tmp_path / "d", 100, {"a": 0.6})
    with pytest.raises(SystemExit, match="depth 100, not 200"):
        dp.read_bench(folder, 200)
    with pytest.raises(SystemExit, match="no label_free.json"):
        dp.read_bench(tmp_path / "nowhere", 200)
    one = {"a": _result("a", 200, 0.6)}
    with pytest.raises(SystemExit, match="at least two collections"):
        dp.margins_of(one, {"a": _result("a", 100, 0.6)})
