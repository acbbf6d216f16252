"""bench/build_memory.py: ``aheadrank index`` at several shard sizes over one collection, each build's peak RSS
and time from its own child process, and the stores checked to hold the same fields."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest
from conftest import random_text

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import build_memory  # noqa: E402


def test_each_shard_size_is_built_measured_and_holds_the_same_fields(tiny_base, tmp_path):
    rng = random.Random(5)
    coll = tmp_path / "corpus.jsonl"
    coll.write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": random_text(rng, 5, 400)}) + "\n" for i in range(90))
    )
    out = tmp_path / "out" / "build_memory.json"
    argv = ["--collection", str(coll), "--rankers", "mores-1ib-s2", "--shard-sizes", "90", "16"]
    assert build_memory.main([*argv, "--base", str(tiny_base), "--sample", "40", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    first, second = record["rows"]
    assert (first["shards"], second["shards"]) == (1, 6) and first["documents"] == second["documents"] == 90
    assert second["passages"] == first["passages"] > 0  # some texts are longer than the tiny ranker's window
    assert second["compared"] == 40 and second["compared_passages"] == min(40, first["passages"])
    assert 0 <= second["max_rel_diff"] <= build_memory.TOLERANCE
    assert all(r["peak_rss_mb"] > 0 and r["seconds"] > 0 for r in (first, second))
    assert second["rss_ratio"] == pytest.approx(second["peak_rss_mb"] / first["peak_rss_mb"], abs=1e-3)
    assert "| mores-1ib-s2 | 16 | 6 |" in out.with_suffix(".md").read_text()


def test_stores_that_differ_are_caught(tmp_path, tiny_base):
    """The comparison is not a formality: two stores of other checkpoints differ."""
    from aheadrank.indexer.build import BuildOptions, build_store
    from aheadrank.rankers import init_ranker, save_checkpoint

    rng = random.Random(6)
    coll = tmp_path / "c.jsonl"
    coll.write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": random_text(rng, 5, 30)}) + "\n" for i in range(20))
    )
    stores = []
    for seed in (0, 1):
        ckpt = tmp_path / f"ck{seed}"
        save_checkpoint(init_ranker("tk", base=tiny_base, seed=seed, tk_heads=4), ckpt)
        build_store(BuildOptions(str(ckpt), str(coll), str(tmp_path / f"s{seed}"), progress=False))
        stores.append(tmp_path / f"s{seed}")
    assert build_memory.same_fields(stores[0], stores[0], 10) == (10, 0.0)
    with pytest.raises(SystemExit, match="differs"):
        build_memory.same_fields(stores[0], stores[1], 10)
