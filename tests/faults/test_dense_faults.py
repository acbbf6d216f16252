"""The dense field (``STORE/dense``) guarded like the store itself (issue 37, items 2-4): verified by
``verify-store``, leased, counted by /ready and the damaged-shards metric, bound to the store's collection;
a build killed in its phase refused at serve start and resumed by a rerun; corruption that happened before
start found by ``--verify-store`` (at start or in the background); no lease is a visible warning.
In-process (a TestClient) except for the one writer that must be another process; bounded, no network."""

from __future__ import annotations

import errno
import shutil
import subprocess
import sys
from pathlib import Path

import faults_testkit  # noqa: F401  (puts the other testkits on sys.path)
import h5py
import numpy as np
import pytest
from aheadrank.indexer.build import DENSE_DIR, BuildOptions, build_dense, build_store, get_ranker
from aheadrank.services.app import create_app
from aheadrank.services.backend import RerankBackend
from aheadrank.services.settings import ServiceSettings
from aheadrank.store import read_manifest, verify_store
from aheadrank.store.manifest import shard_file_name
from fastapi.testclient import TestClient
from faults_testkit import text_docs, wait_for, write_jsonl
from typer.testing import CliRunner

from aheadrank.cli import app
from aheadrank.errors import StoreError

SHARD = 10
N_DOCS = 30


def _docs() -> list[dict]:
    return text_docs(N_DOCS, seed=5)


_write = write_jsonl


@pytest.fixture(scope="module")
def checkpoint(tiny_base, tmp_path_factory) -> Path:
    """A TK checkpoint whose priors use the dense prior (so the served score reads STORE/dense)."""
    from aheadrank.rankers import init_ranker, save_checkpoint
    from aheadrank.rankers.checkpoint import write_priors

    path = tmp_path_factory.mktemp("ckpt") / "tk"
    save_checkpoint(init_ranker("tk", base=tiny_base, max_doc_len=32, tk_heads=4), path)
    dense = get_ranker(str(path), None, "cpu", None, "dense")
    one = {"neural": 1.0, "bm25": 0.5, "dense": 0.5}
    weights = {
        k: {f: one[f] for f in k.split("+")}
        for k in ("neural", "neural+bm25", "neural+dense", "neural+bm25+dense")
    }
    write_priors(
        path,
        {
            "weights": weights,
            "normalisation": "zscore",
            "dense": {"fingerprint": dense.fingerprint, "max_len": 256},
        },
    )
    return path


def _opts(checkpoint: Path, coll: Path, store: Path, **kw) -> BuildOptions:
    return BuildOptions(str(checkpoint), str(coll), str(store), shard_size=SHARD, progress=False, **kw)


@pytest.fixture(scope="module")
def built(checkpoint, tmp_path_factory) -> tuple[Path, Path]:
    """(collection, a complete store of it with its dense field: 3 shards of 10 each)."""
    root = tmp_path_factory.mktemp("built")
    coll = _write(root / "corpus.jsonl", _docs())
    store = root / "store"
    build_store(_opts(checkpoint, coll, store))
    build_dense(_opts(checkpoint, coll, store))
    return coll, store


def _copy(store: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(store, tmp_path / "store"))


def _settings(checkpoint: Path, store: Path, **kw) -> ServiceSettings:
    kw = {"verify_store": "off", **kw}
    return ServiceSettings(checkpoint=checkpoint, store=store, warmup=False, access_log=False, **kw)


_REWRITE = """
import os
def rewrite(f, at):
    st = os.stat(f)
    with open(f, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 1]))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
"""


def _rewrite_in_place(file: Path, offset: int, in_other_process: bool = False) -> None:
    """Change one byte of ``file`` at ``offset`` (its low bit: a float16 value stays finite), same size, and put
    its mtime back: only a lease (while served) or its sha256 can tell."""
    if in_other_process:  # while a lease is held, this open waits for the server to let go
        code = _REWRITE + "import sys\nrewrite(sys.argv[1], int(sys.argv[2]))\n"
        subprocess.run([sys.executable, "-c", code, str(file), str(offset)], check=True, timeout=60)
    else:
        space: dict = {}
        exec(_REWRITE, space)
        space["rewrite"](file, offset)


