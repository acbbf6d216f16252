"""Build faults (issue 12, items 2 and 7-11): changed collections, bad records, full or read-only disks,
concurrent builds, leftovers of killed runs, truncated inputs. In-process, bounded, no network."""

from __future__ import annotations

import errno
import gzip
import json
import os
import random
import re
import shutil
from pathlib import Path

import faults_testkit  # noqa: F401  (puts the other testkits on sys.path)
import pytest
from aheadrank.indexer.build import LOCK_NAME, BuildOptions, build_store
from aheadrank.indexer.collections import Collection
from aheadrank.store import read_manifest, verify_store
from faults_testkit import text_docs, write_jsonl
from typer.testing import CliRunner

from aheadrank.cli import app
from aheadrank.errors import CollectionError, StoreError
from aheadrank.fsfaults import BuildLockedError, exclusive_lock

SHARD = 10
N_DOCS = 30


def _docs(n: int = N_DOCS, seed: int = 3) -> list[dict]:
    return text_docs(n, seed)


_write = write_jsonl


@pytest.fixture(scope="module")
def checkpoint(tiny_base, tmp_path_factory) -> Path:
    from aheadrank.rankers import init_ranker, save_checkpoint

    path = tmp_path_factory.mktemp("ckpt") / "tk"
    save_checkpoint(init_ranker("tk", base=tiny_base, max_doc_len=32, tk_heads=4), path)
    return path


@pytest.fixture(scope="module")
def built(checkpoint, tmp_path_factory) -> tuple[Path, Path]:
    """(collection, a complete store of it: 3 shards of 10)."""
    root = tmp_path_factory.mktemp("built")
    coll = _write(root / "corpus.jsonl", _docs())
    store = root / "store"
    build_store(BuildOptions(str(checkpoint), str(coll), str(store), shard_size=SHARD, progress=False))
    return coll, store


def _opts(checkpoint: Path, coll: Path, store: Path, **kw) -> BuildOptions:
    return BuildOptions(str(checkpoint), str(coll), str(store), shard_size=SHARD, progress=False, **kw)


def _no_model(monkeypatch) -> None:
    """Fail the test if the build loads the model (checks that must come first)."""

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the check")

    monkeypatch.setattr("aheadrank.indexer.build.get_ranker", boom)


# ---- 2: a store built from another collection ------------------------------------------------------
def _rename(docs, i):
    docs[i]["_id"] = "renamed-" + docs[i]["_id"]


def _retext(docs, i):
    docs[i]["text"] += " changed"


def _drop(docs, i):
    del docs[i]


def _swap(docs, i):
    j = (i + 7) % len(docs)
    docs[i], docs[j] = docs[j], docs[i]


@pytest.mark.parametrize("change", [_rename, _retext, _drop, _swap])
@pytest.mark.parametrize("where", [0, 13, N_DOCS - 1])
def test_changed_collection_is_refused_not_mixed(built, checkpoint, tmp_path, change, where):
    coll, store = built
    copy = Path(shutil.copytree(store, tmp_path / "store"))
    docs = _docs()
    change(docs, where)
    changed = _write(tmp_path / "corpus.jsonl", docs)
    before = (copy / "manifest.json").read_bytes()
    with pytest.raises(StoreError, match="different collection.*--overwrite"):
        build_store(_opts(checkpoint, changed, copy))
    assert (copy / "manifest.json").read_bytes() == before  # nothing rewritten
    assert verify_store(copy) == []
    summary = build_store(_opts(checkpoint, changed, copy, overwrite=True))  # the way out works
    reader_ids = [d.decode() for d in _all_docids(copy)]
    assert reader_ids == [d["_id"] for d in docs] and summary.shards_reused == 0


def _all_docids(store: Path):
    from aheadrank.store import StoreReader

    with StoreReader(store) as reader:
        return [d.encode() for d in reader.docids()]


def test_manifest_records_the_collection(built):
    coll, store = built
    manifest = read_manifest(store)
    assert manifest.collection["documents"] == N_DOCS and len(manifest.collection["sha256"]) == 64
    assert all(len(s.source) == 64 for s in manifest.shards)


def test_same_or_grown_collection_is_reused(built, checkpoint, tmp_path):
    coll, store = built
    copy = Path(shutil.copytree(store, tmp_path / "store"))
    summary = build_store(_opts(checkpoint, coll, copy))
    assert summary.shards_reused == 3 and summary.documents == N_DOCS
    grown = _write(tmp_path / "grown.jsonl", _docs() + [{"_id": "new", "text": "new cancer text"}])
    summary = build_store(_opts(checkpoint, grown, copy))
    assert summary.shards_reused == 3 and summary.documents == N_DOCS + 1


