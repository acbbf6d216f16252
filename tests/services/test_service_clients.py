"""The clients users already have, unchanged, against a real `aheadrank serve` on 127.0.0.1: the Cohere SDK
(`Client` → /v1/rerank, `ClientV2` → /v2/rerank), LiteLLM's rerank providers (cohere, jina_ai, voyage,
infinity, huggingface/TEI, hosted_vllm), LangChain's and LlamaIndex's CohereRerank. Then a client that gives up: its request is dropped between chunks."""

from __future__ import annotations

import json
import os
import socket
import time

import httpx
import pytest
from aheadrank.services.metrics import sample_sum
from services_testkit import Server

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network on import
os.environ.setdefault("LITELLM_TELEMETRY", "False")

pytestmark = pytest.mark.slow
KEY = "test-key-3f9a"
QUERY = "smoking increases the risk of lung cancer"
DOCS = [
    "Cigarette smoke and lung carcinoma in a cohort study.",
    "Bone mineral density in the elderly.",
    "Unrelated words about the weather here.",
    "Tobacco use raises the risk of cancer of the lung.",
]
CHUNKS = 4000  # the abandoned request: this many texts, one per scoring chunk (--doc-batch-size 1)


@pytest.fixture(scope="module")
def server(service_env, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"# the service's keys\n{KEY}\n")
    s = Server(
        "--checkpoint", str(service_env.checkpoint), "--no-warmup", "--no-access-log",
        "--doc-batch-size", "1", "--max-documents", str(CHUNKS), "--api-keys-file", str(keys),
    ).wait_ready()  # fmt: skip
    yield s
    assert s.stop() == 0


