"""`aheadrank index`: store builds equal direct encoding, resume after SIGKILL, Dask == local, refusals."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from aheadrank.indexer.build import BuildOptions, build_store
from aheadrank.rankers import init_ranker, save_checkpoint
from aheadrank.store import StoreReader, read_manifest, verify_store
from conftest import random_text

from aheadrank.errors import StoreError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> Path:
    rng = random.Random(11)
    path = tmp_path_factory.mktemp("coll") / "corpus.jsonl"
    with path.open("w") as f:
        for i in range(230):
            f.write(
                json.dumps({"_id": f"doc{i}", "title": f"title {i}", "text": random_text(rng, 1, 50)}) + "\n"
            )
        f.write("{not json\n")  # skipped and counted, not fatal
    return path


@pytest.fixture(scope="module")
def checkpoints(tiny_base, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("ckpts")
    out = {}
    for name, kind, opts in (
        ("mores", "mores", {"ibs": 2}),
        ("prettr", "prettr", {"layer": 2, "compress": 8}),
        ("tk", "tk", {"tk_heads": 4}),
        ("mores-b", "mores", {"ibs": 1}),
    ):
        save_checkpoint(init_ranker(kind, base=tiny_base, max_doc_len=40, **opts), root / name)
        out[name] = root / name
    return out


def read_all(store: Path) -> dict[str, dict[str, np.ndarray]]:
    reader = StoreReader(store)
    out = {}
    ids = reader.docids()
    for start in range(0, len(ids), 64):
        batch = reader.fetch(ids[start : start + 64])
        for row, docid in enumerate(batch.docids):
            n = int(batch.lengths[row])
            out[docid] = {k: v[row, :n].copy() for k, v in batch.fields.items()}
    return out


@pytest.mark.parametrize(
    ("name", "strategy"), [("mores", "s1"), ("mores", "s2"), ("prettr", None), ("tk", None)]
)
def test_store_equals_direct_encoding(collection, checkpoints, tmp_path, name, strategy):
    from aheadrank.indexer.collections import Collection
    from aheadrank.rankers import load_ranker

    summary = build_store(
        BuildOptions(
            str(checkpoints[name]),
            str(collection),
            str(tmp_path / "s"),
            strategy=strategy,
            shard_size=64,
            batch_size=16,
            progress=False,
        )
    )
    assert summary.documents == 230 and summary.skipped == 1 and summary.shards == 4
    docs = list(Collection(collection))
    ranker = load_ranker(checkpoints[name], strategy=strategy)
    direct = ranker.encode_documents([d.text for d in docs], batch_size=16)
    stored = read_all(tmp_path / "s")
    assert list(stored) == [d.docid for d in docs]
    for doc, expected in zip(docs, direct, strict=True):
        for field, value in expected.items():
            got = stored[doc.docid][field]
            want = value.half().numpy()
            assert got.dtype == np.float16 and got.shape == want.shape
            # float32 noise of another batching (padding width) may cross a float16 rounding boundary, and how
            # often depends on the CPU's kernels: assert what holds everywhere, not a bit-match fraction.
            # Every stored value is within one float16 step of the direct float32 value ...
            step = np.abs(np.spacing(want)).astype(np.float32)
            err = np.abs(got.astype(np.float32) - value.numpy())
            assert (err <= step + 1e-5).all(), (doc.docid, field, float((err - step).max()))
    # ... and rankings through the stored representations equal those through the direct ones
    for query in ("protein cell cancer", "blood pressure heart disease", "the effect of smoking"):
        assert_same_ranking(ranker, query, [stored[d.docid] for d in docs], direct)
    manifest = read_manifest(tmp_path / "s")
    assert manifest.complete and manifest.spec.fingerprint == ranker.fingerprint
    assert manifest.spec.strategy == ranker.strategy and manifest.spec.fields == ranker.field_dims()
    assert verify_store(tmp_path / "s") == []
    # every document's text (title and body joined, as the ranker read it) is found by its digest
    from aheadrank.store.texts import TEXT_DIGEST, text_digest

    assert manifest.text_digest == TEXT_DIGEST
    with StoreReader(tmp_path / "s") as reader:
        found = reader.find_texts([text_digest(d.text) for d in docs])
    assert [f[0] for f in found] == [d.docid for d in docs]
    assert verify_store(tmp_path / "s", texts=((d.docid, d.text) for d in docs)) == []


def assert_same_ranking(ranker, query: str, stored: list[dict], direct: list[dict]) -> None:
    """Scores through stored and direct representations agree to float16 precision, and order every pair the
    same way unless the two scores are closer than that precision (a tie either way)."""
    qs = ranker.encode_query(query)
    got = ranker.score(qs, [{k: torch.from_numpy(v) for k, v in d.items()} for d in stored]).numpy()
    want = ranker.score(qs, [{k: v.half() for k, v in d.items()} for d in direct]).numpy()
    scale = float(np.abs(want).max()) or 1.0
    tol = 1e-2 * scale  # float16 steps (2**-11 relative) summed over the interaction's terms
    assert np.abs(got - want).max() <= tol, float(np.abs(got - want).max())
    clear = np.abs(want[:, None] - want[None, :]) > 2 * tol  # pairs that are no near-tie
    same = np.sign(got[:, None] - got[None, :]) == np.sign(want[:, None] - want[None, :])
    assert same[clear].all()


def shard_hashes(store: Path) -> list[str]:
    return [s.sha256 for s in read_manifest(store).shards]


def test_sigkill_midway_then_resume_equals_uninterrupted(collection, checkpoints, tmp_path):
    ref = tmp_path / "ref"
    build_store(
        BuildOptions(
            str(checkpoints["mores"]), str(collection), str(ref), shard_size=20, batch_size=2, progress=False
        )
    )
    target = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "aheadrank.cli",
        "index",
        "--checkpoint",
        str(checkpoints["mores"]),
        "--collection",
        str(collection),
        "--store",
        str(target),
        "--shard-size",
        "20",
        "--batch-size",
        "2",
        "--no-progress",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    killed_at = None
    for _attempt in range(3):  # bounded: kill after the first finished shard, before the last
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            manifest = target / "manifest.json"
            if manifest.exists():
                data = json.loads(manifest.read_text())
                if not data["complete"] and len(data["shards"]) >= 2:
                    proc.send_signal(signal.SIGKILL)
                    killed_at = len(data["shards"])
                    break
            time.sleep(0.01)
        proc.wait(timeout=60)
        if killed_at:
            break
    assert killed_at, "the build finished before it could be killed"
    assert not json.loads((target / "manifest.json").read_text())["complete"]
    with pytest.raises(StoreError, match="interrupted|incomplete|resume"):
        StoreReader(target)
    summary = build_store(
        BuildOptions(
            str(checkpoints["mores"]),
            str(collection),
            str(target),
            shard_size=20,
            batch_size=2,
            progress=False,
        )
    )
    assert summary.shards_reused >= 2 and summary.documents == 230
    # the throughput counts what this run encoded, not the shards it found finished
    assert summary.documents_reused == min(20 * summary.shards_reused, 230)  # shards of 20, the last of 10
    assert summary.docs_per_s == pytest.approx((230 - summary.documents_reused) / summary.seconds)
    assert shard_hashes(target) == shard_hashes(ref)  # exactly the same store
    assert verify_store(target) == []
    a, b = read_all(ref), read_all(target)
    assert list(a) == list(b)
    assert all(np.array_equal(a[d][f], b[d][f]) for d in a for f in a[d])


@pytest.mark.parametrize("dtype", ["float16", "book4"])
def test_local_dask_cluster_builds_the_same_store(collection, checkpoints, tmp_path, dtype):
    """Byte for byte; a codebook store's shards fit their codebooks on their own workers, deterministically."""
    local, dask = tmp_path / "local", tmp_path / "dask"
    common = {"shard_size": 50, "progress": False, "dtype": dtype}
    build_store(BuildOptions(str(checkpoints["tk"]), str(collection), str(local), **common))
    summary = build_store(
        BuildOptions(str(checkpoints["tk"]), str(collection), str(dask), workers=2, **common)
    )
    assert summary.documents == 230 and summary.shards == 5
    assert shard_hashes(dask) == shard_hashes(local)  # text digests included
    assert verify_store(dask) == [] and read_manifest(dask).text_digest