# ---- 7: one bad-record policy for both indexes ------------------------------------------------------
@pytest.mark.slow
def test_nul_docid_is_skipped_by_both_builds(checkpoint, tmp_path):
    from aheadrank.indexer.bm25 import Bm25Searcher, build_bm25_index

    docs = _docs(12)
    docs[4]["_id"] = "bad\x00id"
    coll = _write(tmp_path / "corpus.jsonl", docs)
    result = build_bm25_index(coll, tmp_path / "bm25", progress=False, threads=1)
    summary = build_store(_opts(checkpoint, coll, tmp_path / "store"))
    assert result.documents == summary.documents == 11
    assert dict(result.report.counts) == summary.collection_report["problems"] == {"invalid_id": 1}
    with Bm25Searcher(tmp_path / "bm25") as searcher:
        assert searcher.num_docs == 11
    assert set(d.decode() for d in _all_docids(tmp_path / "store")) == {d["_id"] for d in docs} - {
        "bad\x00id"
    }


# ---- 8: full disk, read-only directory ------------------------------------------------------------------
def test_unwritable_store_fails_before_the_model_loads(checkpoint, built, tmp_path, monkeypatch):
    coll, _ = built
    _no_model(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot write the store .*not a directory"):
        build_store(_opts(checkpoint, coll, blocker / "store"))
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    try:
        if os.access(readonly, os.W_OK):  # root: permissions do not deny; the injected errno stands in
            real_open = open

            def ro_open(file, *a, **k):
                if str(file).startswith(str(readonly)):
                    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(file))
                return real_open(file, *a, **k)

            monkeypatch.setattr("builtins.open", ro_open)
        with pytest.raises(StoreError, match="read-only|permission denied"):
            build_store(_opts(checkpoint, coll, readonly / "store"))
    finally:
        monkeypatch.undo()
        readonly.chmod(0o700)


def test_disk_full_mid_build_is_one_error_line_and_resumable(built, checkpoint, tmp_path, monkeypatch):
    coll, ref = built
    store = tmp_path / "store"
    import aheadrank.store as store_pkg

    real = store_pkg.write_shard
    calls = []

    def full_disk(path, index, *a, **k):
        calls.append(index)
        if index == 1:
            tmp = Path(path) / f".shard-{index:05d}.h5.deadbeef.tmp"
            tmp.write_bytes(b"half")  # what a dying writer leaves behind
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, index, *a, **k)

    monkeypatch.setattr(store_pkg, "write_shard", full_disk)
    runner = CliRunner()
    args = ["index", "--checkpoint", str(checkpoint), "--collection", str(coll), "--store", str(store),
            "--shard-size", str(SHARD), "--no-progress"]  # fmt: skip
    res = runner.invoke(app, args)
    assert res.exit_code == 2, res.output
    errors = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error:") and "disk is full" in errors[0], res.stderr
    manifest = read_manifest(store)
    assert not manifest.complete and [s.index for s in manifest.shards] == [0]
    monkeypatch.setattr(store_pkg, "write_shard", real)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert not list(store.glob(".*.tmp"))  # the dead writer's temp file was discarded on resume
    assert [s.sha256 for s in read_manifest(store).shards] == [s.sha256 for s in read_manifest(ref).shards]


def test_index_refuses_a_store_that_cannot_fit_before_the_model_loads(
    built, checkpoint, tmp_path, monkeypatch
):
    """`aheadrank index` counts the collection and says what the store will take and what is free; with too little
    room it stops with one error line naming the smaller dtypes, before the model loads or anything is written;
    a compressed store's estimate is an upper bound, so it is only said."""
    import aheadrank.indexer.build as indexing

    coll, ref = built
    store = tmp_path / "store"
    runner = CliRunner()
    args = ["index", "--checkpoint", str(checkpoint), "--collection", str(coll), "--store", str(store),
            "--shard-size", str(SHARD), "--no-progress"]  # fmt: skip
    with monkeypatch.context() as patch:
        patch.setattr(indexing, "free_bytes", lambda path: 100)
        _no_model(patch)
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output
        errors = [line for line in res.stderr.splitlines() if line.strip()]
        assert len(errors) == 1, res.stderr
        assert re.match(
            r"error: \[store\] about \S+ kB to write \(float16\); 100 B free at .*: not enough room\. .*shards "
            r"finished are kept.*another --store \(--dtype int8 about \S+ kB, --dtype book4 about .*book2 about",
            errors[0],
        ), errors[0]
        assert not store.exists()
    with monkeypatch.context() as patch:  # zstd: the same room is said, not refused
        patch.setattr(indexing, "free_bytes", lambda path: 100)
        res = runner.invoke(app, [*args[:6], str(tmp_path / "zstd"), *args[7:], "--compression", "zstd"])
        assert res.exit_code == 0, res.output
        assert re.search(r"^\[store\] about .* 100 B free at .*: little room to spare$", res.stdout, re.M)
    res = runner.invoke(app, args)  # the room there is: built as the reference was
    assert res.exit_code == 0, res.output
    assert re.search(r"^\[store\] about \S+ kB to write \(float16\); \S+ [kMGT]?B free at ", res.stdout, re.M)
    assert [s.sha256 for s in read_manifest(store).shards] == [s.sha256 for s in read_manifest(ref).shards]
    res = runner.invoke(app, args)  # complete: nothing to write, so no room line
    assert res.exit_code == 0 and "[store]" not in res.stdout and "3 reused" in res.stdout, res.output