@pytest.fixture(scope="module")
def expected(server) -> list[int]:
    """The ranking of DOCS by the TEI shape (httpx, the reference the clients are compared with)."""
    r = httpx.post(
        server.url + "/rerank",
        json={"query": QUERY, "texts": DOCS},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return [x["index"] for x in r.json()]


# ---- Cohere SDK ------------------------------------------------------------------------------------------


def test_cohere_client_v1(server, expected):
    import cohere

    co = cohere.Client(api_key=KEY, base_url=server.url)
    docs = [DOCS[0], {"text": DOCS[1], "id": "d1"}, DOCS[2], {"text": DOCS[3], "id": "d3"}]
    out = co.rerank(model="rerank-english-v3.0", query=QUERY, documents=docs, top_n=3, return_documents=True)
    assert [r.index for r in out.results] == expected[:3]
    for r in out.results:
        assert r.document.text == DOCS[r.index] and 0.0 <= r.relevance_score <= 1.0
    raw = co.with_raw_response.rerank(model="m", query=QUERY, documents=docs, return_documents=True).data
    kept = {r.index: r.document for r in raw.results}
    assert getattr(kept[1], "id", None) == "d1"  # the client's own document fields come back
    plain = co.rerank(model="m", query=QUERY, documents=DOCS)
    assert [r.index for r in plain.results] == expected and all(r.document is None for r in plain.results)


def test_cohere_client_v2(server, expected):
    import cohere

    co = cohere.ClientV2(api_key=KEY, base_url=server.url)
    out = co.rerank(model="rerank-v3.5", query=QUERY, documents=DOCS, top_n=2)
    assert [r.index for r in out.results] == expected[:2]
    assert out.meta.api_version.version == "2"
    # a blank chunk (services/README.md): last, relevance 0.0, and the others ranked as without it
    blank = co.rerank(model="rerank-v3.5", query=QUERY, documents=[*DOCS, "  "])
    assert [(r.index, r.relevance_score) for r in blank.results][-1] == (len(DOCS), 0.0)
    assert [r.index for r in blank.results][:-1] == expected


def test_cohere_sdk_parses_our_errors(server):
    import cohere

    co = cohere.ClientV2(api_key="wrong", base_url=server.url)
    with pytest.raises(cohere.core.api_error.ApiError) as err:
        co.rerank(model="m", query=QUERY, documents=DOCS)
    assert err.value.status_code == 403 and err.value.body["message"] == "API key not accepted"


# ---- LiteLLM ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def litellm():
    import litellm

    litellm.telemetry = False
    return litellm


@pytest.mark.parametrize(
    ("model", "base", "extra"),
    [
        ("cohere/rerank-v3.5", "", {}),  # v2
        ("cohere/rerank-english-v3.0", "", {"max_chunks_per_doc": 10}),  # LiteLLM's v1 client
        ("jina_ai/jina-reranker-v2-base-multilingual", "", {}),
        ("voyage/rerank-2", "", {}),  # top_n goes as Voyage's top_k; the answer is read from `data`
        ("infinity/any", "/infinity", {}),  # Infinity's `document` is a string
        ("hosted_vllm/any", "", {}),
        ("huggingface/any", "", {}),  # TEI's {query, texts}, dict documents included
    ],
)
def test_litellm_rerank(server, expected, litellm, model, base, extra):
    docs = [DOCS[0], {"text": DOCS[1]}, DOCS[2], DOCS[3]] if model.startswith("huggingface") else DOCS
    out = litellm.rerank(
        model=model,
        query=QUERY,
        documents=docs,
        top_n=3,
        return_documents=True,
        api_base=server.url + base,
        api_key=KEY,
        **extra,
    )
    assert [r["index"] for r in out.results] == expected[:3], out
    assert [r["document"]["text"] for r in out.results] == [DOCS[i] for i in expected[:3]]


# ---- RAG frameworks: LangChain's and LlamaIndex's Cohere rerankers ----------------------------------------


def test_langchain_cohere_rerank(server, expected):
    from langchain_cohere import CohereRerank
    from langchain_core.documents import Document

    reranker = CohereRerank(model="rerank-v3.5", cohere_api_key=KEY, base_url=server.url, top_n=3)
    docs = [Document(page_content=t, metadata={"source": f"s{i}"}) for i, t in enumerate(DOCS)]
    out = reranker.compress_documents(docs, QUERY)
    assert [d.metadata["source"] for d in out] == [f"s{i}" for i in expected[:3]]
    assert all(0.0 <= d.metadata["relevance_score"] <= 1.0 for d in out)
    assert [r["index"] for r in reranker.rerank(DOCS, QUERY, top_n=2)] == expected[:2]


def test_llama_index_cohere_rerank(server, expected):
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.postprocessor.cohere_rerank import CohereRerank

    reranker = CohereRerank(model="rerank-v3.5", api_key=KEY, base_url=server.url, top_n=3, max_retries=0)
    nodes = [NodeWithScore(node=TextNode(text=t, id_=f"n{i}"), score=0.0) for i, t in enumerate(DOCS)]
    out = reranker.postprocess_nodes(nodes, QueryBundle(QUERY))
    assert [n.node.node_id for n in out] == [f"n{i}" for i in expected[:3]]
    assert all(0.0 <= n.score <= 1.0 for n in out)


# ---- shapes a client may get wrong, TEI's truncate -------------------------------------------------------


def test_a_body_of_the_wrong_shape_is_told_where_to_go(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    r = httpx.post(server.url + "/v1/rerank", json={"query": QUERY, "texts": DOCS}, headers=auth)
    assert r.status_code == 422 and "POST /rerank" in r.json()["error"], r.text
    r = httpx.post(server.url + "/v2/rerank", json={"query": QUERY, "depth": 10}, headers=auth)
    assert r.status_code == 422 and "POST /v1/rerank" in r.json()["error"], r.text
    r = httpx.post(server.url + "/rerank", content=json.dumps({"query": QUERY, "texts": DOCS}), headers=auth)
    assert r.status_code == 415 and r.json()["kind"] == "content_type", r.text  # no Content-Type


def test_tei_truncate_false_refuses_overlong_texts(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    long = " ".join(["protein"] * 400)  # more word pieces than the model reads
    body = {"query": QUERY, "texts": [DOCS[0], long]}
    r = httpx.post(server.url + "/rerank", json={**body, "truncate": False}, headers=auth, timeout=60)
    assert r.status_code == 413 and r.json()["kind"] == "input_too_long" and "texts.1" in r.text, r.text
    r = httpx.post(server.url + "/rerank", json={**body, "truncate": True}, headers=auth, timeout=60)
    assert r.status_code == 200 and len(r.json()) == 2


# ---- a client that gives up ------------------------------------------------------------------------------


def test_an_abandoned_request_frees_the_model_thread(server):
    """A request of CHUNKS scoring chunks, abandoned once it holds the model thread: the thread drops it at the
    next chunk boundary (counted in /metrics), and the next request is served. Counts, not wall-clock times."""
    body = json.dumps({"query": QUERY, "texts": [f"{DOCS[i % 4]} {i}" for i in range(CHUNKS)]}).encode()
    head = (
        f"POST /rerank HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {KEY}\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with httpx.Client(timeout=30) as http:
        before = http.get(server.url + "/metrics").text
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(head + body)
        for _ in range(1000):  # until it holds (or waits for) the model thread
            if sample_sum(http.get(server.url + "/metrics").text, "aheadrank_queue_depth") == 1:
                break
            time.sleep(0.01)
        else:
            pytest.fail("the request never reached the model thread")
        sock.close()  # the client gives up
        for _ in range(3000):  # bounded: the model thread lets go within one chunk (its count comes last)
            after = http.get(server.url + "/metrics").text
            if sample_sum(after, "aheadrank_cancelled_total", reason="client_disconnected") > sample_sum(
                before, "aheadrank_cancelled_total", reason="client_disconnected"
            ):
                break
            time.sleep(0.01)
        else:
            pytest.fail("the abandoned request still holds the model thread")
        r = http.post(
            server.url + "/rerank",
            json={"query": QUERY, "texts": DOCS[:2]},
            headers={"Authorization": f"Bearer {KEY}"},
        )
        assert r.status_code == 200, r.text
    dropped = sample_sum(after, "aheadrank_cancelled_total", reason="client_disconnected") - sample_sum(
        before, "aheadrank_cancelled_total", reason="client_disconnected"
    )
    assert dropped == 1, after
    scored = sample_sum(after, "aheadrank_chunks_total", endpoint="/rerank", outcome="scored") - sample_sum(
        before, "aheadrank_chunks_total", endpoint="/rerank", outcome="scored"
    )
    assert scored < CHUNKS, (scored, after)  # stopped early: it did not run to the end
    skipped = sample_sum(after, "aheadrank_chunks_total", endpoint="/rerank", outcome="skipped")
    assert skipped == 0 or scored + skipped == CHUNKS
