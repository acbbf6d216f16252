"""The service in-process (FastAPI TestClient / httpx ASGI transport): shapes, rankings, limits, errors."""

from __future__ import annotations

import asyncio
import json
import math
import os
import shutil
import threading
import time

import httpx
import pytest
import torch
from aheadrank.services import RerankBackend, ServiceSettings, create_app
from aheadrank.services.metrics import sample_sum
from fastapi.testclient import TestClient

QUERY = "smoking increases the risk of lung cancer"


def make_backend(env, **overrides) -> RerankBackend:
    settings = ServiceSettings(
        checkpoint=env.checkpoint,
        store=env.store,
        index=env.lucene,
        device="cpu",
        access_log=False,
        **overrides,
    )
    backend = RerankBackend.load(settings)
    backend.warmup()
    return backend


@pytest.fixture(scope="module")
def backend(service_env):
    b = make_backend(
        service_env, max_candidates=300, max_documents=500, max_query_chars=500, max_body_bytes=200_000
    )
    yield b
    b.close()


@pytest.fixture(scope="module")
def client(backend):
    with TestClient(create_app(backend)) as c:
        yield c


def rerank(client, **body):
    return client.post("/v1/rerank", json={"query": QUERY, **body})


def test_bm25_rerank_matches_the_batch_path(client, backend, service_env):
    from aheadrank.runs import bm25_candidates, rerank_run

    r = rerank(client, depth=50)
    assert r.status_code == 200, r.text
    body = r.json()
    cands = bm25_candidates(service_env.lucene, {"q": QUERY}, 50)
    run, _ = rerank_run(service_env.checkpoint, service_env.store, {"q": QUERY}, cands, progress=False)
    expected = sorted(run["q"].items(), key=lambda x: (-x[1], x[0]))
    assert [x["docid"] for x in body["results"]] == [d for d, _ in expected]
    assert [x["score"] for x in body["results"]] == [s for _, s in expected]  # same batches: same floats
    bm25 = dict(cands["q"])
    assert all(x["bm25_score"] == pytest.approx(bm25[x["docid"]]) for x in body["results"])
    assert [x["rank"] for x in body["results"]] == list(range(1, 51))
    assert body["reranked"] == body["candidates"] == 50 and body["missing_from_store"] == []
    assert body["budget"] is None
    t = body["timings"]
    assert t["total_ms"] >= t["bm25_ms"] + t["query_ms"] + t["fetch_ms"] + t["score_ms"] > 0
    stages = dict(part.strip().split(";dur=") for part in r.headers["server-timing"].split(","))
    assert {"bm25", "query", "score", "total"} <= set(stages)


def test_explicit_candidates_equal_direct_scoring(client, backend, service_env):
    from aheadrank.indexer.collections import Collection

    texts = {d.docid: d.text for d in Collection(service_env.collection)}
    ids = sorted(texts)[:40]
    r = rerank(client, candidates=ids, top_n=10, return_text=True)
    assert r.status_code == 200, r.text
    body = r.json()
    direct = backend.ranker.score_pairs(QUERY, [texts[d] for d in ids]).tolist()
    by_id = dict(zip(ids, direct, strict=True))
    scale = max(abs(s) for s in direct)
    assert len(body["results"]) == 10 and body["candidates"] == 40 and body["reranked"] == 40
    for x in body["results"]:
        assert x["bm25_score"] is None
        assert x["score"] == pytest.approx(by_id[x["docid"]], abs=5e-3 * scale)  # float16 store
        assert x["text"] == texts[x["docid"]]
    best = sorted(by_id, key=by_id.get, reverse=True)[:3]
    assert {x["docid"] for x in body["results"][:5]} >= set(best[:1])


def test_compatible_endpoint_cohere_jina_tei(client, backend):
    docs = ["Smoking causes lung cancer.", "Bananas are yellow.", "Tobacco and tumours.", "x"]
    direct = backend.ranker.score_pairs(QUERY, docs).tolist()
    scale = max(abs(s) for s in direct)
    r = client.post(
        "/rerank", json={"model": "whatever", "query": QUERY, "documents": docs, "return_documents": True}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["total_tokens"] > 0 and body["model"] == backend.model_name
    got = {x["index"]: x for x in body["results"]}
    assert sorted(got) == [0, 1, 2, 3]
    for i, s in enumerate(direct):
        assert got[i]["relevance_score"] == pytest.approx(1 / (1 + math.exp(-s)), abs=1e-4 * scale)
        assert got[i]["document"] == {"text": docs[i]}
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True)
    # raw scores, objects as documents, top_n
    r = client.post(
        "/rerank",
        json={"query": QUERY, "documents": [{"text": d} for d in docs], "raw_scores": True, "top_n": 2},
    )
    body = r.json()
    assert len(body["results"]) == 2 and "document" not in body["results"][0]
    for x in body["results"]:
        assert x["relevance_score"] == pytest.approx(direct[x["index"]], abs=1e-4 * scale)
    assert body["results"][0]["index"] == max(range(4), key=lambda i: direct[i])
    # TEI: {query, texts} -> [{index, score, text?}]
    r = client.post("/rerank", json={"query": QUERY, "texts": docs, "return_text": True, "raw_scores": True})
    tei = r.json()
    assert isinstance(tei, list) and {x["index"] for x in tei} == {0, 1, 2, 3}
    assert all(x["text"] == docs[x["index"]] for x in tei)
    assert all(x["score"] == pytest.approx(direct[x["index"]], abs=1e-4 * scale) for x in tei)