def test_dask_says_only_its_warnings_unless_aheadrank_logs_at_debug():
    import logging

    from aheadrank.indexer.build import quiet_dask

    dask_log, ours = logging.getLogger("distributed"), logging.getLogger("aheadrank")
    before = (dask_log.level, ours.level)
    try:
        dask_log.setLevel(logging.INFO)  # what Dask's own configuration sets on import
        ours.setLevel(logging.INFO)
        with quiet_dask():
            assert not logging.getLogger("distributed.scheduler").isEnabledFor(logging.INFO)
            assert logging.getLogger("distributed.nanny").isEnabledFor(logging.WARNING)
        assert dask_log.level == logging.INFO  # given back
        ours.setLevel(logging.DEBUG)
        with quiet_dask():
            assert logging.getLogger("distributed.scheduler").isEnabledFor(logging.INFO)
    finally:
        dask_log.setLevel(before[0])
        ours.setLevel(before[1])


def test_refuses_a_store_of_another_checkpoint_or_options(collection, checkpoints, tmp_path):
    store = tmp_path / "s"
    build_store(
        BuildOptions(str(checkpoints["mores"]), str(collection), str(store), shard_size=100, progress=False)
    )
    with pytest.raises(StoreError, match="built by checkpoint"):
        build_store(
            BuildOptions(
                str(checkpoints["mores-b"]), str(collection), str(store), shard_size=100, progress=False
            )
        )
    with pytest.raises(StoreError, match="other options"):
        build_store(
            BuildOptions(
                str(checkpoints["mores"]), str(collection), str(store), shard_size=50, progress=False
            )
        )
    with pytest.raises(StoreError, match="other options"):
        build_store(
            BuildOptions(
                str(checkpoints["mores"]),
                str(collection),
                str(store),
                shard_size=100,
                strategy="s1",
                progress=False,
            )
        )
    again = build_store(
        BuildOptions(str(checkpoints["mores"]), str(collection), str(store), shard_size=100, progress=False)
    )
    assert again.shards_reused == 3  # a complete store is reused as it is
    assert again.documents_reused == again.documents and again.docs_per_s == 0.0  # nothing encoded
    summary = build_store(
        BuildOptions(
            str(checkpoints["mores-b"]),
            str(collection),
            str(store),
            shard_size=100,
            overwrite=True,
            progress=False,
        )
    )
    assert summary.shards_reused == 0
    assert read_manifest(store).spec.fields == {"k1": 32, "v1": 32}
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.tex").write_text("do not delete")
    with pytest.raises(StoreError, match="not a store"):
        build_store(
            BuildOptions(
                str(checkpoints["tk"]),
                str(collection),
                str(tmp_path / "precious"),
                overwrite=True,
                progress=False,
            )
        )
    assert (tmp_path / "precious" / "thesis.tex").exists()


