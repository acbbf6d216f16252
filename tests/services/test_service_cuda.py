"""The service on a GPU (skipped without CUDA; run on a lent machine by bench/device/checks.sh): the same ranked
lists as the CPU service over the same store, the query side replayed from CUDA graphs captured at warm-up."""

from __future__ import annotations

import pytest
import torch
from aheadrank.services import RerankBackend, ServiceSettings, create_app
from fastapi.testclient import TestClient
from services_testkit import SAMPLE

QUERY = "smoking increases the risk of lung cancer"


@pytest.fixture(scope="module")
def stored_env(tmp_path_factory, tiny_base):
    """A tiny MORES 2×IB checkpoint (random score head: the interaction decides) and its store of the sample."""
    from aheadrank.indexer.build import BuildOptions, build_dense, build_store
    from aheadrank.indexer.topics import read_beir_split
    from aheadrank.rankers import init_ranker, save_checkpoint
    from aheadrank.store import StoreReader

    from aheadrank.rerank import fit_checkpoint_priors

    root = tmp_path_factory.mktemp("cuda-service")
    ckpt, store = root / "ckpt", root / "store"
    save_checkpoint(init_ranker("mores", base=tiny_base, seed=0, ibs=2, sim=False), ckpt)
    opts = BuildOptions(str(ckpt), str(SAMPLE), str(store), shard_size=400, progress=False)
    build_store(opts)
    build_dense(opts)
    # priors with the dense prior in them (no Java on a GPU machine: each validation query's candidates are its
    # relevant documents and the store's first 30, with a made-up first-stage score; what is fitted is beside
    # the point, that the served score uses the dense query embedding is not)
    queries, qrels = read_beir_split(SAMPLE, "train")
    val = dict(sorted(queries.items())[:20])
    with StoreReader(store) as reader:
        head = reader.docids()[:30]
    candidates = {
        q: [(d, 30.0 - i) for i, d in enumerate(dict.fromkeys([*sorted(qrels.get(q, {})), *head]))]
        for q in val
    }
    fit_checkpoint_priors(ckpt, store, val, candidates, qrels, {"split": "train", "note": "test"})
    return ckpt, store


def served(device: str, ckpt, store, docids: list[str]) -> tuple[dict, dict, RerankBackend]:
    settings = ServiceSettings(checkpoint=ckpt, store=store, device=device, access_log=False, batch_size=128)
    backend = RerankBackend.load(settings)
    backend.warmup()
    with TestClient(create_app(backend)) as client:
        r = client.post("/v1/rerank", json={"query": QUERY, "candidates": docids})
        assert r.status_code == 200, r.text
        info = client.get("/v1/info").json()
    return r.json(), info, backend


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_the_gpu_service_ranks_as_the_cpu_service(stored_env):
    from aheadrank.store import StoreReader

    ckpt, store = stored_env
    with StoreReader(store) as reader:
        docids = reader.docids()[:300]
    cpu, _, cpu_backend = served("cpu", ckpt, store, docids)
    gpu, info, gpu_backend = served("cuda", ckpt, store, docids)
    try:
        assert "cuda" in str(info)
        graphs = gpu_backend.ranker.query_graphs
        # every query length the service reads (--max-query-len, which may exceed the ranker's trained length)
        # captured at warm-up, and the request replayed one of them; the dense prior alike
        assert len(graphs.graphs) == info["model"]["query_len"] + 2 and graphs.replays >= 1
        dense = gpu_backend.scorer.encoder().query_graphs
        assert len(dense.graphs) == dense.max_graphs and dense.replays >= 1
        assert "dense" in gpu["scoring"] and gpu["scoring"] == cpu["scoring"]  # the served score used it
        dense_cpu = {x["docid"]: x["dense_score"] for x in cpu["results"]}
        assert max(abs(x["dense_score"] - dense_cpu[x["docid"]]) for x in gpu["results"]) <= 1e-4
        a = {x["docid"]: x["score"] for x in cpu["results"]}
        b = {x["docid"]: x["score"] for x in gpu["results"]}
        assert a.keys() == b.keys() == set(docids)
        spread = max(a.values()) - min(a.values())
        assert max(abs(a[d] - b[d]) for d in a) <= 1e-3 * spread
        # the same order but for pairs closer than that tolerance
        order_a = [x["docid"] for x in cpu["results"]]
        order_b = [x["docid"] for x in gpu["results"]]
        for i, d in enumerate(order_b):
            j = order_a.index(d)
            if i != j:
                assert abs(a[d] - a[order_a[i]]) <= 2e-3 * spread, (d, i, j)
    finally:
        cpu_backend.close()
        gpu_backend.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_rerank_run_on_the_gpu_equals_the_cpu_run(stored_env):
    """The batch path (`aheadrank rerank-run --device cuda`: CUDA graphs for each query's side and its dense
    embedding) gives the CPU's runs, with the priors (no Java needed: the candidates are given)."""
    from aheadrank.indexer.topics import read_beir_split
    from aheadrank.store import StoreReader

    from aheadrank.runs import rerank_run

    ckpt, store = stored_env
    queries, _ = read_beir_split(SAMPLE, "test")
    queries = dict(sorted(queries.items())[:6])
    with StoreReader(store) as reader:
        head = reader.docids()[:120]
    candidates = {q: [(d, 120.0 - i) for i, d in enumerate(head)] for q in queries}
    cpu, _ = rerank_run(ckpt, store, queries, candidates, device="cpu", progress=False)
    gpu, _ = rerank_run(ckpt, store, queries, candidates, device="cuda", progress=False)
    assert cpu.keys() == gpu.keys() == queries.keys()
    for q in queries:
        spread = max(cpu[q].values()) - min(cpu[q].values())
        assert cpu[q].keys() == gpu[q].keys()
        assert max(abs(cpu[q][d] - gpu[q][d]) for d in cpu[q]) <= 1e-3 * spread
