"""bench/java_memory.py on the bundled sample: the queries stage's searches run in a child, which reports its
memory before, after the searches and after the JVM gave its free heap back; the table and JSON are written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import java_memory  # noqa: E402

pytestmark = pytest.mark.slow  # needs Java


def test_the_bench_reports_the_memory_the_jvm_gives_back(tmp_path, capsys):
    sample = ROOT / "aheadrank" / "data" / "scifact-sample"
    argv = ["--collection", str(sample), "--max-queries", "40", "--rounds", "1"]
    assert java_memory.main([*argv, "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "out")]) == 0
    got = json.loads((tmp_path / "out" / "java_memory.json").read_text())
    (row,) = got["rounds"]
    assert row["queries"] == 40
    assert row["rss_start_mb"] < row["rss_after_queries_mb"]  # the JVM and the searches
    assert row["rss_after_release_mb"] <= row["rss_after_queries_mb"]
    assert "| 1 | 40 |" in capsys.readouterr().out
    assert (tmp_path / "out" / "java_memory.md").read_text().count("\n") >= 5
