"""Long documents stored as passages (``aheadrank index --passages``, store/passages.py): a long document asked for
by docid, by its stored text or by rerank-run scores as its text sent ad hoc (split online) does; short documents
are unaffected; verify-store covers passages/; a server that would split otherwise than the store is refused."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from aheadrank.services import create_app
from aheadrank.services.backend import RerankBackend, StageClock
from aheadrank.services.settings import ServiceSettings
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from aheadrank.errors import AheadrankError, StoreError
from aheadrank.passages import aggregate, split_passages

QUERY = "smoking increases the risk of lung cancer"
WINDOW = 32  # the store's --max-doc-len: the checkpoint reads 128, so the server adopts the store's window
LONG = "long#p1"  # a docid holding the passage separator: its passages are long#p1#p0, long#p1#p1, ...


@pytest.fixture(scope="module")
def collection(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    from conftest import WORDS

    rng = random.Random(5)
    docs = {f"d{i}": " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 20))) for i in range(6)}
    docs[LONG] = " ".join(rng.choice(WORDS) for _ in range(5 * WINDOW))
    path = tmp_path_factory.mktemp("passages") / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": d, "title": "", "text": t}) + "\n" for d, t in docs.items()))
    return path, docs


@pytest.fixture(scope="module")
def stores(collection, tiny_base, tmp_path_factory) -> dict[str, Path]:
    """A tiny MORES checkpoint, its store built with --passages and one built without."""
    from aheadrank.indexer.build import BuildOptions, build_store
    from aheadrank.rankers import init_ranker, save_checkpoint

    from aheadrank.cli import app

    root = tmp_path_factory.mktemp("passage-stores")
    ckpt = root / "ckpt"
    save_checkpoint(init_ranker("mores", base=tiny_base, seed=0, ibs=2, sim=False), ckpt)
    out = {"checkpoint": ckpt, "plain": root / "plain", "passages": root / "passages"}
    build_store(
        BuildOptions(str(ckpt), str(collection[0]), str(out["plain"]), max_doc_len=WINDOW, progress=False)
    )
    args = [
        "index",
        "--checkpoint",
        str(ckpt),
        "--collection",
        str(collection[0]),
        "--store",
        str(out["passages"]),
    ]
    result = CliRunner().invoke(app, [*args, "--max-doc-len", str(WINDOW), "--passages", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "passages of long documents" in result.output
    info = CliRunner().invoke(app, ["store-info", str(out["passages"])])
    assert "window 32, overlap 8, at most 10 a document: 1 documents, " in info.output, info.output
    return out


def load(stores, store: str = "passages", **settings) -> RerankBackend:
    s = ServiceSettings(
        checkpoint=stores["checkpoint"], store=stores[store], device="cpu", access_log=False, **settings
    )
    backend = RerankBackend.load(s)
    backend.warmup()
    return backend


@pytest.fixture(scope="module")
def backend(stores):
    b = load(stores)
    yield b
    b.close()


def by_docid(backend, ids: list[str]) -> dict[str, float]:
    return {d: s for d, s, _ in backend.rerank(QUERY, ids, len(ids), None, 0.0, StageClock()).ranked}


def passages_of(backend, text: str) -> list[str]:
    return split_passages(backend.ranker._text().tokenizer, [text], backend.passage_options())[0]


def test_a_long_document_scores_as_its_text_sent_ad_hoc(backend, collection, monkeypatch):
    docs = collection[1]
    assert backend.max_doc_len() == WINDOW and backend.info()["model"]["passage_window"] == WINDOW
    parts = passages_of(backend, docs[LONG])
    assert len(parts) > 2 and backend.passages.counts == {LONG: len(parts)}  # short documents: no passages
    stored = by_docid(backend, list(docs))[LONG]
    # the same text by text lookup: the store's passages, as the docid
    (looked_up,), _ = backend.score_texts(QUERY, [docs[LONG]])
    assert looked_up == pytest.approx(stored, rel=1e-6, abs=1e-6)
    # the same text unknown to the store: split and encoded online (float32, not the store's float16)
    monkeypatch.setattr(backend.reader, "text_shards", 0)
    (ad_hoc,), _ = backend.score_texts(QUERY, [docs[LONG]])
    direct = backend.ranker.score_pairs(QUERY, parts).tolist()
    scale = max(abs(s) for s in direct)
    assert ad_hoc == pytest.approx(aggregate(direct, [0] * len(parts), 1, "first+max")[0], abs=1e-4 * scale)
    assert stored == pytest.approx(ad_hoc, abs=5e-3 * scale)
    # the first window alone (what the store served before) would score otherwise
    assert abs(direct[0] - stored) > 2e-2 * scale


def test_rerank_run_scores_long_documents_by_their_passages(backend, stores, collection):
    from aheadrank.runs import rerank_run

    ids = list(collection[1])
    run, _ = rerank_run(
        stores["checkpoint"], stores["passages"], {"q": QUERY}, {"q": [(d, 0.0) for d in ids]}, progress=False
    )
    assert run["q"] == pytest.approx(by_docid(backend, ids), rel=1e-6, abs=1e-6)


def test_short_documents_are_unaffected(backend, stores, collection):
    plain = load(stores, "plain")
    try:
        assert plain.passages is None
        ids = list(collection[1])
        short = [d for d in ids if d != LONG]
        assert by_docid(backend, short) == by_docid(plain, short)  # the same fields, the same batch
        with_long = by_docid(backend, ids)
        assert {d: with_long[d] for d in short} == pytest.approx(by_docid(plain, short), rel=1e-5)
        assert with_long[LONG] != pytest.approx(by_docid(plain, [LONG])[LONG], rel=1e-2)
    finally:
        plain.close()


def test_verify_store_covers_the_passages(stores, tmp_path):
    from aheadrank.store.verify import verify_store

    assert verify_store(stores["passages"]) == []
    damaged = tmp_path / "damaged"
    shutil.copytree(stores["passages"], damaged)
    shard = damaged / "passages" / "shard-00000.h5"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0xFF  # one byte of a passage's stored values, the size kept
    shard.write_bytes(bytes(data))
    problems = verify_store(damaged)
    assert len(problems) == 1 and problems[0].startswith("passages/shard-00000.h5: sha256 mismatch"), problems
    shutil.rmtree(damaged / "passages")
    assert any("passages/: missing" in p for p in verify_store(damaged))
    with pytest.raises(StoreError, match="built with --passages, but .* is missing"):
        RerankBackend.load(ServiceSettings(checkpoint=stores["checkpoint"], store=damaged, access_log=False))


def test_a_server_that_would_split_otherwise_is_refused(stores):
    with pytest.raises(StoreError, match="overlap by 8 word pieces.*--passage-overlap 8"):
        load(stores, passage_overlap=3)
    with pytest.raises(StoreError, match="at most 10 passages a document.*--max-chunks-per-doc 10"):
        load(stores, max_chunks_per_doc=12)


def test_the_default_aggregation_is_the_mean_of_the_first_and_the_best_passage(backend, collection):
    """/rerank with one long text unknown to the store: its score is first+max of its passages' own scores."""
    from conftest import WORDS

    rng = random.Random(9)
    text = " ".join(rng.choice(WORDS) for _ in range(4 * WINDOW))
    parts = passages_of(backend, text)
    direct = backend.ranker.score_pairs(QUERY, parts).tolist()
    assert max(direct) != direct[0]  # else first+max could not be told from the first passage or MaxP
    with TestClient(create_app(backend)) as c:
        r = c.post("/rerank", json={"query": QUERY, "documents": [text], "raw_scores": True})
    assert r.status_code == 200, r.text
    scale = max(abs(s) for s in direct)
    assert r.json()["results"][0]["relevance_score"] == pytest.approx(
        (direct[0] + max(direct)) / 2, abs=1e-4 * scale
    )


