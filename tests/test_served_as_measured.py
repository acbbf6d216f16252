"""What ``bench/label_free.py`` reports as served is what ``aheadrank serve DIR`` serves: for a label-free build with
sentence windows and documents long enough to be stored as passages, the bench's served run (its features through
``collect_features``, combined by ``runs_from`` with the build's weights) equals ``POST /v1/rerank``'s scores and
order for the same BM25 candidates, and its neural feature the service's ``neural_score``."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from aheadrank.build import BuildPlan, build, paths

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free  # noqa: E402

pytestmark = pytest.mark.slow  # Java (the BM25 stage) and a server

WORDS = (
    "wing lift drag shock flow boundary layer heat plate cone pressure supersonic laminar turbulent nozzle "
    "jet vortex panel flutter buckling shell"
).split()
QUERIES = {"q1": "supersonic flow over a cone", "q2": "heat transfer in a turbulent boundary layer"}


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_base):
    """A finished label-free MORES build of 48 passages, every sixth long enough (15 sentences) for passages."""
    rng = random.Random(11)
    root = tmp_path_factory.mktemp("served")
    lines = []
    for i in range(48):
        n = 15 if i % 6 == 0 else 3
        text = ". ".join(" ".join(rng.choices(WORDS, k=rng.randint(7, 12))) for _ in range(n)) + "."
        lines.append(json.dumps({"id": f"p{i}", "contents": text}))
    (root / "passages.jsonl").write_text("\n".join(lines) + "\n")
    out = root / "b"
    plan = BuildPlan(
        str(root / "passages.jsonl"),
        str(out),
        ranker="mores-2ib-s2",
        max_queries=40,
        base=str(tiny_base),
        progress=False,
    )
    record = build(plan, echo=lambda _: None)
    assert record.stages["store"]["passages"] and record.stages["store"]["windows"], record.stages["store"]
    return out


def test_the_bench_measures_the_served_scores(built):
    import httpx
    from services_testkit import Server

    from aheadrank.priors import read_priors

    p = paths(built)
    srv = Server(str(built), "--no-warmup").wait_ready()
    try:
        client = httpx.Client(base_url=srv.url, timeout=120)
        served = {}
        for qid, query in QUERIES.items():
            body = client.post("/v1/rerank", json={"query": query, "depth": 30}).json()
            assert body["scoring"] == "neural+bm25+dense+window", body.get("scoring")
            served[qid] = body["results"]
    finally:
        srv.stop()
    cands = {q: [(r["docid"], r["bm25_score"]) for r in rs] for q, rs in served.items()}
    qrels = {
        q: {rs[0]["docid"]: 1} for q, rs in served.items()
    }  # the bench keeps queries with a judged document
    long_docs = {f"p{i}" for i in range(0, 48, 6)}
    assert all(long_docs & {d for d, _ in c} for c in cands.values()), "no passage-stored document among them"
    vf = label_free.neural_features(p["checkpoint"], p["store"], QUERIES, cands, qrels, "cpu", False, "maxp")
    weights = read_priors(p["checkpoint"]).widest()
    assert set(weights) == {"neural", "bm25", "dense", "window"}
    run = label_free.runs_from(vf, weights)
    neural = {qid: dict(zip(q.docids, q.features["neural"], strict=True)) for qid, q in vf}
    for qid, results in served.items():
        assert {r["docid"]: r["score"] for r in results} == pytest.approx(run[qid], abs=1e-5)
        assert {r["docid"]: r["neural_score"] for r in results} == pytest.approx(neural[qid], abs=1e-5)
        assert [r["docid"] for r in results] == sorted(run[qid], key=lambda d: (-run[qid][d], d))