def test_large_compatible_request_is_split_not_refused(client, backend, rng):
    from conftest import random_text

    docs = [random_text(rng, 1, 80) for _ in range(300)]  # > doc_batch_size (64): several batches
    r = client.post("/rerank", json={"query": QUERY, "documents": docs, "raw_scores": True})
    assert r.status_code == 200, r.text
    direct = backend.ranker.score_pairs(QUERY, docs).tolist()
    scale = max(abs(s) for s in direct)
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    assert len(got) == 300
    assert max(abs(got[i] - direct[i]) for i in range(300)) <= 1e-4 * scale


def test_time_budget_keeps_the_tail_in_bm25_order(client, backend):
    full = rerank(client, depth=200).json()
    assert full["reranked"] == full["candidates"]
    tiny = rerank(client, depth=200, time_budget_ms=0.01).json()
    assert tiny["reranked"] == 0 and tiny["budget"]["planned_depth"] == 0
    bm25 = [x["bm25_score"] for x in tiny["results"]]
    assert bm25 == sorted(bm25, reverse=True) and all(x["score"] is None for x in tiny["results"])
    roomy = rerank(client, depth=200, time_budget_ms=60_000).json()
    assert roomy["reranked"] == roomy["candidates"]
    assert [x["docid"] for x in roomy["results"]] == [x["docid"] for x in full["results"]]