def test_the_aggregation_the_priors_were_fitted_with_is_served_unless_told(
    backend, stores, collection, tmp_path
):
    """A checkpoint whose priors record MaxP (a label-free build's) serves long texts by MaxP, /v1/info says so,
    and --passage-aggregation still decides; priors without the record (fitted before it) mean first+max."""
    from aheadrank.rankers.checkpoint import write_priors
    from conftest import WORDS

    from aheadrank.passages import served_aggregation
    from aheadrank.priors import PRIORS_FILE, Priors, recorded_aggregation

    ckpt = shutil.copytree(stores["checkpoint"], tmp_path / "ckpt")
    priors = Priors(weights={"neural": {"neural": 1.0}}, fitted_on={"passage_aggregation": "maxp"})
    write_priors(
        ckpt, priors.to_dict()
    )  # recorded in the checkpoint's fingerprint.json, as fit-priors writes it
    assert served_aggregation(None, priors) == "maxp" and served_aggregation("meanp", priors) == "meanp"
    assert served_aggregation(None, Priors(weights=priors.weights)) == "first+max" == served_aggregation(None)
    with pytest.raises(ValueError, match="unknown passage aggregation 'best'"):
        served_aggregation("best")
    rng = random.Random(9)
    text = " ".join(rng.choice(WORDS) for _ in range(4 * WINDOW))
    direct = backend.ranker.score_pairs(QUERY, passages_of(backend, text)).tolist()
    assert max(direct) != (direct[0] + max(direct)) / 2
    scale = max(abs(s) for s in direct)
    for given, expect in ((None, max(direct)), ("first+max", (direct[0] + max(direct)) / 2)):
        settings = {"passage_aggregation": given} if given else {}
        served = load({**stores, "checkpoint": ckpt}, priors=False, **settings)
        try:
            assert served.settings.passage_aggregation == (given or "maxp")
            with TestClient(create_app(served)) as c:
                assert c.get("/v1/info").json()["model"]["passage_aggregation"] == (given or "maxp")
                r = c.post("/rerank", json={"query": QUERY, "documents": [text], "raw_scores": True})
            assert r.json()["results"][0]["relevance_score"] == pytest.approx(expect, abs=1e-4 * scale)
        finally:
            served.close()
    # a damaged priors.json: an error where the priors are used, the default where they are not
    (ckpt / PRIORS_FILE).write_text("{")
    assert recorded_aggregation(None, ckpt, with_priors=False) == "first+max"
    with pytest.raises(AheadrankError, match="not valid priors JSON"):
        recorded_aggregation(None, ckpt)


