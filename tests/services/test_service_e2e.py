"""End to end: the real server (`aheadrank serve`, uvicorn, 127.0.0.1, an ephemeral port) as the containers
run it, against `aheadrank rerank-run`, direct scoring, a schemathesis run, and a wrong-fingerprint store."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from services_testkit import AHEADRANK, Server

pytestmark = pytest.mark.slow
QUERIES = {
    "q1": "smoking increases the risk of lung cancer",
    "q2": "vitamin D deficiency and bone density",
    "q3": "gene expression in tumour cells",
}


@pytest.fixture(scope="module")
def server(service_env):
    s = Server(
        "--checkpoint",
        str(service_env.checkpoint),
        "--store",
        str(service_env.store),
        "--index",
        str(service_env.lucene),
        "--max-candidates",
        "500",
        "--max-documents",
        "200",
        "--max-body-bytes",
        "100000",
        "--no-access-log",
    ).wait_ready()
    yield s
    code = s.stop()
    assert code == 0, "the server did not shut down cleanly on SIGTERM"


def test_server_ranking_equals_rerank_run(server, service_env, tmp_path):
    queries = tmp_path / "queries.tsv"
    queries.write_text("".join(f"{q}\t{t}\n" for q, t in QUERIES.items()))
    run_file = tmp_path / "run.trec"
    cli = subprocess.run(
        [AHEADRANK, "rerank-run", "--checkpoint", str(service_env.checkpoint), "--store", str(service_env.store),
         "--index", str(service_env.lucene), "--queries", str(queries), "--depth", "100", "--out", str(run_file)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    from aheadrank.evaluation import ranking, read_run

    run = read_run(run_file)
    for qid, text in QUERIES.items():
        r = httpx.post(server.url + "/v1/rerank", json={"query": text, "depth": 100}, timeout=60)
        assert r.status_code == 200, r.text
        got = [x["docid"] for x in r.json()["results"]]
        assert got == ranking(run[qid]), qid
        scores = {x["docid"]: x["score"] for x in r.json()["results"]}
        assert all(scores[d] == pytest.approx(s, rel=1e-5, abs=1e-6) for d, s in run[qid].items())


def test_compatible_endpoint_equals_scoring_the_texts(server, service_env):
    from aheadrank.rankers import load_ranker

    ranker = load_ranker(service_env.checkpoint)
    docs = [
        "Cigarette smoke and lung carcinoma.",
        "Bone mineral density in the elderly.",
        "Unrelated words here.",
    ]
    direct = ranker.score_pairs(QUERIES["q1"], docs).tolist()
    scale = max(abs(s) for s in direct)
    r = httpx.post(
        server.url + "/rerank", json={"query": QUERIES["q1"], "documents": docs, "raw_scores": True}
    )
    assert r.status_code == 200, r.text
    for x in r.json()["results"]:
        assert x["relevance_score"] == pytest.approx(direct[x["index"]], abs=1e-4 * scale)


def test_time_budgets_on_the_real_server(server):
    body = {"query": QUERIES["q1"], "depth": 500}
    full = httpx.post(server.url + "/v1/rerank", json=body, timeout=60).json()
    assert full["reranked"] == full["candidates"] > 100
    none = httpx.post(server.url + "/v1/rerank", json={**body, "time_budget_ms": 0.01}).json()
    assert none["reranked"] == 0 and [x["docid"] for x in none["results"]][:5] != []
    bm25 = [x["bm25_score"] for x in none["results"]]
    assert bm25 == sorted(bm25, reverse=True)
    ample = httpx.post(server.url + "/v1/rerank", json={**body, "time_budget_ms": 30_000}).json()
    assert ample["reranked"] == ample["candidates"]
    headers = httpx.post(server.url + "/v1/rerank", json={**body, "time_budget_ms": 30_000}).headers
    assert "score;dur=" in headers["server-timing"]


def test_wrong_fingerprint_store_is_refused_at_start(service_env):
    from aheadrank.rankers import read_fingerprint

    s = Server("--checkpoint", str(service_env.other_checkpoint), "--store", str(service_env.store))
    try:
        s.proc.wait(timeout=120)
    finally:
        s.stop()
    out = s.output()
    assert s.proc.returncode == 2, out
    assert (
        read_fingerprint(service_env.other_checkpoint) in out
        and read_fingerprint(service_env.checkpoint) in out
    )
    assert "refusing to start" in out and "Traceback" not in out


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [AHEADRANK, "serve", "--checkpoint", str(tmp_path / "none"), "--port", "0"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and "error:" in proc.stderr and "Traceback" not in proc.stderr


def test_schemathesis_finds_no_server_errors(server):
    """Positive and negative cases for every operation of the live OpenAPI schema (bounded: 25 each)."""
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/rerank", "/rerank", "/v1/info", "/health"}
    seen = {"cases": 0}
    for op in operations:
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if op.method.upper() == "POST" else [])
        for mode in modes:  # a GET without parameters has nothing to negate

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(
                max_examples=int(os.environ.get("AHEADRANK_FUZZ_EXAMPLES", "25")),
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def check(case):
                response = case.call(timeout=60)
                seen["cases"] += 1
                assert response.status_code < 500, (case.method, case.path, case.body, response.text)

            check()
    assert seen["cases"] >= 50
    errors = [line for line in server.output().splitlines() if '"level": "error"' in line]
    assert not errors, errors[:3]  # nothing went wrong behind a 4xx either


def test_memory_bench_drives_the_app_in_process(service_env, tmp_path):
    """bench/memory.py: the app in-process under concurrent clients, anonymous memory sampled, tracemalloc's
    live allocations reported, JSON written (a smoke run: 20 requests, depth 20)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "memory.json"
    bench = Path(__file__).resolve().parents[2] / "bench" / "memory.py"
    cmd = [
        sys.executable, str(bench), "--checkpoint", str(service_env.checkpoint), "--store", str(service_env.store),
        "--index", str(service_env.lucene), "--queries", str(service_env.collection / "queries.jsonl"),
        "--requests", "20", "--warmup", "4", "--clients", "4", "--depth", "20", "--every", "10", "--trace",
        "--out", str(out),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert [s["requests"] for s in result["samples"]] == [0, 10, 20]
    assert all(s["anon_mb"] > 0 for s in result["samples"])
    assert result["tracemalloc_top_live"] and result["mb_per_request_least_squares"] is not None
    assert result["tracemalloc_live_mb"] is not None and result["tracemalloc_live_mb"] >= 0
