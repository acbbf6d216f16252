"""bench/speed_probe.py: the build's speed probe beside the dense field it foretells, on a tiny bi-encoder."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import speed_probe  # noqa: E402

from aheadrank.buildtime import DENSE_S  # noqa: E402


def test_the_probe_and_the_field_are_scales_of_the_same_reference(tmp_path, tiny_base):
    coll = tmp_path / "tiny"
    coll.mkdir()
    lines = [
        json.dumps({"_id": f"d{i}", "title": "", "text": " ".join(["word"] * (5 + i % 40))})
        for i in range(300)
    ]
    (coll / "corpus.jsonl").write_text("\n".join(lines) + "\n")
    out, work = tmp_path / "out", tmp_path / "work"
    argv = [
        "--collections", str(coll), "--repeats", "2", "--base", str(tiny_base), "--work", str(work), "--out", str(out),
    ]  # fmt: skip
    assert speed_probe.main(argv) == 0
    (r,) = json.loads((out / "speed_probe.json").read_text())["results"]
    assert r["collection"] == "tiny" and r["documents"] == 300
    assert len(r["probes_before"]) == len(r["probes_after"]) == 2
    assert all(p["documents"] == 128 and p["scale"] > 0 for p in r["probes_before"] + r["probes_after"])
    words = sum(5 + i % 40 for i in range(300))
    assert r["field_reference_seconds"] == pytest.approx(DENSE_S[0] * 300 + DENSE_S[1] * words, abs=1e-3)
    assert r["field_scale"] == pytest.approx(r["field_seconds"] / r["field_reference_seconds"], rel=0.01)
    mean_before = sum(p["scale"] for p in r["probes_before"]) / 2
    assert r["field_over_probe"] == pytest.approx(r["field_scale"] / mean_before, rel=0.01)
    assert not (work / "tiny" / "dense").exists()  # the field is embedded, timed and removed
    md = (out / "speed_probe.md").read_text()
    assert f"| tiny | 300 | {words / 300:.0f} | " in md


def test_a_probe_needs_a_repeat(tmp_path, capsys):
    with pytest.raises(SystemExit):
        speed_probe.parse_args(["--repeats", "0", "--out", str(tmp_path)])
    assert "--repeats is at least 1" in capsys.readouterr().err