def test_a_budget_that_plans_nothing_probes_a_small_chunk_and_the_model_falls_back(client, backend):
    """A latency model fitted far too high (a warm-up on a busy machine) plans nothing for a 200 ms budget: once
    no chunk has been timed for PROBE_AFTER_S, a budgeted request re-ranks one small chunk, and the requests
    scored (with a budget or without) bring the model back until the budget re-ranks candidates again."""
    from aheadrank.services import budget

    model = backend.latency
    saved = (model.per_doc_s, model.per_chunk_s, model.timed_at)
    try:
        # 1000 s a chunk and 1 s a document: nothing fits a 60 s budget; just timed
        model.per_doc_s, model.per_chunk_s, model.timed_at = 1.0, 1000.0, time.monotonic()
        body = rerank(client, depth=100, time_budget_ms=60_000).json()
        assert body["reranked"] == 0 and body["budget"]["planned_depth"] == 0
        model.timed_at -= budget.PROBE_AFTER_S + 1
        body = rerank(client, depth=100, time_budget_ms=60_000).json()
        assert body["reranked"] == max(1, backend.settings.batch_size // 16)
        assert model.per_chunk_s < 1000.0  # the probe's cost was observed
        for _ in range(60):  # requests without a budget are timed too
            rerank(client, depth=100)
            if model.predict(100) < 5.0:
                break
        assert rerank(client, depth=100, time_budget_ms=60_000).json()["reranked"] == 100
    finally:
        model.per_doc_s, model.per_chunk_s, model.timed_at = saved


def test_time_budget_is_honoured_on_a_slow_model(service_env):
    """A model slowed by at least 1 ms per candidate: a budget re-ranks a head of the list, never all of it,
    and never more than fits the budget plus the one chunk that may have started just before the deadline.
    Sleep-based cost bounds the depth from above on any machine; how deep it gets (even 0, on a starved
    CPU) and the wall-clock total are the machine's business, so they are not asserted."""
    backend = make_backend(service_env, batch_size=16)
    inner = backend._score_chunk

    def slow(qs, ids, seconds, *priors, **more):
        time.sleep(1e-3 * len(ids))
        return inner(qs, ids, seconds, *priors, **more)

    backend._score_chunk = slow
    backend.warmup()  # calibrate the latency model on the slowed path
    try:
        with TestClient(create_app(backend)) as c:
            for budget in (80.0, 150.0):
                body = c.post(
                    "/v1/rerank", json={"query": QUERY, "depth": 300, "time_budget_ms": budget}
                ).json()
                n = body["reranked"]
                assert n < body["candidates"] and n <= budget / 1.0 + 16, (
                    budget,
                    body,
                )  # 1 ms each, chunks of 16
                head, tail = body["results"][:n], body["results"][n:]
                assert all(x["score"] is not None for x in head) and all(x["score"] is None for x in tail)
                assert [x["score"] for x in head] == sorted((x["score"] for x in head), reverse=True)
                assert [x["bm25_score"] for x in tail] == sorted(
                    (x["bm25_score"] for x in tail), reverse=True
                )
    finally:
        backend.close()


BAD_BODIES = [
    ({"query": ""}, 422, "validation"),
    ({"query": "   "}, 422, "validation"),
    ({"query": 5}, 422, "validation"),
    ({"query": ["a"]}, 422, "validation"),
    ({}, 422, "validation"),
    ({"query": "q", "candidates": "4983"}, 422, "validation"),
    ({"query": "q", "candidates": [1, 2]}, 422, "validation"),
    ({"query": "q", "candidates": []}, 422, "validation"),
    ({"query": "q", "depth": 0}, 422, "validation"),
    ({"query": "q", "depth": "ten"}, 422, "validation"),
    ({"query": "q", "depth": 301}, 413, "too_many_candidates"),
    ({"query": "q", "top_n": -1}, 422, "validation"),
    ({"query": "q", "time_budget_ms": 0}, 422, "validation"),
    ({"query": "q", "time_budget_ms": "fast"}, 422, "validation"),
    ({"query": "q", "time_budget_ms": 1e308}, 422, "validation"),
    ({"query": "q", "surprise": 1}, 422, "validation"),
    ({"query": "x" * 501}, 413, "query_too_long"),
    ({"query": "q", "candidates": [f"d{i}" for i in range(301)]}, 413, "too_many_candidates"),
    ({"query": "q", "candidates": ["no-such-doc", "4983"]}, 404, "unknown_docid"),
]


@pytest.mark.parametrize(("body", "status", "kind"), BAD_BODIES)
def test_bad_rerank_requests_get_clear_4xx(client, body, status, kind):
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == status, r.text
    err = r.json()
    assert err["kind"] == kind and err["error"] and err["request_id"] == r.headers["x-request-id"]


def test_unknown_and_duplicate_docids_are_named(client, backend):
    known = backend.reader.docids()[:2]
    r = client.post("/v1/rerank", json={"query": "q", "candidates": [known[0], "nope-1", "nope-2"]})
    assert r.status_code == 404 and "nope-1" in r.json()["error"] and "nope-2" in r.json()["error"]
    r = client.post("/v1/rerank", json={"query": "q", "candidates": [known[0], known[1], known[0]]})
    assert r.status_code == 422 and r.json()["kind"] == "duplicate_docid" and known[0] in r.json()["error"]


BAD_COMPAT = [
    ({"query": "q"}, 422),
    ({"query": "q", "documents": []}, 422),
    ({"query": "q", "documents": "one string"}, 422),
    ({"query": "q", "documents": [{"title": "no text"}]}, 422),
    ({"query": "q", "documents": ["a"], "texts": ["b"]}, 422),
    ({"query": "", "documents": ["a"]}, 422),
    ({"query": "q", "documents": ["a"] * 501}, 413),
    ({"query": "q", "documents": ["a"], "top_n": 0}, 422),
]


@pytest.mark.parametrize(("body", "status"), BAD_COMPAT)
def test_bad_compatible_requests(client, body, status):
    r = client.post("/rerank", json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]


def test_raw_body_problems(client):
    h = {"content-type": "application/json"}
    r = client.post("/v1/rerank", content=b'{"query": "\xff\xfe caf\xe9"}', headers=h)
    assert r.status_code == 400 and "UTF-8" in r.json()["error"]
    r = client.post("/v1/rerank", content=b'{"query": ', headers=h)
    assert r.status_code == 422 and r.json()["kind"] == "validation"
    r = client.post("/v2/rerank", content=b'{"query": "q" "documents": ["a"]}', headers=h)
    said = r.json()["error"]  # where parsing stopped, and why: not a number that reads like a field name
    assert r.status_code == 422 and said.startswith(
        "the body is not valid JSON at character 14: Expecting"
    ), said
    r = client.post("/v1/rerank", content=b'{"query": "q", "time_budget_ms": NaN}', headers=h)
    assert r.status_code == 422 and "finite" in r.json()["error"], r.text
    r = client.post(
        "/v1/rerank", content=b"query=smoking", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    assert r.status_code == 415
    r = client.post("/v1/rerank", content=json.dumps({"query": "q" * 300_000}), headers=h)
    assert r.status_code == 413 and r.json()["kind"] == "body_too_large"
    r = client.post("/rerank", content=json.dumps({"query": "q", "documents": ["word " * 50_000]}), headers=h)
    assert r.status_code == 413
    r = client.get("/v1/rerank")
    assert r.status_code == 405 and r.json()["error"]
    r = client.get("/nowhere")
    assert r.status_code == 404 and r.json()["error"]
    form = {"content-type": "text/plain"}  # a wrong path or method is said before a wrong Content-Type
    assert client.post("/nowhere", content=b"x", headers=form).status_code == 404
    assert client.post("/health", content=b"x", headers=form).status_code == 405


def test_request_id_is_echoed_and_info_metrics_health(client, backend, service_env):
    r = client.post("/v1/rerank", json={"query": QUERY, "depth": 5}, headers={"x-request-id": "abc-123"})
    assert r.headers["x-request-id"] == "abc-123" and r.json()["request_id"] == "abc-123"
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/ready").status_code == 200
    info = client.get("/v1/info").json()
    from aheadrank.rankers import read_fingerprint

    assert (
        info["model"]["fingerprint"]
        == read_fingerprint(service_env.checkpoint)
        == info["store"]["fingerprint"]
    )
    assert (
        info["model"]["kind"] == "mores" and info["model"]["ibs"] == 2 and info["model"]["strategy"] == "s2"
    )
    assert info["store"]["documents"] == info["index"]["documents"] == 1000 and info["store"]["bytes"] > 0
    assert info["index"]["language"] == "en"  # the analyzer queries are searched with (the index's)
    assert info["device"] == "cpu" and info["latency"]["per_doc_ms"] > 0
    text = client.get("/metrics").text
    assert 'aheadrank_requests_total{endpoint="/v1/rerank",status="200"}' in text
    assert 'aheadrank_stage_seconds_count{endpoint="/v1/rerank",stage="bm25"}' in text
    assert "aheadrank_candidates_bucket" in text and "aheadrank_errors_total" in text
    assert client.get("/docs").status_code == 200
    assert "/v1/rerank" in client.get("/openapi.json").json()["paths"]


def test_api_keys(service_env, backend):
    settings = backend.settings.model_copy(update={"api_keys": ["k-one", "k-two"]})
    other = RerankBackend(settings, backend.ranker, backend.reader, backend.searcher, "cpu")
    other.ready = True
    with TestClient(create_app(other)) as c:
        body = {"query": QUERY, "depth": 3}
        r = c.post("/v1/rerank", json=body)
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert c.post("/v1/rerank", json=body, headers={"authorization": "Basic abc"}).status_code == 401
        r = c.post("/v1/rerank", json=body, headers={"authorization": "Bearer wrong"})
        assert r.status_code == 403 and r.json()["kind"] == "auth_invalid"
        assert c.post("/v1/rerank", json=body, headers={"authorization": "Bearer k-two"}).status_code == 200
        assert c.post("/rerank", json={"query": "q", "documents": ["a"]}).status_code == 401
        assert c.get("/v1/info").status_code == 401
        assert c.get("/health").status_code == 200 and c.get("/ready").status_code == 200


def test_env_settings_mirror_flags(monkeypatch, service_env):
    monkeypatch.setenv("AHEADRANK_CHECKPOINT", str(service_env.checkpoint))
    monkeypatch.setenv("AHEADRANK_API_KEYS", "a,b c")
    monkeypatch.setenv("AHEADRANK_MAX_QUEUE", "7")
    s = ServiceSettings()
    assert s.api_keys == ["a", "b", "c"] and s.max_queue == 7 and s.checkpoint == service_env.checkpoint
    assert s.java_heap == "512m"  # the JVM's bound by default, not a quarter of the machine
    monkeypatch.setenv("AHEADRANK_JAVA_HEAP", "2g")
    assert ServiceSettings().java_heap == "2g"
    assert s.onednn_cache_capacity == 8 and s.malloc_trim_interval_s == 10.0
    monkeypatch.setenv("AHEADRANK_MALLOC_TRIM_INTERVAL_S", "0")
    monkeypatch.setenv("AHEADRANK_ONEDNN_CACHE_CAPACITY", "32")
    assert ServiceSettings().malloc_trim_interval_s == 0 and ServiceSettings().onednn_cache_capacity == 32
    monkeypatch.setenv("AHEADRANK_JAVA_HEAP", "-Xmx2g")
    with pytest.raises(ValueError, match="java_heap"):
        ServiceSettings()


def test_native_setting_switches_the_compiled_kernels(service_env, monkeypatch):
    """``--native`` / ``AHEADRANK_NATIVE`` (one setting, its environment twin being the variable the kernels
    read) takes what the kernels take: all, none (and the old booleans), or a list of families; the backend
    switches those on for the process it loads in. An unknown family is refused when the settings are read."""
    from aheadrank.kernels import native

    for value, want in [
        ("0", "none"),
        ("1", "all"),
        ("attention,tk", "attention,tk"),
        ("-layer", "attention,tk"),
    ]:
        monkeypatch.setenv("AHEADRANK_NATIVE", value)
        assert ServiceSettings(checkpoint=service_env.checkpoint).native == want
    monkeypatch.setenv("AHEADRANK_NATIVE", "attention,linear")
    with pytest.raises(ValueError, match="unknown kernel family linear"):
        ServiceSettings(checkpoint=service_env.checkpoint)
    monkeypatch.delenv("AHEADRANK_NATIVE")
    assert ServiceSettings(checkpoint=service_env.checkpoint).native == "all"
    for given, on in [(False, set()), (True, set(native.FAMILIES)), ("tk", {"tk"})]:
        b = make_backend(service_env, native=given)
        try:
            assert native.families() == on
        finally:
            b.close()


def test_the_kernels_are_built_at_load_not_on_a_request(service_env, monkeypatch):
    """Loading the backend builds (or takes from the cache) the compiled kernels before any warm-up or request,
    so no request pays for a compile; with --native none nothing is built."""
    from aheadrank.kernels import native

    built: list[int] = []
    monkeypatch.setattr(native, "_load", lambda: built.append(1))
    settings = dict(checkpoint=service_env.checkpoint, store=service_env.store, index=service_env.lucene)
    for on in (False, True):
        b = RerankBackend.load(ServiceSettings(**settings, device="cpu", access_log=False, native=on))
        try:
            assert built == ([1] if on else [])
        finally:
            b.close()


def test_heap_trim_runs_on_the_model_thread_and_is_counted(backend, monkeypatch):
    from aheadrank.services import memory

    assert os.environ[memory.ONEDNN_CACHE_VARIABLE] == str(
        backend.settings.onednn_cache_capacity
    )  # set by load
    threads = []
    monkeypatch.setattr(
        memory, "_glibc_trim", lambda: lambda pad: threads.append(threading.current_thread().name)
    )
    settings = backend.settings.model_copy(update={"malloc_trim_interval_s": 1e-6})
    trimmed = RerankBackend(settings, backend.ranker, backend.reader, backend.searcher, "cpu")
    trimmed.ready = True
    with TestClient(create_app(trimmed)) as c:
        for _ in range(2):
            assert rerank(c, depth=5).status_code == 200
        count = 0.0
        for _ in range(50):  # the trim is queued behind the request on the model thread
            count = sample_sum(c.get("/metrics").text, "aheadrank_malloc_trim_seconds_count")
            if count >= 2:
                break
            time.sleep(0.05)
    assert count >= 2 and threads and all(name.startswith("aheadrank-model") for name in threads)


def test_full_queue_answers_503_instead_of_growing(backend):
    settings = backend.settings.model_copy(update={"max_queue": 2})
    gated = RerankBackend(settings, backend.ranker, backend.reader, backend.searcher, "cpu")
    gated.ready = True
    release = threading.Event()
    inner = gated.rerank_steps

    def blocked(*args, **kwargs):
        release.wait(30)
        return inner(*args, **kwargs)

    gated.rerank_steps = blocked
    app = create_app(gated)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            body = {"query": QUERY, "depth": 5}
            first = [asyncio.create_task(c.post("/v1/rerank", json=body)) for _ in range(2)]
            await asyncio.sleep(0.3)
            over = await c.post("/v1/rerank", json=body)
            metrics = (await c.get("/metrics")).text
            release.set()
            done = await asyncio.gather(*first)
            return over, done, metrics

    over, done, metrics = asyncio.run(scenario())
    assert (
        over.status_code == 503 and over.headers["retry-after"] == "1" and over.json()["kind"] == "overloaded"
    )
    assert [r.status_code for r in done] == [200, 200]
    assert "aheadrank_queue_depth 2.0" in metrics


def test_no_store_or_index_configured(service_env):
    from aheadrank.rankers import load_ranker

    settings = ServiceSettings(checkpoint=service_env.checkpoint, access_log=False)
    bare = RerankBackend(settings, load_ranker(service_env.checkpoint), None, None, "cpu")
    bare.ready = True
    with TestClient(create_app(bare)) as c:
        r = c.post("/v1/rerank", json={"query": "q"})
        assert r.status_code == 503 and r.json()["kind"] == "no_store"
        r = c.post("/rerank", json={"query": "q", "documents": ["a", "b"]})
        assert r.status_code == 200 and len(r.json()["results"]) == 2


def test_an_index_without_its_texts_is_refused_at_start(service_env, tmp_path):
    """An index copied without its texts/ folder: the service does not start (a clear error naming the fix),
    instead of starting and answering the first request that asks for documents' text with a 503."""
    import shutil

    from aheadrank.indexer.bm25 import TEXTS_DIR

    from aheadrank.errors import AheadrankError

    copy = tmp_path / "lucene"
    shutil.copytree(service_env.lucene, copy)
    assert (copy / TEXTS_DIR).is_dir()
    shutil.rmtree(copy / TEXTS_DIR)
    settings = ServiceSettings(
        checkpoint=service_env.checkpoint, store=service_env.store, index=copy, access_log=False
    )
    with pytest.raises(AheadrankError, match="texts.*rebuild it"):
        RerankBackend.load(settings)


def test_latency_model_plans_within_the_budget():
    from aheadrank.services.budget import LatencyModel

    m = LatencyModel(batch=100, safety=1.0)
    m.reserve_s = 0.0
    m.fit([(10, 0.002), (50, 0.006), (100, 0.011)])  # 1 ms per chunk + 0.1 ms per document
    assert m.per_doc_s == pytest.approx(1e-4) and m.per_chunk_s == pytest.approx(1e-3)
    assert m.depth_for(0.0005, 1000) == 0
    assert m.depth_for(0.011, 1000) == 100  # one chunk: 1 + 10 ms
    assert m.depth_for(0.0215, 1000) == 195  # two chunks: 2 ms + 195 x 0.1 ms
    for budget in (0.003, 0.0123, 0.05, 0.2):
        n = m.depth_for(budget, 1000)
        assert m.predict(n) <= budget + 1e-12 and (n == 1000 or m.predict(n + 1) > budget)
    assert m.depth_for(float("inf"), 1000) == 1000 and m.depth_for(1e300, 7) == 7  # no overflow
    m.observe(100, 0.1)  # much slower than believed: believed at once (half way)
    assert m.per_doc_s > 4e-4
    assert torch.get_num_threads() >= 1


def test_latency_model_is_not_set_by_a_busy_moment_and_falls_back_when_chunks_run_faster():
    """The fit takes each size's fastest repeat (a repeat slowed by other work is not the ranker's cost); an
    estimate too high (fitted on a busy machine) falls back as scored chunks run faster; where it plans nothing,
    a request with time left probes one small chunk once no chunk has been timed for PROBE_AFTER_S."""
    from aheadrank.services import budget

    m = budget.LatencyModel(batch=128, safety=1.0)
    samples = [(8, 0.0018), (32, 0.0042), (64, 0.0074), (128, 0.0138)]  # 1 ms + 0.1 ms per document
    m.fit([*samples, (32, 0.3), (128, 0.9)])  # two repeats slowed by a busy machine
    assert m.per_doc_s == pytest.approx(1e-4) and m.per_chunk_s == pytest.approx(1e-3)
    m.fit([(n, 20 * t) for n, t in samples])  # fitted on a machine busy throughout: 20x too slow
    assert m.depth_for(0.02, 300) == 0  # a 20 ms budget plans nothing
    assert m.probe_size(0.02) == 0  # just timed (the fit): no probe yet
    later = m.timed_at + budget.PROBE_AFTER_S + 1
    assert m.probe_size(0.02, now=later) == 8 and m.probe_size(-0.001, now=later) == 0
    for _ in range(
        30
    ):  # the chunks requests score run at the true cost (the excess falls by a quarter a chunk)
        m.observe(128, 0.0138)
    assert m.predict(128) == pytest.approx(0.0138, rel=0.1)
    assert m.depth_for(0.02, 300) > 0


def test_deadline_answers_504_and_stops_the_work(service_env):
    """A server-side deadline of 0.2 s and requests that sleep at least 1 ms (/v1/rerank) or 10 ms (/rerank) per
    candidate, so that they cannot finish in it on any machine: 504 with a body that names the deadline, and
    the model thread stops at a chunk boundary instead of running to the end (counted in /metrics)."""
    backend = make_backend(service_env, batch_size=16, doc_batch_size=1, request_timeout_s=0.2)
    inner_chunk, inner_encode = backend._score_chunk, backend.ranker.encode_documents

    def slow_chunk(qs, ids, seconds, *priors, **more):
        time.sleep(1e-3 * len(ids))
        return inner_chunk(qs, ids, seconds, *priors, **more)

    def slow_encode(texts, batch_size=64):
        time.sleep(1e-2 * len(texts))
        return inner_encode(texts, batch_size=batch_size)

    backend._score_chunk = slow_chunk
    backend.ranker.encode_documents = slow_encode
    try:
        with TestClient(create_app(backend)) as c:
            for path, body, chunks in (
                ("/v1/rerank", {"query": QUERY, "depth": 300}, 300 // 16 + 1),
                ("/rerank", {"query": QUERY, "texts": [f"protein cell {i}" for i in range(100)]}, 100),
            ):
                r = c.post(path, json=body)
                assert r.status_code == 504, r.text
                err = r.json()
                assert err["kind"] == "deadline_exceeded" and "0.2 s" in err["error"], err
                assert "request-timeout-s" in err["error"] and err["message"] == err["error"]
                # the slot is free as soon as the client is answered
                assert sample_sum(c.get("/metrics").text, "aheadrank_queue_depth") == 0
                for _ in range(3000):  # bounded: wait for the model thread to let go (counted last)
                    text = c.get("/metrics").text
                    if sample_sum(text, "aheadrank_cancelled_total", endpoint=path) >= 1:
                        break
                    time.sleep(0.01)
                assert sample_sum(text, "aheadrank_cancelled_total", endpoint=path, reason="deadline") == 1
                scored = sample_sum(text, "aheadrank_chunks_total", endpoint=path, outcome="scored")
                skipped = sample_sum(text, "aheadrank_chunks_total", endpoint=path, outcome="skipped")
                assert scored < chunks and scored + skipped == chunks, (scored, skipped)
                assert sample_sum(text, "aheadrank_errors_total", kind="deadline_exceeded") >= 1
            assert c.get("/v1/info").json()["limits"]["request_timeout_s"] == 0.2
    finally:
        backend.close()


def test_api_keys_file_and_the_command_line_warning(service_env, tmp_path):
    import subprocess

    from services_testkit import AHEADRANK

    keys = tmp_path / "keys"
    keys.write_text("# ops keys\nk1 k2\n\nk3  # the CI key\n")
    settings = ServiceSettings(checkpoint=service_env.checkpoint, api_keys=["k0"], api_keys_file=keys)
    assert settings.api_keys == ["k0", "k1", "k2", "k3"]
    with pytest.raises(ValueError, match="holds no keys"):
        (tmp_path / "empty").write_text("# nothing\n")
        ServiceSettings(checkpoint=service_env.checkpoint, api_keys_file=tmp_path / "empty")
    missing = tmp_path / "none"  # the command stops at the checkpoint, after the key options are read
    cli = subprocess.run(
        [AHEADRANK, "serve", "--checkpoint", str(missing), "--api-key", "secret"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert cli.returncode == 2 and "warning: --api-key on the command line" in cli.stderr, cli.stderr
    cli = subprocess.run(
        [AHEADRANK, "serve", "--checkpoint", str(missing), "--api-keys-file", str(keys)],
        capture_output=True, text=True, timeout=120, env={**os.environ, "AHEADRANK_API_KEYS": "k9"},
    )  # fmt: skip
    assert cli.returncode == 2 and "warning" not in cli.stderr, cli.stderr


def test_serve_reads_both_key_variables_lets_its_flags_replace_them_and_never_echoes_a_key(
    service_env, tmp_path, monkeypatch
):
    """AHEADRANK_API_KEY and AHEADRANK_API_KEYS together: both read (click took the first one set and dropped the
    other). --api-keys-file replaces AHEADRANK_API_KEYS_FILE (the settings read the variable's file again, so a
    rotated-out key stayed valid). A malformed key list is named without its keys (they are secrets)."""
    import subprocess

    from aheadrank.services import backend as backend_module
    from aheadrank.services.keys import service_keys
    from services_testkit import AHEADRANK
    from typer.testing import CliRunner

    from aheadrank.cli import app

    old, new = tmp_path / "old.keys", tmp_path / "new.keys"
    old.write_text("old-rotated-key\n")
    new.write_text("new-key\n")
    assert service_keys([], None, {"AHEADRANK_API_KEY": "k1", "AHEADRANK_API_KEYS": "k2 k3"}) == [
        "k1",
        "k2",
        "k3",
    ]
    assert service_keys(["cli"], new, {"AHEADRANK_API_KEYS": "k2"}) == ["cli", "new-key"]

    seen = {}

    class Loaded(Exception):
        pass

    def load(settings):
        seen["keys"] = settings.api_keys
        raise Loaded

    monkeypatch.setattr(backend_module.RerankBackend, "load", staticmethod(load))
    monkeypatch.setenv("AHEADRANK_API_KEYS_FILE", str(old))
    monkeypatch.setenv("AHEADRANK_API_KEY", "k1")
    monkeypatch.setenv("AHEADRANK_API_KEYS", "k2")
    args = ["serve", "--checkpoint", str(service_env.checkpoint), "--api-keys-file", str(new)]
    res = CliRunner().invoke(app, args)
    assert isinstance(res.exception, Loaded), res.output
    assert seen["keys"] == ["k1", "k2", "new-key"]  # not old-rotated-key
    res = CliRunner().invoke(app, ["serve", "--checkpoint", str(service_env.checkpoint)])
    assert isinstance(res.exception, Loaded), res.output
    assert seen["keys"] == ["k1", "k2", "old-rotated-key"]  # the variable's file when the flag is not given

    env = {k: v for k, v in os.environ.items() if not k.startswith("AHEADRANK_API_KEY")}
    cli = subprocess.run(
        [AHEADRANK, "serve", "--checkpoint", str(tmp_path / "none")],
        capture_output=True, text=True, timeout=120,
        env={**env, "AHEADRANK_API_KEY": "k1", "AHEADRANK_API_KEYS": "prod-secret-1,,prod-secret-2"},
    )  # fmt: skip
    assert cli.returncode == 2 and "item 2 of 3" in cli.stderr, cli.stderr
    assert "prod-secret" not in cli.stderr + cli.stdout


def test_the_access_log_names_an_errors_kind_and_never_the_request(backend, caplog, monkeypatch):
    """A 4xx/5xx access line carried only the status: to debug it an operator needed the client's request id. It
    now names the error's kind (also the X-Error-Kind header); the request's text is never logged."""
    monkeypatch.setattr(backend.settings, "access_log", True)
    secret = "a confidential query about patient 4711"
    with TestClient(create_app(backend)) as c, caplog.at_level("INFO", logger="aheadrank.access"):
        ok = c.post("/v1/rerank", json={"query": secret, "depth": 5})
        bad = c.post("/v1/rerank", json={"query": secret, "depth": 0})
        missing = c.get("/v1/nothing-here")
    assert ok.status_code == 200 and bad.status_code == 422 and missing.status_code == 404
    assert bad.headers["x-error-kind"] == bad.json()["kind"]
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "aheadrank.access"]
    by_status = {line["status"]: line for line in lines}
    assert "error" not in by_status[200]
    assert by_status[422]["error"] == bad.json()["kind"] and by_status[404]["error"] == missing.json()["kind"]
    assert all(secret not in r.getMessage() for r in caplog.records)


def test_serves_a_codebook_store(service_env, tmp_path):
    """A book4 store of the same checkpoint (`aheadrank index --dtype book4`) is served like any other: /v1/info
    names its dtype, and the served ranking is the batch path's over that store (scores from its decoded values)."""
    from aheadrank.indexer.build import BuildOptions, build_store

    from aheadrank.runs import bm25_candidates, rerank_run

    store = tmp_path / "book4"
    build_store(BuildOptions(str(service_env.checkpoint), str(service_env.collection), str(store), dtype="book4",
                             shard_size=400, progress=False))  # fmt: skip
    env = type(service_env)(service_env.collection, service_env.lucene, service_env.checkpoint, store, store)
    books = make_backend(env, max_candidates=300)
    try:
        with TestClient(create_app(books)) as c:
            assert c.get("/v1/info").json()["store"]["dtype"] == "book4"
            r = rerank(c, depth=30)
            assert r.status_code == 200, r.text
        cands = bm25_candidates(service_env.lucene, {"q": QUERY}, 30)
        run, _ = rerank_run(service_env.checkpoint, store, {"q": QUERY}, cands, progress=False)
        expected = sorted(run["q"].items(), key=lambda x: (-x[1], x[0]))
        assert [(x["docid"], x["score"]) for x in r.json()["results"]] == expected
    finally:
        books.close()


def test_head_answers_every_get_and_a_ranker_store_given_as_a_dense_field_is_pointed_at_its_dense(
    client, service_env, tmp_path
):
    """HEAD /metrics and /v1/info answer like GET without a body (they were 405; /health and /ready already did). A
    ranker's store given where its dense field is wanted (train --dense-store STORE) says where the field is; an API
    keys file that is not UTF-8 is named."""
    from aheadrank.services.settings import read_keys_file

    from aheadrank.baselines import dense_features
    from aheadrank.errors import StoreError

    for path in ("/metrics", "/v1/info", "/health"):
        r = client.head(path)
        assert r.status_code == 200 and r.content == b"", path
    store = shutil.copytree(service_env.store, tmp_path / "store")
    (store / "dense").mkdir(exist_ok=True)
    (store / "dense" / "manifest.json").touch(exist_ok=True)  # a store with its dense field (only looked for)
    with pytest.raises(StoreError, match=r"the dense field of that store is .*store/dense"):
        dense_features(store, {"q": QUERY}, {"q": [("x", 1.0)]})
    keys = tmp_path / "keys"
    keys.write_bytes(b"\xff\xfe secret")
    with pytest.raises(ValueError, match=r"keys file .*keys is not UTF-8"):
        read_keys_file(keys)