def _offset(file: Path, dataset: str, row: int = 0) -> int:
    with h5py.File(file, "r") as h5:
        dset = h5[dataset]
        return int(dset.id.get_offset()) + row * dset.dtype.itemsize * int(np.prod(dset.shape[1:], dtype=int))


def _shard_docids(store: Path, shard: int) -> list[str]:
    return [d["_id"] for d in _docs()][shard * SHARD : (shard + 1) * SHARD]


# ---- item 2: dense/ is part of the store ------------------------------------------------------------
def test_verify_store_checks_the_dense_field(built, tmp_path):
    """A docid byte of a dense/ shard changed in place (mtime kept): verify-store STORE names it."""
    _, ref = built
    store = _copy(ref, tmp_path)
    assert verify_store(store) == []
    file = store / DENSE_DIR / shard_file_name(1)
    _rewrite_in_place(file, _offset(file, "docids", row=4))
    problems = verify_store(store)
    assert len(problems) == 1 and problems[0].startswith(f"{DENSE_DIR}/{shard_file_name(1)}: sha256 mismatch")
    res = CliRunner().invoke(app, ["verify-store", str(store)])
    assert res.exit_code == 1 and f"FAILED {DENSE_DIR}/{shard_file_name(1)}" in res.stderr


@pytest.mark.parametrize("change", ["swapped_texts", "renamed_doc"])
def test_dense_field_of_another_collection_is_refused(built, checkpoint, tmp_path, change):
    """dense/ built from another version of the collection (two texts swapped; or one document renamed) is
    refused at start and by verify-store, never served beside the store."""
    coll, ref = built
    docs = _docs()
    if change == "swapped_texts":
        docs[3]["text"], docs[17]["text"] = docs[17]["text"], docs[3]["text"]
    else:
        docs[25]["_id"] = "d25-renamed"
    other = tmp_path / "other"
    build_store(_opts(checkpoint, _write(tmp_path / "other.jsonl", docs), other))
    build_dense(_opts(checkpoint, tmp_path / "other.jsonl", other))
    store = _copy(ref, tmp_path)
    shutil.rmtree(store / DENSE_DIR)
    shutil.copytree(other / DENSE_DIR, store / DENSE_DIR)
    with pytest.raises(StoreError, match="another collection"):
        RerankBackend.load(_settings(checkpoint, store))
    assert any("another collection" in p for p in verify_store(store))


def test_dense_shard_written_while_served_is_refused(built, checkpoint, tmp_path):
    """Another process opens a dense/ shard for writing while served and puts its mtime back: the lease tells,
    so requests that need it are refused (503) and /ready and the metric say so; pure requests, which do not
    read dense/, are still served."""
    _, ref = built
    store = _copy(ref, tmp_path)
    backend = RerankBackend.load(_settings(checkpoint, store))
    assert backend.scorer.dense_reader is not None
    backend.watch()
    backend.ready = True
    if backend.lease_state() != "held":
        backend.close()
        pytest.skip("no file leases on this filesystem")
    ids = _shard_docids(store, 2)
    try:
        with TestClient(create_app(backend)) as client:
            assert (
                client.post("/v1/rerank", json={"query": "cancer", "candidates": ids[:4]}).status_code == 200
            )
            file = store / DENSE_DIR / shard_file_name(2)
            _rewrite_in_place(file, _offset(file, "fields/dense", row=1), in_other_process=True)
            assert wait_for(lambda: client.get("/ready").status_code == 503)
            ready = client.get("/ready").json()
            assert ready["kind"] == "store_damaged" and f"{DENSE_DIR}/{shard_file_name(2)}" in ready["error"]
            r = client.post("/v1/rerank", json={"query": "cancer", "candidates": ids[:4]})
            assert r.status_code == 503 and r.json()["kind"] == "store_damaged", r.text
            assert f"{DENSE_DIR}/{shard_file_name(2)}" in r.json()["error"]
            pure = client.post("/v1/rerank", json={"query": "cancer", "candidates": ids[:4], "pure": True})
            assert pure.status_code == 200, pure.text
            assert "aheadrank_store_damaged_shards 1.0" in client.get("/metrics").text
    finally:
        backend.close()


