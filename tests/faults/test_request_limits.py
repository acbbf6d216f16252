"""Client input that must cost the server little and answer 4xx (issue 37, items 1 and 8): per-item limits
apply before any work is sized by them, a docid longer than every stored one is unknown without widening
the lookup, JSON is refused for its shape before it is parsed, a long query in any script is searched or
refused with a message, never a 500. In-process (TestClient); memory measured with tracemalloc, which
numpy's allocations report to."""

from __future__ import annotations

import json
import tracemalloc

import faults_testkit  # noqa: F401  (puts the other testkits on sys.path)
import pytest
from aheadrank.store import StoreReader
from faults_testkit import build, make_docs, make_spec

from aheadrank.errors import StoreError

MB = 1 << 20


def _peak(fn) -> tuple[object, int]:
    tracemalloc.start()
    try:
        out = fn()
        return out, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ---- 1: the reader's lookup is sized by the store, not by the longest docid asked for ----------------
def test_one_long_docid_does_not_widen_the_lookup(tmp_path):
    docs = make_docs(9, prefix="ثبت-")  # multi-byte docids: the stored width is in UTF-8 bytes
    path = build(tmp_path / "s", make_spec(shard_size=4), docs)
    stored = list(docs)
    asked = [*stored, *(f"x{i}" for i in range(1500)), "ق" * 40_000, "ثبت-1\x00", "ثبت-\ud800", "", "🙂" * 3]
    with StoreReader(path) as reader:
        known, peak = _peak(lambda: reader.known(asked))
        # before: one [n, 40_000] UTF-32 array and its UTF-8 copy, ~360 MB for this 0.1 MB of docids
        assert peak < 4 * MB, peak
        assert known.tolist() == [True] * len(stored) + [False] * (len(asked) - len(stored))
        fetched = reader.fetch([stored[3], "ق" * 40_000, stored[0]])
        assert fetched.docids == [stored[3], stored[0]] and fetched.unknown == ["ق" * 40_000]
        with pytest.raises(StoreError, match="strings"):
            reader.known([stored[0], 7])


# ---- the service: limits before work ----------------------------------------------------------------
@pytest.fixture(scope="module")
def client(service_env):
    from aheadrank.services import create_app
    from fastapi.testclient import TestClient
    from test_service_api import make_backend  # tests/services: the same backend, warmed up

    backend = make_backend(service_env, max_docid_chars=300)
    with TestClient(create_app(backend)) as c:
        c.docids, c.backend = backend.reader.docids(), backend
        yield c
    backend.close()


def test_a_long_docid_is_refused_before_any_lookup(client):
    ids = client.docids[:20]
    r = client.post("/v1/rerank", json={"query": "q", "candidates": [*ids, "ก" * 301]})
    assert r.status_code == 413 and r.json()["kind"] == "docid_too_long", r.text
    assert "candidates.20" in r.json()["error"] and len(r.text) < 2000
    # at the limit: looked up (unknown, named), and the answer does not echo megabytes of docids
    many = [*ids, *(f"🙂{i}" * 60 for i in range(900))]
    (r, peak) = _peak(lambda: client.post("/v1/rerank", json={"query": "q", "candidates": many}))
    assert r.status_code == 404 and r.json()["kind"] == "unknown_docid", r.text
    assert len(r.text) < 30_000 and peak < 40 * MB, (len(r.text), peak)


def test_rank_fields_cannot_multiply_a_document(client):
    doc = {"title": "cell", "text": "protein " * 50, **{f"f{i}": "tumour " * 2000 for i in range(40)}}
    body = {"query": "q", "documents": [doc] * 3, "rank_fields": ["title", "text"] * 40}
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 422 and "rank_fields" in r.json()["error"], r.text
    body["rank_fields"] = [f"f{i}" for i in range(40)]  # 40 x 14,000 characters, over the 100,000 limit
    r = client.post("/v1/rerank", json=body)
    assert r.status_code == 413 and r.json()["kind"] == "document_too_long", r.text
    body["rank_fields"] = ["title", "text", "title"]  # named twice: ranked once, the same as named once
    once = client.post("/v1/rerank", json={**body, "rank_fields": ["title", "text"]})
    assert client.post("/v1/rerank", json=body).json()["results"] == once.json()["results"]


def test_documents_request_stops_building_at_the_limit():
    from aheadrank.services.schemas import DocumentsRequest, DocumentTooLong

    doc = {f"k{i}": ["ж" * 500] * 4 for i in range(30)}
    req = DocumentsRequest(query="q", documents=[doc], rank_fields=list(doc))
    with pytest.raises(DocumentTooLong):
        req.items(max_chars=5_000)
    assert len(req.items()[0]) > 30 * 2000


