"""The window prior (``STORE/windows``, store/windows.py): each multi-sentence document's 2-sentence windows
embedded by the bi-encoder, served as the best window's cosine beside the dense field; guarded like the dense
field: a store that records windows is refused while ``windows/`` is missing, incomplete, cut otherwise, from
another collection or by another encoder; ``verify-store`` checks it. In-process (a TestClient), no network."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import faults_testkit  # noqa: F401  (puts the other testkits on sys.path)
import numpy as np
import pytest
from aheadrank.indexer.build import (
    BuildOptions,
    WindowCollection,
    build_dense,
    build_store,
    build_windows,
    ensure_dense_field,
    ensure_window_field,
    get_ranker,
)
from aheadrank.indexer.collections import Collection
from aheadrank.indexer.pseudo_queries import sentence_passages
from aheadrank.services.app import create_app
from aheadrank.services.backend import RerankBackend
from aheadrank.services.settings import ServiceSettings
from aheadrank.store import read_manifest, verify_store
from aheadrank.store.manifest import write_manifest_file
from fastapi.testclient import TestClient
from faults_testkit import write_jsonl
from typer.testing import CliRunner

from aheadrank.build import label_free_weights
from aheadrank.cli import app
from aheadrank.errors import StoreError

WORDS = "gene cell tumour protein cancer mouse dose risk trial blood brain heart lung liver kidney".split()


def _docs(seed: int = 3) -> list[dict]:
    """25 titled documents of 1-5 sentences: some one window, most several."""
    rng = np.random.default_rng(seed)
    docs = []
    for i in range(25):
        sentences = [" ".join(rng.choice(WORDS, size=rng.integers(4, 9))) for _ in range(1 + i % 5)]
        docs.append(
            {"_id": f"d{i}", "title": f"on {WORDS[i % len(WORDS)]}", "text": ". ".join(sentences) + "."}
        )
    return docs


@pytest.fixture(scope="module")
def checkpoint(tiny_base, tmp_path_factory) -> Path:
    """A TK checkpoint whose priors weigh the window prior (the label-free weights of a store with windows)."""
    from aheadrank.rankers import init_ranker, save_checkpoint
    from aheadrank.rankers.checkpoint import write_priors

    path = tmp_path_factory.mktemp("ckpt") / "tk"
    save_checkpoint(init_ranker("tk", base=tiny_base, max_doc_len=32, tk_heads=4), path)
    dense = get_ranker(str(path), None, "cpu", None, "dense")
    write_priors(
        path,
        {
            "weights": label_free_weights("tk", window=True),
            "normalisation": "zscore",
            "dense": {"fingerprint": dense.fingerprint, "max_len": 256},
        },
    )
    return path


def _opts(checkpoint: Path, coll: Path, store: Path, **kw) -> BuildOptions:
    # the default shard size, as aheadrank build's: the collection fingerprint that binds windows/ is per shard
    return BuildOptions(str(checkpoint), str(coll), str(store), progress=False, **kw)


def _field(checkpoint: Path, coll: Path, root: Path) -> Path:
    """The collection's window field, as ``aheadrank build``'s dense stage makes it (beside its dense field)."""
    dense, windows = root / "dense-field", root / "window-field"
    base = str(get_ranker(str(checkpoint), None, "cpu", None, "dense").base_dir)
    ensure_dense_field(coll, dense, base, progress=False)
    ensure_window_field(coll, windows, dense, base, 2, progress=False)
    return windows


@pytest.fixture(scope="module")
def built(checkpoint, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(collection, its window field, a complete store with its dense field and windows)."""
    root = tmp_path_factory.mktemp("built")
    coll = write_jsonl(root / "corpus.jsonl", _docs())
    field = _field(checkpoint, coll, root)
    store = root / "store"
    build_store(_opts(checkpoint, coll, store))
    build_dense(_opts(checkpoint, coll, store))
    build_windows(_opts(checkpoint, coll, store), field)
    return coll, field, store


def _backend(checkpoint: Path, store: Path) -> RerankBackend:
    settings = ServiceSettings(
        checkpoint=checkpoint, store=store, warmup=False, access_log=False, verify_store="off"
    )
    return RerankBackend.load(settings)


def test_the_windows_are_those_of_the_documents_of_several_sentences(built):
    coll, _, store = built
    expected = {
        d: len(sentence_passages(t, b, 2))
        for d, t, b in Collection(coll).titled()
        if len(sentence_passages(t, b, 2)) > 1
    }
    got: dict[str, int] = {}
    for doc in WindowCollection(Collection(coll), 2):
        owner = doc.docid.rsplit("#p", 1)[0]
        got[owner] = got.get(owner, 0) + 1
    assert got == expected and 0 < len(got) < 25  # one-window documents have none
    assert read_manifest(store).windows == {"sentences": 2}
    assert verify_store(store) == []
    info = CliRunner().invoke(app, ["store-info", str(store), "--json"])
    assert info.exit_code == 0 and json.loads(info.output)["windows"].startswith(
        f"2 sentences: {len(got)} documents"
    )