# ---- item 3: a build killed in the dense phase -------------------------------------------------------
class Killed(BaseException):
    """What a SIGKILL leaves, in-process: nothing after this point runs (no cleanup that catches Exception)."""


@pytest.mark.parametrize("kill_at", [0, 2])
def test_build_killed_in_the_dense_phase_is_refused_then_resumed(
    built, checkpoint, tmp_path, monkeypatch, kill_at
):
    """`aheadrank index` dies while writing dense shard ``kill_at`` (0: before dense/ has a manifest; 2: after
    two finished shards): the store is refused at serve start (not served without the prior), verify-store says
    why, and a rerun encodes only the dense shards that were not finished, to the same bytes."""
    import aheadrank.store as store_pkg

    coll, ref = built
    store = tmp_path / "store"
    real = store_pkg.write_shard
    dense_written: list[int] = []
    kill = [True]

    def dying(path, index, *a, **k):
        if Path(path).name == DENSE_DIR:
            if index == kill_at and kill[0]:
                raise Killed()
            dense_written.append(index)
        return real(path, index, *a, **k)

    monkeypatch.setattr(store_pkg, "write_shard", dying)
    args = ["index", "--checkpoint", str(checkpoint), "--collection", str(coll), "--store", str(store),
            "--shard-size", str(SHARD), "--no-progress"]  # fmt: skip
    with pytest.raises(Killed):
        CliRunner().invoke(app, args, catch_exceptions=False)
    assert read_manifest(store).complete  # the ranker's store is done ...
    with pytest.raises(StoreError, match="built with the dense field.*resume"):
        RerankBackend.load(_settings(checkpoint, store))  # ... but the store is not
    assert any(p.startswith(f"{DENSE_DIR}/") for p in verify_store(store))
    dense_written.clear()
    kill[0] = False
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert dense_written == list(range(kill_at, 3))  # finished dense shards reused, not re-encoded
    want = [s.sha256 for s in read_manifest(ref / DENSE_DIR).shards]
    assert [s.sha256 for s in read_manifest(store / DENSE_DIR).shards] == want
    assert verify_store(store) == []
    backend = RerankBackend.load(_settings(checkpoint, store))
    try:
        assert backend.scorer.dense_reader is not None
    finally:
        backend.close()


