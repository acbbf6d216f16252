"""Ad-hoc texts (services/texts.py): texts the store holds are looked up, not encoded, and score exactly as their
docids; unknown texts are encoded once and cached within bounds; a store without text digests still serves."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from aheadrank.services import create_app
from aheadrank.services.metrics import sample_sum
from aheadrank.services.texts import Encoded, TextCache
from fastapi.testclient import TestClient
from test_service_api import QUERY, make_backend

UNKNOWN = [
    "Tobacco smoke and carcinoma of the lung: a cohort.",
    "Bone density of elderly women.",
    "Weather words that no store holds.",
]


@pytest.fixture(scope="module")
def collection_texts(service_env) -> dict[str, str]:
    from aheadrank.indexer.collections import Collection

    return {d.docid: d.text for d in Collection(service_env.collection)}


@pytest.fixture
def spied(service_env):
    """A backend whose document encoder records every text it encodes."""
    backend = make_backend(service_env)
    encoded: list[str] = []
    inner = backend.ranker.encode_documents

    def spy(texts, batch_size=64):
        encoded.extend(texts)
        return inner(texts, batch_size=batch_size)

    backend.ranker.encode_documents = spy
    yield backend, encoded
    backend.close()


def test_stored_texts_are_looked_up_and_score_as_their_docids(spied, collection_texts):
    backend, encoded = spied
    ids = sorted(collection_texts)[:60]
    texts = [collection_texts[d] for d in ids]
    # what a client's chunker may do to a text: whitespace and Unicode composition (store/texts.py)
    sent = [t.replace(" ", "  ", 1) + "\n" if i % 2 else " " + t for i, t in enumerate(texts)]
    with TestClient(create_app(backend)) as c:
        before = c.get("/metrics").text
        native = c.post("/v1/rerank", json={"query": QUERY, "candidates": ids}).json()
        by_docid = {x["docid"]: x["score"] for x in native["results"]}
        r = c.post("/rerank", json={"query": QUERY, "documents": sent, "raw_scores": True})
        assert r.status_code == 200, r.text
        got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
        assert [got[i] for i in range(len(ids))] == [by_docid[d] for d in ids]  # the same floats
        for path in ("/v1/rerank", "/v2/rerank"):  # Cohere v1 / Jina and Cohere v2 shapes
            r = c.post(path, json={"model": "m", "query": QUERY, "documents": sent, "top_n": 5})
            assert r.status_code == 200, r.text
            best = [x["index"] for x in r.json()["results"]]
            assert [ids[i] for i in best] == [x["docid"] for x in native["results"][:5]]
        after = c.get("/metrics").text
    assert encoded == []  # the document encoder never ran
    stored = sample_sum(after, "aheadrank_texts_total", source="stored")
    assert stored - sample_sum(before, "aheadrank_texts_total", source="stored") == 3 * len(ids)


def test_a_request_mixing_stored_and_unknown_texts_encodes_only_the_unknown(spied, collection_texts):
    backend, encoded = spied
    ids = sorted(collection_texts)[100:104]
    texts = [collection_texts[ids[0]], UNKNOWN[0], collection_texts[ids[1]], UNKNOWN[0], UNKNOWN[1]]
    scores, tokens = backend.score_texts(QUERY, texts)
    assert sorted(encoded) == sorted(UNKNOWN[:2])  # equal texts in one request: encoded once
    direct = backend.ranker.score_pairs(QUERY, [UNKNOWN[0], UNKNOWN[1]]).tolist()
    scale = max(abs(s) for s in direct)
    assert scores[1] == scores[3] == pytest.approx(direct[0], abs=1e-4 * scale)
    assert scores[4] == pytest.approx(direct[1], abs=1e-4 * scale)
    native = backend.rerank(QUERY, ids[:2], 2, None, 0.0, _clock())
    assert {d: s for d, s, _ in native.ranked} == {ids[0]: scores[0], ids[1]: scores[2]}
    assert tokens > 0


def test_a_blank_text_ranks_last_unscored_and_the_others_score_as_without_it(spied):
    """A text that makes no word piece (empty, spaces, zero-width or control characters only) holds nothing to
    match: it is never encoded, ranks after every other text with relevance_score 0.0 (TEI's raw score
    BLANK_SCORE), and the others score as if it had not been sent."""
    from aheadrank.services.backend import BLANK_SCORE

    backend, encoded = spied
    texts = [UNKNOWN[0], "\u200b\u0000\u0001", UNKNOWN[1], " \n\t "]
    scores, _ = backend.score_texts(QUERY, texts)
    alone, _ = backend.score_texts(QUERY, [UNKNOWN[0], UNKNOWN[1]])
    assert scores[1] == scores[3] == BLANK_SCORE < min(alone)
    assert [scores[0], scores[2]] == pytest.approx(alone, rel=1e-5, abs=1e-6)
    assert sorted(encoded) == sorted(UNKNOWN[:2])  # the blanks never reached the encoder
    with TestClient(create_app(backend)) as c:
        for path in ("/v1/rerank", "/v2/rerank"):
            r = c.post(path, json={"query": QUERY, "documents": texts})
            assert r.status_code == 200, r.text
            last = [(x["index"], x["relevance_score"]) for x in r.json()["results"]][2:]
            assert last == [(1, 0.0), (3, 0.0)]
        r = c.post("/rerank", json={"query": QUERY, "texts": texts, "raw_scores": True})
        assert r.status_code == 200, r.text
        assert [(x["index"], x["score"]) for x in r.json()][2:] == [(1, BLANK_SCORE), (3, BLANK_SCORE)]
        r = c.post("/v2/rerank", json={"query": QUERY, "documents": ["", " "]})
        assert r.status_code == 200, r.text
        assert [(x["index"], x["relevance_score"]) for x in r.json()["results"]] == [(0, 0.0), (1, 0.0)]
    assert sorted(encoded) == sorted(UNKNOWN[:2])


def _clock():
    from aheadrank.services.backend import StageClock

    return StageClock()


def test_unknown_texts_are_encoded_once_across_requests(spied):
    backend, encoded = spied
    with TestClient(create_app(backend)) as c:
        before = c.get("/metrics").text
        body = {"query": QUERY, "documents": UNKNOWN, "raw_scores": True}
        first = c.post("/rerank", json=body).json()["results"]
        assert sorted(encoded) == sorted(UNKNOWN)
        second = c.post("/v2/rerank", json={**body, "query": "another question about lungs"})
        assert second.status_code == 200, second.text
        third = c.post("/rerank", json=body).json()["results"]
        after = c.get("/metrics").text
    assert sorted(encoded) == sorted(UNKNOWN)  # not one more text encoded
    a, b = ({x["index"]: x["relevance_score"] for x in r} for r in (first, third))
    assert a == pytest.approx(b, rel=1e-5, abs=1e-6)

    def delta(name):
        return sample_sum(after, name) - sample_sum(before, name)

    assert delta("aheadrank_text_cache_hits_total") == 6 and delta("aheadrank_text_cache_misses_total") == 3
    assert sample_sum(after, "aheadrank_text_cache_entries") >= 3
    assert sample_sum(after, "aheadrank_text_cache_bytes") > 0


def test_the_cache_is_off_at_zero(service_env):
    backend = make_backend(service_env, text_cache_entries=0)
    try:
        calls = []
        inner = backend.ranker.encode_documents
        backend.ranker.encode_documents = lambda t, batch_size=64: (
            calls.append(len(t)) or inner(t, batch_size)
        )
        backend.score_texts(QUERY, UNKNOWN)
        backend.score_texts(QUERY, UNKNOWN)
        assert sum(calls) == 2 * len(UNKNOWN) and len(backend.text_cache) == 0
    finally:
        backend.close()


def entry(tokens: int, dim: int = 4) -> Encoded:
    return Encoded({"doc": np.zeros((tokens, dim), dtype=np.float32)})  # tokens * dim * 4 bytes


def test_the_cache_keeps_its_bounds_and_drops_the_least_recently_used():
    cache = TextCache(max_entries=3, max_bytes=10_000)
    for i in range(5):
        cache.put((bytes([i]) * 32, "fp"), entry(10))  # 160 bytes each
    assert len(cache) == 3 and cache.evictions == 2 and cache.bytes == 3 * 160
    assert cache.get((bytes([0]) * 32, "fp")) is None and cache.get((bytes([2]) * 32, "fp")) is not None
    cache.put((bytes([5]) * 32, "fp"), entry(10))  # evicts 3, the least recently used (2 was just read)
    assert cache.get((bytes([3]) * 32, "fp")) is None and cache.get((bytes([2]) * 32, "fp")) is not None
    assert cache.get((bytes([2]) * 32, "other fingerprint")) is None

    cache = TextCache(max_entries=100, max_bytes=1000)
    for i in range(10):
        cache.put((bytes([i]) * 32, "fp"), entry(10))
        assert cache.bytes <= 1000
    assert len(cache) == 6 and cache.bytes == 960 and cache.evictions == 4
    cache.put((b"x" * 32, "fp"), entry(100))  # 1600 bytes: larger than the whole cache, not kept
    assert cache.get((b"x" * 32, "fp")) is None and len(cache) == 6
    grown = cache.get((bytes([9]) * 32, "fp"))
    grown.dense = np.zeros(40, dtype=np.float32)  # + 160 bytes: put again, re-accounted
    cache.put((bytes([9]) * 32, "fp"), grown)
    assert cache.bytes == sum(e.nbytes for e, _ in cache._items.values()) <= 1000


def test_backend_cache_bounds_hold(service_env, rng):
    from conftest import random_text

    backend = make_backend(service_env, text_cache_entries=5, text_cache_bytes=10**9)
    try:
        backend.score_texts(QUERY, [random_text(rng, 5, 40) for _ in range(12)])
        cache = backend.text_cache  # 12 texts (and the warm-up's) encoded: each kept until 5 more came
        assert len(cache) == 5 and cache.misses >= 12 and cache.evictions == cache.misses - 5
    finally:
        backend.close()
    backend = make_backend(service_env, text_cache_bytes=50_000)
    try:
        backend.score_texts(QUERY, [random_text(rng, 5, 40) for _ in range(12)])
        stats = backend.text_cache.stats()
        assert 0 < stats["bytes"] <= 50_000 and stats["entries"] < 12 and stats["evictions"] > 0
    finally:
        backend.close()


def test_a_store_without_text_digests_still_serves(service_env, collection_texts, tmp_path, caplog):
    """A store built before the digests: texts are encoded online (and say so in the log and /v1/info)."""
    from aheadrank.rankers import load_ranker
    from aheadrank.store import StoreReader, StoreWriter

    ranker = load_ranker(service_env.checkpoint)
    text = ranker._text()
    every = sorted(collection_texts)
    pieces = text.tokenizer([collection_texts[d] for d in every], add_special_tokens=False)["input_ids"]
    ids = [d for d, p in zip(every, pieces, strict=True) if len(p) <= text.max_doc_len][:20]  # one passage
    assert len(ids) == 20
    old = tmp_path / "old-store"
    with StoreReader(service_env.store) as reader:
        spec = reader.spec
        fetched = reader.fetch(ids)
    with StoreWriter(old, spec) as writer:  # the same fields, no texts given: no digests
        for row, docid in enumerate(fetched.docids):
            n = int(fetched.lengths[row])
            writer.add(docid, {k: v[row, :n] for k, v in fetched.fields.items()})
    with caplog.at_level("WARNING", logger="aheadrank.service"):
        backend = make_backend(dataclasses.replace(service_env, store=old))
    try:
        assert any("text digests in 0 of its 1 shards" in m for m in caplog.messages)
        assert any("encoded online" in w for w in backend.info()["warnings"])
        texts = [collection_texts[d] for d in ids]
        scores, _ = backend.score_texts(QUERY, texts)
        assert backend.text_cache.stats()["texts"]["encoded"] >= len(ids)
        direct = ranker.score_pairs(QUERY, texts).tolist()
        scale = max(abs(s) for s in direct)
        assert scores == pytest.approx(direct, abs=1e-4 * scale)
        native = backend.rerank(QUERY, ids, 20, None, 0.0, _clock())
        stored = {d: s for d, s, _ in native.ranked}
        assert [stored[d] for d in ids] == pytest.approx(scores, abs=5e-3 * scale)  # float16 store
    finally:
        backend.close()


def test_what_cannot_be_tokenized_or_echoed_is_refused_naming_it(service_env):
    """A query that makes no word piece, a document holding a lone UTF-16 surrogate (in its text, a field or a key)
    or a NaN / infinite number (echoed back with return_documents): 422 naming what is wrong, on every ad-hoc
    endpoint, where they were a ranking by [UNK] or a 500. A whole emoji (an escaped surrogate pair) is fine."""
    backend = make_backend(service_env)
    raw = [
        ('{"query": "\\u200b\\u200b", "documents": ["lung cancer"]}', "query: makes no word piece"),
        ('{"query": "lung", "documents": ["a", "smoking \\ud800 kills"]}', "documents.1"),
        (
            '{"query": "lung", "documents": [{"text": "a", "id": "\\udc00"}], "return_documents": true}',
            "documents.0",
        ),
        ('{"query": "lung", "documents": [{"text": "a", "\\ud83d": 1}]}', "documents.0"),
        ('{"query": "lung", "documents": [{"text": "a", "score": NaN}], "return_documents": true}', "NaN"),
        (
            '{"query": "lung", "documents": [{"text": "a", "m": {"x": [1e999]}}], "return_documents": true}',
            "NaN",
        ),
    ]
    try:
        with TestClient(create_app(backend)) as c:
            for path in ("/v1/rerank", "/v2/rerank", "/rerank"):
                for body, said in raw:
                    r = c.post(path, content=body, headers={"content-type": "application/json"})
                    assert r.status_code == 422 and said in r.json()["error"], (path, body, r.text)
            r = c.post(
                "/v2/rerank",
                json={"query": "lung", "documents": ["smoking \U0001f600 kills"], "return_documents": True},
            )
            assert r.status_code == 200, r.text
            assert r.json()["results"][0]["document"]["text"] == "smoking \U0001f600 kills"
            assert c.get("/ready").status_code == 200
            assert 'aheadrank_errors_total{kind="internal"}' not in c.get("/metrics").text
    finally:
        backend.close()