def test_a_store_goes_on_in_its_own_shards_and_its_dense_field_shares_them(
    collection, checkpoints, tmp_path, monkeypatch
):
    """Without --shard-size a new store is cut into DEFAULT_SHARD_SIZE documents a shard; a store being resumed
    keeps the size it began with (a build begun under another default goes on instead of being refused); the
    dense field is cut as its store, and a dense field cut otherwise is refused with the size to give."""
    import aheadrank.indexer.build as ib
    from aheadrank.indexer.build import build_dense

    from aheadrank.rerank import open_dense_field

    monkeypatch.setattr(ib, "DEFAULT_SHARD_SIZE", 64)
    ckpt = str(checkpoints["mores"])
    new = tmp_path / "new"
    build_store(BuildOptions(ckpt, str(collection), str(new), progress=False))
    assert [s.n_docs for s in read_manifest(new).shards] == [64, 64, 64, 38]  # 230 documents
    old = tmp_path / "old"
    build_store(BuildOptions(ckpt, str(collection), str(old), shard_size=100, progress=False))
    whole = read_all(old)
    (old / read_manifest(old).shards[1].file).unlink()  # a stop: the second shard is gone
    resumed = build_store(BuildOptions(ckpt, str(collection), str(old), progress=False))
    manifest = read_manifest(old)
    assert resumed.shards_reused == 2 and manifest.complete and manifest.spec.shard_size == 100
    got = read_all(old)
    assert got.keys() == whole.keys()
    assert all(np.array_equal(got[d][k], whole[d][k]) for d in whole for k in whole[d])
    build_dense(BuildOptions(ckpt, str(collection), str(old), progress=False))
    dense = read_manifest(old / "dense")
    assert [s.n_docs for s in dense.shards] == [100, 100, 30]
    with StoreReader(old) as main:
        field = open_dense_field(old, dense.spec.fingerprint, main)
        assert field is not None and len(field) == 230
        field.close()
    with pytest.raises(StoreError, match="--shard-size 100"):
        build_dense(BuildOptions(ckpt, str(collection), str(new), progress=False), reuse=old / "dense")
    build_store(BuildOptions(ckpt, str(collection), str(old), overwrite=True, progress=False))
    assert read_manifest(old).spec.shard_size == 64  # started over: the default


