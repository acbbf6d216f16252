"""bench/build_estimate.py: the estimates recomputed from a finished build's record, beside its measured times."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import build_estimate  # noqa: E402

from aheadrank.buildtime import STORE_BYTES_SLACK, Workload, reference_seconds, store_bytes  # noqa: E402


def write_build(
    folder: Path,
    collection: Path,
    dense_s: float,
    probe: float | None = None,
    encoded: bool = True,
    written: int | None = None,
) -> None:
    stages = {
        "collection": {"documents": 5183, "mean_words": 214.6, "seconds": 0.1},
        "bm25": {"seconds": 2.0},
        "queries": {"pseudo_queries": 3000, "seconds": 8.0},
        # encoded: the field embedded in the stage (its rate recorded); else found complete, in no time
        "dense": {"seconds": dense_s, **({"docs_per_s": 6.3} if encoded else {})},
        "train": {"steps": 36, "best_step": 0, "seconds": 150.0},
        "store": {"seconds": 250.0, **({"store_bytes": written, "passages": True} if written else {})},
    }
    if probe is not None:  # a build since the speed probe
        stages["collection"]["probe"] = {"documents": 128, "seconds": 1.0, "scale": probe}
    plan = {"collection": str(collection), "out": str(folder), "ranker": "mores-2ib-s2", "labels": "none",
            "steps": None, "an_old_field": 1}  # fmt: skip
    folder.mkdir(parents=True)
    (folder / "build.json").write_text(json.dumps({"plan": plan, "stages": stages, "format": 1}))


def test_the_estimates_are_recomputed_and_scaled_by_the_dense_stage(tmp_path):
    coll = tmp_path / "c.jsonl"
    coll.write_text('{"id": "d", "contents": "x"}\n')
    ref = reference_seconds(Workload(5183, 214.6, 3000, 36, "mores", 128, True))
    write_build(tmp_path / "runs" / "fast", coll, dense_s=ref["dense"])
    write_build(tmp_path / "runs" / "slow", coll, dense_s=2 * ref["dense"], probe=3.0, written=9_000_000_000)
    write_build(tmp_path / "runs" / "linked", coll, dense_s=0.0, probe=3.0, encoded=False)
    (tmp_path / "runs" / "empty").mkdir()
    out = tmp_path / "out"
    assert (
        build_estimate.main([str(p) for p in sorted((tmp_path / "runs").iterdir())] + ["--out", str(out)])
        == 0
    )
    got = json.loads((out / "build_estimate.json").read_text())["results"]
    assert set(got) == {"runs/fast", "runs/slow", "runs/linked"}  # a folder without build.json is passed over
    fast, slow = got["runs/fast"], got["runs/slow"]
    # a dense field found complete took no time: no estimate is scaled by it
    assert got["runs/linked"]["scale"] is None
    assert "estimate_after_dense_s" not in got["runs/linked"]["stages"]["store"]
    # the steps the build ran (its train stage), not today's default
    assert fast["stages"]["train"]["estimate_s"] == pytest.approx(ref["train"], abs=0.1)
    assert fast["stages"]["store"]["estimate_after_dense_s"] == pytest.approx(ref["store"], rel=1e-3)
    assert slow["stages"]["store"]["estimate_after_dense_s"] == pytest.approx(2 * ref["store"], rel=1e-3)
    assert "estimate_after_dense_s" not in slow["stages"]["bm25"]  # printed before the dense stage
    assert slow["stages"]["priors"]["measured_s"] is None
    # the first line's estimate, scaled by the collection stage's probe: every stage after the collection
    assert slow["probe_scale"] == 3.0 and fast["probe_scale"] is None
    assert slow["stages"]["bm25"]["estimate_probe_s"] == pytest.approx(3 * ref["bm25"], abs=0.1)
    assert slow["stages"]["store"]["estimate_probe_s"] == pytest.approx(3 * ref["store"], abs=0.1)
    assert "estimate_probe_s" not in fast["stages"]["store"]  # a record from before the probe
    md = (out / "build_estimate.md").read_text()
    assert "| runs/slow | 5,183 | store | " in md and "**all run here**" in md
    store = next(line for line in md.splitlines() if line.startswith("| runs/slow | 5,183 | store |"))
    cells = [c.strip() for c in store.split("|")[1:-1]]
    assert cells[4] == f"{3 * ref['store']:.0f}" and cells[8] == f"{250.0 / (3 * ref['store']):.2f}"
    fast_store = next(line for line in md.splitlines() if line.startswith("| runs/fast | 5,183 | store |"))
    assert [c.strip() for c in fast_store.split("|")[1:-1]][4] == ""  # no probe, no column
    # the store's bytes as the build estimates them (MORES 2xIB S2 on MiniLM: four 384-wide float16 fields a piece)
    # beside what it wrote, where the record has them
    estimate = store_bytes(Workload(5183, 214.6, 3000, 36, "mores", 128, True), 4 * 384 * 2)
    assert slow["store"]["estimate_bytes"] == round(estimate) and fast["store"] is None
    assert slow["store"]["written_bytes"] == 9_000_000_000
    row = next(line for line in md.splitlines() if line.startswith("| runs/slow | float16 | yes |"))
    assert row.endswith(f"| 9.00 GB | {9e9 / estimate:.2f} | {9e9 * STORE_BYTES_SLACK / estimate:.2f} |")


def test_no_finished_build_is_an_error(tmp_path, capsys):
    assert build_estimate.main([str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "no finished build" in capsys.readouterr().err