def test_no_dense_build_serves_without_the_prior_and_says_so(built, checkpoint, tmp_path):
    coll, _ = built
    store = tmp_path / "store"
    args = ["index", "--checkpoint", str(checkpoint), "--collection", str(coll), "--store", str(store),
            "--shard-size", str(SHARD), "--no-progress", "--no-dense"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0 and "--no-dense" in res.output, res.output
    assert read_manifest(store).dense is False and verify_store(store) == []
    backend = RerankBackend.load(_settings(checkpoint, store))
    try:
        assert backend.scorer.dense_reader is None
        assert any("built with --no-dense" in w for w in backend.warnings)
    finally:
        backend.close()


# ---- item 4: corruption before start; no lease -----------------------------------------------------
@pytest.mark.parametrize("where", ["store", "dense"])
def test_corruption_before_start_is_found_at_start(built, checkpoint, tmp_path, where):
    """A finite change (one low bit of a stored value, mtime kept) made while the server was down: with
    --verify-store start the server refuses to start, naming the shard."""
    _, ref = built
    store = _copy(ref, tmp_path)
    sub = store / DENSE_DIR if where == "dense" else store
    file = sub / shard_file_name(0)
    name = "fields/dense" if where == "dense" else f"fields/{next(iter(read_manifest(store).spec.fields))}"
    _rewrite_in_place(file, _offset(file, name, row=3))
    backend = RerankBackend.load(_settings(checkpoint, store, verify_store="start"))
    try:
        with pytest.raises(
            StoreError, match=rf"refusing to start.*{'dense/' if where == 'dense' else ''}shard-00000"
        ):
            backend.verify_at_start()
    finally:
        backend.close()


def test_corruption_before_start_is_found_in_the_background(built, checkpoint, tmp_path):
    """The same on a main-store shard's offsets (another dataset than values), --verify-store background: the
    server serves at once, /ready reports the verification, then refuses the shard once it is found."""
    _, ref = built
    store = _copy(ref, tmp_path)
    file = store / shard_file_name(1)
    _rewrite_in_place(file, _offset(file, "offsets", row=2))
    backend = RerankBackend.load(_settings(checkpoint, store, verify_store="background"))
    backend.ready = True
    try:
        with TestClient(create_app(backend)) as client:
            assert wait_for(lambda: client.get("/ready").status_code == 503, timeout=30)
            ready = client.get("/ready").json()
            assert (
                ready["kind"] == "store_damaged"
                and f"{shard_file_name(1)}: sha256 mismatch" in ready["error"]
            )
            ok = client.post("/v1/rerank", json={"query": "gene", "candidates": _shard_docids(store, 0)[:5]})
            assert ok.status_code == 200, ok.text
            bad = client.post("/v1/rerank", json={"query": "gene", "candidates": _shard_docids(store, 1)[:2]})
            assert bad.status_code == 503 and bad.json()["kind"] == "store_damaged"
            # the pass goes on past the refused shard: its end state once the last shard is read (a busy machine
            # was still at "running" here)
            assert wait_for(
                lambda: client.get("/v1/info").json()["store"]["verification"]["state"] != "running", 30
            )
            info = client.get("/v1/info").json()["store"]["verification"]
            assert info["state"] == "failed" and info["shards_done"] == info["shards_total"] == 6
            assert list(info["refused"]) == [shard_file_name(1)]
    finally:
        backend.close()


def test_metrics_say_the_store_is_leased_and_verified_without_a_ready_probe(built, checkpoint, tmp_path):
    """The store's gauges were set only by /ready: a Prometheus that scrapes /metrics alone read leased 0 and
    verified 0 for a leased, verified store (and would have alerted)."""
    _, ref = built
    store = _copy(ref, tmp_path)
    backend = RerankBackend.load(_settings(checkpoint, store, verify_store="start"))
    backend.watch()
    backend.verify_at_start()
    backend.ready = True
    try:
        with TestClient(create_app(backend)) as client:
            text = client.get("/metrics").text
            assert "aheadrank_store_leased 1.0" in text and "aheadrank_store_verified_ratio 1.0" in text, text
            assert "aheadrank_store_damaged_shards 0.0" in text
    finally:
        backend.close()


def test_no_lease_is_a_visible_warning(built, checkpoint, tmp_path, monkeypatch, caplog):
    import fcntl

    _, ref = built
    store = _copy(ref, tmp_path)
    real = fcntl.fcntl

    def no_leases(fd, cmd, *a):
        if cmd == 1024:  # F_SETLEASE: as on a filesystem without leases, or shards owned by another user
            raise OSError(errno.EACCES, "Permission denied")
        return real(fd, cmd, *a)

    monkeypatch.setattr(fcntl, "fcntl", no_leases)
    backend = RerankBackend.load(_settings(checkpoint, store, verify_store="start"))
    with caplog.at_level("WARNING", logger="aheadrank.store"):
        backend.watch()
    assert any(r.levelname == "WARNING" and "no file lease" in r.getMessage() for r in caplog.records)
    backend.verify_at_start()  # a sound store verifies
    backend.ready = True
    try:
        with TestClient(create_app(backend)) as client:
            ready = client.get("/ready")
            assert ready.status_code == 200 and ready.json()["store"]["lease"] == "none"
            assert ready.json()["store"]["verification"]["state"] == "verified"
            info = client.get("/v1/info").json()
            assert info["store"]["lease"] == "none"
            assert any("no file lease" in w and DENSE_DIR in w for w in info["warnings"])
            assert "aheadrank_store_leased 0.0" in client.get("/metrics").text
    finally:
        backend.close()