def test_index_cli_reports_errors_without_traceback(collection, checkpoints, tmp_path):
    from typer.testing import CliRunner

    from aheadrank.cli import app

    runner = CliRunner()
    res = runner.invoke(
        app,
        [
            "index",
            "--checkpoint",
            str(checkpoints["tk"]),
            "--collection",
            str(collection),
            "--store",
            str(tmp_path / "s"),
            "--shard-size",
            "100",
            "--no-progress",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "stored 230 documents" in res.output
    res = runner.invoke(
        app,
        [
            "index",
            "--checkpoint",
            str(tmp_path / "nope"),
            "--collection",
            str(collection),
            "--store",
            str(tmp_path / "s2"),
        ],
    )
    assert res.exit_code == 2 and "does not exist" in res.output
    res = runner.invoke(
        app,
        [
            "index",
            "--checkpoint",
            str(checkpoints["tk"]),
            "--collection",
            str(collection),
            "--store",
            str(tmp_path / "s3"),
            "--strict",
        ],
    )
    assert res.exit_code == 2 and "corpus.jsonl:231" in res.output
    assert torch.get_num_threads() >= 1


def test_the_progress_bar_counts_down_the_documents_left_where_they_were_counted(
    collection, checkpoints, tmp_path, monkeypatch
):
    """Given the collection's documents (aheadrank build's collection stage, index's room check), the bar's total is
    those the build has still to encode (a resumed store's shards not counted); unknown for passages, which are
    not one a document, and for a caller that did not count."""
    import aheadrank.indexer.build as indexing
    from aheadrank.indexer.build import build_dense, build_passages

    totals = []
    real = indexing._progress
    monkeypatch.setattr(
        indexing, "_progress", lambda enabled, total=None: totals.append(total) or real(False)
    )
    store = tmp_path / "s"
    opts = BuildOptions(str(checkpoints["tk"]), str(collection), str(store), shard_size=100, documents=230)
    build_store(opts)
    build_store(opts)  # complete: nothing left
    build_passages(opts)
    build_dense(opts)
    build_store(BuildOptions(str(checkpoints["tk"]), str(collection), str(tmp_path / "s2"), shard_size=100))
    assert totals == [230, 0, None, 230, None]
    assert indexing.collection_size(collection) == (230, pytest.approx(2 + 25.5, abs=3))


def test_codebook_store_holds_each_values_nearest_level(collection, checkpoints, tmp_path):
    """`aheadrank index --dtype book4` through the build: every stored value is the level of its shard's codebook
    nearest to the value the float16 build stores (the same float16 encodings, coded at the shard's write)."""
    from aheadrank.store.shard import read_shard_meta

    common = {"shard_size": 100, "batch_size": 16, "progress": False}
    ckpt, coll = str(checkpoints["prettr"]), str(collection)
    build_store(BuildOptions(ckpt, coll, str(tmp_path / "f16"), **common))
    summary = build_store(BuildOptions(ckpt, coll, str(tmp_path / "b4"), dtype="book4", **common))
    assert summary.documents == 230 and summary.shards == 3
    manifest = read_manifest(tmp_path / "b4")
    assert manifest.spec.dtype == "book4" and verify_store(tmp_path / "b4") == []
    books = [read_shard_meta(tmp_path / "b4" / s.file, manifest.spec).books["doc"] for s in manifest.shards]
    plain, coded = read_all(tmp_path / "f16"), read_all(tmp_path / "b4")
    assert list(coded) == list(plain)
    for i, docid in enumerate(plain):
        x = plain[docid]["doc"].astype(np.float32)
        levels = books[i // 100]
        nearest = np.take_along_axis(
            levels[None], np.abs(x[:, :, None] - levels[None]).argmin(-1)[..., None], -1
        )
        want = np.abs(nearest[..., 0].astype(np.float16).astype(np.float32) - x)
        assert np.allclose(np.abs(coded[docid]["doc"].astype(np.float32) - x), want, atol=1e-6), docid
