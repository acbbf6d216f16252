"""Crash safety: a writer killed with SIGKILL at random moments leaves a consistent store that resumes."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from aheadrank.store import StoreReader, StoreWriter, read_manifest, verify_store
from store_crash_child import CRASH_SPEC
from store_testkit import doc_fields, make_spec

from aheadrank.errors import StoreError

CHILD = Path(__file__).with_name("store_crash_child.py")
TOTAL = 600
KILLS = 6


def _start_child(path: Path) -> tuple[subprocess.Popen, int]:
    # the child imports aheadrank as this process does (installed; the repo root on its path would shadow the
    # package with the top-level aheadrank/ folder, which holds no store/)
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(path), str(TOTAL)], stdout=subprocess.PIPE, text=True
    )
    line = child.stdout.readline()  # "ready N" once imports are done and the writer has resumed
    assert line.startswith("ready "), f"child failed to start: {line!r}"
    return child, int(line.split()[1])


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkill_at_random_points_then_resume(tmp_path):
    rng = random.Random(1234)
    store = tmp_path / "store"
    done_history = []
    for _ in range(KILLS):
        child, num_done = _start_child(store)
        done_history.append(num_done)
        time.sleep(rng.uniform(0.0, 0.25))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
        if (store / "manifest.json").exists():
            # whatever moment the kill hit, the manifest and every shard it lists are intact
            assert verify_store(store, allow_incomplete=True) == []
            manifest = read_manifest(store)
            if not manifest.complete:
                with pytest.raises(StoreError, match="interrupted.*[Rr]esume"):
                    StoreReader(store)
    print("done_history", done_history)
    assert done_history == sorted(done_history), "finished shards must survive later kills"
    with StoreWriter(store, make_spec(**CRASH_SPEC), resume=True) as writer:
        assert writer.num_done % CRASH_SPEC["shard_size"] == 0 or writer.num_done == TOTAL
        for i in range(writer.num_done, TOTAL):
            writer.add(f"d{i}", doc_fields(i))
    assert not list(store.glob(".*.tmp")), "temp files of killed writers must be gone"
    assert verify_store(store) == []
    with StoreReader(store, verify=True) as reader:
        ids = reader.docids()
        assert ids == [f"d{i}" for i in range(TOTAL)]  # every document exactly once, in order
        sample = [f"d{i}" for i in range(0, TOTAL, 7)]
        result = reader.fetch(sample)
        for row, docid in enumerate(sample):
            want = doc_fields(int(docid[1:]))
            for name, values in want.items():
                assert np.array_equal(result.fields[name][row, : len(values)], values.astype(np.float16))


def test_leftover_temp_files_and_stray_shards_are_discarded(tmp_path):
    spec = make_spec(shard_size=2)
    with StoreWriter(tmp_path, spec) as writer:
        for i in range(3):
            writer.add(f"d{i}", doc_fields(i))
        writer.abort()  # one finished shard, one buffered document dropped
    (tmp_path / ".shard-00001.h5.deadbeef.tmp").write_bytes(b"half a shard")
    (tmp_path / "shard-00007.h5").write_bytes(b"not in the manifest, so it does not exist")
    with StoreWriter(tmp_path, spec) as writer:
        assert writer.num_done == 2
        assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "shard-00000.h5"]
        for i in range(writer.num_done, 5):
            writer.add(f"d{i}", doc_fields(i))
    with StoreReader(tmp_path) as reader:
        assert reader.docids() == [f"d{i}" for i in range(5)]


def test_exception_inside_with_leaves_a_resumable_store(tmp_path):
    spec = make_spec(shard_size=3)
    with pytest.raises(RuntimeError):
        with StoreWriter(tmp_path, spec) as writer:
            for i in range(7):
                writer.add(f"d{i}", doc_fields(i))
            raise RuntimeError("encoder crashed")
    manifest = read_manifest(tmp_path)
    assert not manifest.complete and manifest.n_docs == 6
    with StoreWriter(tmp_path, spec) as writer:
        assert writer.num_done == 6
        writer.add("d6", doc_fields(6))
    assert read_manifest(tmp_path).complete


def test_broken_shard_of_an_interrupted_build_is_rebuilt(tmp_path):
    spec = make_spec(shard_size=2)
    with StoreWriter(tmp_path, spec) as writer:
        for i in range(6):
            writer.add(f"d{i}", doc_fields(i))
        writer.abort()
    (tmp_path / "shard-00001.h5").unlink()  # lost after the manifest listed it
    with StoreWriter(tmp_path, spec) as writer:
        assert writer.num_done == 2  # the prefix before the missing shard
        assert [s.index for s in read_manifest(tmp_path).shards] == [0]
        for i in range(writer.num_done, 6):
            writer.add(f"d{i}", doc_fields(i))
    assert verify_store(tmp_path) == []