def test_the_served_window_score_is_the_best_windows_cosine(built, checkpoint):
    """/v1/rerank over stored candidates reports and weighs each one's best window: the largest cosine of its
    windows' embeddings (computed here from the texts), its dense cosine where it is one window."""
    coll, _, store = built
    titled = {d: (t, b) for d, t, b in Collection(coll).titled()}
    ids = sorted(titled)[:12]
    backend = _backend(checkpoint, store)
    try:
        assert backend.scorer.windows is not None
        backend.ready = True
        with TestClient(create_app(backend)) as client:
            r = client.post("/v1/rerank", json={"query": "tumour cell gene", "candidates": ids})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["scoring"] == "neural+dense+window"  # candidates given: no BM25
            enc = backend.scorer.encoder()
            q = enc.encode_queries(["tumour cell gene"])[0]
            for row in body["results"]:
                windows = sentence_passages(*titled[row["docid"]], 2)
                best = float(np.max(enc.encode_documents(windows) @ q))
                assert row["window_score"] == pytest.approx(best, abs=2e-3)  # float16 stored
                if len(windows) == 1:
                    assert row["window_score"] == row["dense_score"]
            pure = client.post("/v1/rerank", json={"query": "tumour", "candidates": ids, "pure": True}).json()
            assert pure["scoring"] == "neural" and all(x["window_score"] is None for x in pure["results"])
            info = client.get("/v1/info").json()
            assert info["store"]["windows"]["sentences"] == 2 and info["priors"]["windows"] is True
    finally:
        backend.close()


@pytest.mark.parametrize("damage", ["missing", "incomplete", "cut otherwise"])
def test_a_store_whose_windows_are_not_whole_is_refused(built, checkpoint, tmp_path, damage):
    _, _, ref = built
    store = Path(shutil.copytree(ref, tmp_path / "store"))
    sub = store / "windows"
    if damage == "missing":
        shutil.rmtree(sub)
    elif damage == "incomplete":
        m = read_manifest(sub)
        write_manifest_file(sub, type(m)(**{**m.__dict__, "complete": False}))
    else:
        m = read_manifest(store)
        write_manifest_file(store, type(m)(**{**m.__dict__, "windows": {"sentences": 3}}))
    with pytest.raises(StoreError, match=r"missing|incomplete|cut with"):
        _backend(checkpoint, store)
    assert verify_store(store)  # reported, whatever the damage


def test_a_window_field_of_another_collection_is_not_copied_in(built, checkpoint, tmp_path):
    coll, _, ref = built
    other = write_jsonl(tmp_path / "other.jsonl", _docs(seed=9))
    field = _field(checkpoint, other, tmp_path)
    store = Path(shutil.copytree(ref, tmp_path / "store"))
    with pytest.raises(StoreError, match="another collection"):
        build_windows(_opts(checkpoint, coll, store), field)


def test_a_store_without_windows_serves_the_priors_without_them_and_says_so(built, checkpoint, tmp_path):
    coll, _, _ = built
    store = tmp_path / "store"
    build_store(_opts(checkpoint, coll, store))
    build_dense(_opts(checkpoint, coll, store))
    backend = _backend(checkpoint, store)
    try:
        assert backend.scorer.windows is None
        assert any("sentence windows" in n for n in backend.scorer.notices)
    finally:
        backend.close()


def test_aheadrank_index_windows_stores_the_same_windows_as_aheadrank_build(built, checkpoint, tmp_path):
    """``aheadrank index --windows`` (a store built by hand, e.g. from a judged checkpoint): the window field cut
    and embedded inside the store, moved in as ``windows/``, the same entries and vectors as the build's; run
    again it keeps them; without the dense field it is refused before anything is written."""
    from aheadrank.store import StoreReader

    coll, _, ref = built
    store = tmp_path / "store"
    args = ["index", "--checkpoint", str(checkpoint), "--collection", str(coll), "--store", str(store)]
    first = CliRunner().invoke(app, [*args, "--windows", "--no-progress"])
    assert first.exit_code == 0, first.output
    assert "sentence windows in" in first.output
    assert read_manifest(store).windows == {"sentences": 2} and verify_store(store) == []
    assert not (store / ".window-field").exists()
    with StoreReader(ref / "windows") as a, StoreReader(store / "windows") as b:
        ids = a.docids()
        assert ids == b.docids() and len(ids) > 0
        x, y = a.fetch(ids), b.fetch(ids)
        assert x.fields.keys() == y.fields.keys()
        assert all(np.array_equal(x.fields[k], y.fields[k]) for k in x.fields)
    again = CliRunner().invoke(app, [*args, "--windows", "--no-progress"])
    assert again.exit_code == 0 and "sentence windows in" not in again.output
    backend = _backend(checkpoint, store)
    try:
        assert backend.scorer.windows is not None
    finally:
        backend.close()
    # what fit-priors fits on: the window among the validation features
    from aheadrank.rerank import collect_features

    with StoreReader(store) as main:
        docs = main.docids()[:8]
    feats, _ = collect_features(
        checkpoint, store, {"q": "tumour cell gene"}, {"q": [(d, 1.0) for d in docs]}, {"q": {docs[0]: 1}}
    )
    assert {"neural", "dense", "window"} <= set(feats[0].features)
    bare = tmp_path / "bare"
    refused = CliRunner().invoke(
        app,
        ["index", "--checkpoint", str(checkpoint), "--collection", str(coll), "--store", str(bare)]
        + ["--windows", "--no-dense", "--no-progress"],
    )
    assert refused.exit_code == 2 and "--windows needs the dense field" in refused.output
    assert not bare.exists()