# ---- 8: JSON nested deep, or holding a huge number of values -----------------------------------------
def _nested(depth: int, kind: str) -> str:
    return ('{"a":' * depth + "1" + "}" * depth) if kind == "object" else ("[" * depth + "1" + "]" * depth)


@pytest.mark.parametrize("depth", [33, 180, 944, 3000])
@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/rerank", '{"query":"q","documents":[{"text":"cell","meta":%s}],"return_documents":true}'),
        ("/v2/rerank", '{"query":"q","documents":[{"text":"cell \\"]]]\\\\","x":%s}]}'),
        ("/v1/rerank", '{"query":"q","candidates":["%s"],"extra":%%s}'),
    ],
)
def test_deep_json_is_refused_before_it_is_parsed(client, path, template, depth):
    if "%%s" in template:
        template = template % client.docids[0]
    for kind in ("object", "array"):
        r = client.post(
            path, content=template % _nested(depth, kind), headers={"content-type": "application/json"}
        )
        assert r.status_code == 422 and r.json()["kind"] == "json_shape", (kind, r.status_code, r.text[:300])
        assert "nested" in r.json()["error"]


def test_json_at_the_depth_limit_and_strings_full_of_brackets_are_served(client):
    text = 'cell "[[[{{{" \\ ]]]' * 20
    meta = _nested(29, "array")  # 32 levels with the body, the list and the document
    body = (
        '{"query":"q","documents":[{"text":'
        + json.dumps(text)
        + ',"meta":'
        + meta
        + '}],"return_documents":true}'
    )
    r = client.post("/rerank", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 200, r.text
    assert r.json()["results"][0]["document"]["text"] == text


def test_a_body_of_many_tiny_values_is_refused_unparsed(client):
    body = '{"query":"q","documents":["cell"],"padding":[' + ",".join(["{}"] * 400_000) + "]}"
    r = client.post("/v2/rerank", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and r.json()["kind"] == "json_shape", r.text[:300]


# ---- 8: a long query in any script, and what a 500 writes to the log ----------------------------------
QUERIES = {  # each over Lucene's default 1,024 clauses, within the default --max-query-chars (2,000)
    "han-ext-a": "".join(chr(0x3400 + 3 * i) for i in range(1_300)),  # one term per ideograph
    "han-kana": "".join(chr(0x6000 + i) + chr(0x3041 + i % 86) for i in range(1_000)),
    "han-emoji": "".join(chr(0x7000 + i) + ("🙂" if i % 10 else "") for i in range(1_040)),
}


@pytest.mark.parametrize("name", list(QUERIES))
def test_a_long_query_with_many_distinct_terms_is_searched(client, name):
    query = QUERIES[name]
    assert len(query) <= 2_000  # within --max-query-chars: the server must answer it
    r = client.post("/v1/rerank", json={"query": query, "depth": 20})
    assert r.status_code == 200, r.text[:500]


def test_a_query_over_lucenes_clause_limit_is_a_clear_error(client):
    from aheadrank.indexer.bm25 import QueryTooComplexError

    searcher = client.backend.searcher
    limit = int(searcher._java.IndexSearcher.getMaxClauseCount())
    query = "".join(chr(0x4E00 + i) for i in range(limit + 40))
    with pytest.raises(QueryTooComplexError, match="clauses"):
        searcher.search(query, 10)
    assert searcher.search("cell protein", 5)  # the searcher still serves


def test_a_500_writes_one_short_line_not_a_traceback(client, monkeypatch, caplog):
    from aheadrank.services import create_app
    from fastapi.testclient import TestClient

    def broken(*args, **kwargs):
        raise RuntimeError("injected fault " + "x" * 8000)

    monkeypatch.setattr(client.backend.ranker, "encode_query", broken)
    caplog.set_level("INFO")
    with TestClient(create_app(client.backend), raise_server_exceptions=False) as c:
        for _ in range(3):
            r = c.post("/v1/rerank", json={"query": "cell", "candidates": client.docids[:3]})
            assert r.status_code == 500 and r.json()["kind"] == "internal", r.text
    errors = [rec for rec in caplog.records if rec.levelname in ("ERROR", "CRITICAL")]
    assert len(errors) == 3, [rec.getMessage()[:200] for rec in errors]
    for rec in errors:
        assert rec.exc_info is None and len(rec.getMessage()) < 600, rec.getMessage()[:300]
        assert json.loads(rec.getMessage())["event"] == "internal_error"