def test_cohere_limits_read_a_stored_document_as_they_read_its_text(backend, collection, monkeypatch):
    """max_chunks_per_doc: its first stored passages; max_tokens_per_doc shorter than it: cut and split online."""
    text = collection[1][LONG]
    limits = [backend.passage_options(max_chunks=3), backend.passage_options(max_tokens=150)]
    limits.append(backend.passage_options(cut=True))  # TEI's truncate: true
    stored = [backend.score_texts(QUERY, [text], passages=p)[0][0] for p in limits]
    monkeypatch.setattr(backend.reader, "text_shards", 0)
    ad_hoc = [backend.score_texts(QUERY, [text], passages=p)[0][0] for p in limits]
    scale = max(abs(s) for s in ad_hoc)
    assert stored == pytest.approx(ad_hoc, abs=5e-3 * scale)
    (whole,), _ = backend.score_texts(QUERY, [text])
    assert all(abs(s - whole) > 2e-2 * scale for s in ad_hoc)  # each limit reads less than the whole document


def _poke(file: Path, value: bytes) -> None:
    """Overwrite the first stored value of ``file``'s first field (size and mtime kept)."""
    import os

    import h5py

    with h5py.File(file, "r") as h5:
        name = next(iter(h5["fields"]))
        at = int(h5["fields"][name].id.get_offset())
    st = os.stat(file)
    with open(file, "r+b") as fh:
        fh.seek(at)
        fh.write(value)
    os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_damaged_passages_are_refused_like_the_store(stores, collection, tmp_path):
    """A finite change in passages/ before start: --verify-store start names it; a NaN in a stored passage: the
    long document's requests get 503 naming passages/'s shard, the other documents are still served."""
    store = Path(shutil.copytree(stores["passages"], tmp_path / "store"))
    shard = store / "passages" / "shard-00000.h5"
    _poke(shard, b"\x01\x3c")  # float16 1.0 + one step: finite
    s = ServiceSettings(checkpoint=stores["checkpoint"], store=store, access_log=False, verify_store="start")
    backend = RerankBackend.load(s)
    try:
        with pytest.raises(StoreError, match="refusing to start.*passages/shard-00000"):
            backend.verify_at_start()
    finally:
        backend.close()
    _poke(shard, b"\x00\x7e")  # float16 NaN
    s = ServiceSettings(checkpoint=stores["checkpoint"], store=store, access_log=False, verify_store="off")
    backend = RerankBackend.load(s)
    backend.ready = True  # without the warm-up, which would score the damaged passage itself
    short = [d for d in collection[1] if d != LONG]
    try:
        with TestClient(create_app(backend)) as c:
            r = c.post("/v1/rerank", json={"query": QUERY, "candidates": [LONG, *short]})
            assert r.status_code == 503 and r.json()["kind"] == "store_damaged", r.text
            assert "passages/shard-00000" in r.json()["error"]
            assert c.post("/v1/rerank", json={"query": QUERY, "candidates": short}).status_code == 200
    finally:
        backend.close()


def test_collect_features_scores_a_stored_long_document_by_the_aggregation_it_is_given(stores, collection):
    """bench/label_free.py --aggregation: the validation / measurement path aggregates passages as asked; short
    documents are scored as themselves whatever the aggregation."""
    from aheadrank.rerank import collect_features

    docids = [LONG, *[d for d in collection[1] if d != LONG]]
    cands = {"q": [(d, float(len(docids) - i)) for i, d in enumerate(docids)]}
    got = {}
    for how in ("maxp", "meanp", "first+max"):
        (f,), _ = collect_features(
            stores["checkpoint"], stores["passages"], {"q": QUERY}, cands, {"q": {"d0": 1}}, aggregation=how
        )
        got[how] = dict(zip(f.docids, f.features["neural"].tolist(), strict=True))
    long = {how: s[LONG] for how, s in got.items()}
    assert long["maxp"] > long["meanp"]  # five windows of random words do not all score alike
    assert long["first+max"] <= long["maxp"] and long["first+max"] != long["meanp"]
    for d in docids[1:]:
        assert got["maxp"][d] == got["meanp"][d] == got["first+max"][d]