def test_store_info_says_a_damaged_store_is_not_complete(built, tmp_path):
    """A shard cut short or gone: store-info names it and exits 1 (it said "complete" from the manifest alone)."""
    _, ref = built
    store = tmp_path / "store"
    shutil.copytree(ref, store)
    runner = CliRunner()
    res = runner.invoke(app, ["store-info", str(store)])
    assert res.exit_code == 0 and "(complete)" in res.stdout, res.output
    with (store / "shard-00001.h5").open("r+b") as f:
        f.truncate(100)
    (store / "shard-00002.h5").unlink()
    res = runner.invoke(app, ["store-info", str(store)])
    assert res.exit_code == 1 and "(complete)" not in res.stdout, res.output
    assert re.search(
        r"DAMAGED: shard-00002.h5: missing; shard-00001.h5: 100 bytes on disk, the manifest says \d+",
        res.stdout,
    )
    res = runner.invoke(app, ["store-info", str(store), "--json"])
    assert res.exit_code == 1 and len(json.loads(res.stdout)["file_problems"]) == 2


# ---- 9: concurrent builds --------------------------------------------------------------------------------
def test_second_build_on_one_store_is_refused_at_once(built, checkpoint, tmp_path, monkeypatch):
    coll, _ = built
    store = tmp_path / "store"
    store.mkdir()
    _no_model(monkeypatch)
    with exclusive_lock(store / LOCK_NAME, "test"):
        with pytest.raises(
            BuildLockedError, match=rf"another build is writing the store .*pid {os.getpid()}"
        ):
            build_store(_opts(checkpoint, coll, store))


@pytest.mark.slow
def test_second_bm25_build_on_one_index_is_refused(tmp_path):
    from aheadrank.indexer.bm25 import build_bm25_index

    coll = _write(tmp_path / "corpus.jsonl", _docs(5))
    with exclusive_lock(tmp_path / ".bm25.lock", "test"):
        with pytest.raises(BuildLockedError, match="another build is writing the index"):
            build_bm25_index(coll, tmp_path / "bm25", progress=False, threads=1)
    build_bm25_index(coll, tmp_path / "bm25", progress=False, threads=1)  # free again


# ---- 10: leftovers of killed runs ---------------------------------------------------------------------------
@pytest.mark.slow
def test_bm25_leaves_no_copy_and_cleans_a_killed_runs(tmp_path, monkeypatch):
    import tempfile

    from aheadrank.indexer.bm25 import build_bm25_index

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "systmp"))
    (tmp_path / "systmp").mkdir()
    coll = _write(tmp_path / "corpus.jsonl", _docs(5))
    stale = tmp_path / ".aheadrank-bm25-convert-bm25"
    stale.mkdir()
    (stale / "docs000.jsonl").write_text("{}\n" * 100)  # a killed run's converted copy
    (tmp_path / "bm25.partial").mkdir()
    build_bm25_index(coll, tmp_path / "bm25", progress=False, threads=1)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["bm25", "corpus.jsonl", "systmp"], left
    assert not list((tmp_path / "systmp").iterdir())


# ---- 11: truncated input, a listed shard deleted, Java disk errors -------------------------------------------
def test_truncated_gzip_is_reported_at_the_cut(tmp_path):
    rng = random.Random(5)
    lines = [
        json.dumps({"_id": f"d{i}", "text": os.urandom(40).hex() + str(rng.random())}) for i in range(3000)
    ]
    data = gzip.compress(("\n".join(lines) + "\n").encode())
    path = tmp_path / "c.jsonl.gz"
    path.write_bytes(data[: len(data) // 2])
    seen = 0
    with pytest.raises(
        CollectionError, match=r"c\.jsonl\.gz:(\d+): cannot read/decompress after line"
    ) as info:
        for _ in Collection(path):
            seen += 1
    line = int(str(info.value).split(".gz:")[1].split(":")[0])
    assert seen > 1000 and line == seen + 1


def test_resume_rebuilds_a_deleted_or_cut_listed_shard(built, checkpoint, tmp_path):
    coll, ref = built
    store = Path(shutil.copytree(ref, tmp_path / "store"))
    (store / "shard-00001.h5").unlink()
    os.truncate(store / "shard-00002.h5", 100)
    summary = build_store(_opts(checkpoint, coll, store))
    assert summary.shards_reused == 1
    assert verify_store(store) == []
    assert [s.sha256 for s in read_manifest(store).shards] == [s.sha256 for s in read_manifest(ref).shards]


def test_java_disk_errors_are_named(tmp_path, monkeypatch):
    from aheadrank.indexer import bm25

    err = bm25._java_failure(
        RuntimeError("java.io.IOException: No space left on device"), tmp_path / "i", "x"
    )
    assert "disk is full" in str(err)
    monkeypatch.setattr(bm25.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 0))
    err = bm25._java_failure(
        RuntimeError("org.apache.lucene.store.AlreadyClosedException: closed"), tmp_path / "i", "x"
    )
    assert "disk is full" in str(err) and "AlreadyClosed" not in str(err)
