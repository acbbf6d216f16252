"""The RAG path: Cohere-shaped requests of texts against the native docid request, online encoding and the cache.

A RAG app sends ``POST /v2/rerank {query, documents: [100 texts]}`` (Cohere v2, what its framework's
reranker speaks). Per ranker (default ``mores-2ib-s2 prettr-l5-e128 tk-2l bert``; ``bert`` is the
cross-encoder such an app would otherwise run) one ``aheadrank serve`` (``--threads``, 127.0.0.1) over a store
of the collection's first ``--store-docs`` documents, and four cells of requests of ``--texts`` documents each,
one query per request (the collection's queries in order), one client, one request at a time:

- ``native``: ``POST /v1/rerank {query, candidates: [docids]}``, documents the store holds;
- ``stored``: the same documents' texts (as the indexer read them) in the Cohere shape: looked up by text
  digest, scored from the store (services/texts.py);
- ``online``: texts the store does not hold, each sent once (the cache never helps: cold): encoded online;
- ``cached``: one fixed set of texts the store does not hold, sent once before the cell: served from the
  cache of online-encoded texts.

``online`` and ``cached`` send Cohere v2's ``max_tokens_per_doc`` = the window (``--max-doc-len``), so a long
text is read as the store read it, its first window, not as passages (the service's default for long texts,
which would encode up to ten windows of it): the online cost compared is the work the store saved.

``native``, ``stored`` and ``cached`` requests are interleaved (one of each per round, ``--requests`` rounds);
``online`` gets ``--online-requests`` (it is slow and steady). Reported per cell: the median and p90 client
latency (JSON and HTTP included) and the server's own ``total_ms``; per ranker, ``stored / native`` (target
<= 1.3) and ``online / stored`` (target >= 10, not expected for ``bert``, whose stored field is its input
embeddings: every layer runs online either way). Checks on the way: the ``stored`` cell ranks exactly as
``native`` and never encodes a document (``/metrics``), the ``cached`` one encodes nothing after its first
request. Checkpoints are untrained (``init-ranker``): fine for speed, not for rankings.

    .venv/bin/python bench/rag.py                              # bench/results/rag.json
    .venv/bin/python bench/rag.py --rankers tk-2l --requests 5 --online-requests 2 --out /tmp/rag.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx  # noqa: E402
import serve as serve_bench  # noqa: E402  (bench/serve.py: checkpoints, stores, the server process)
from aheadrank.services.metrics import sample_sum  # noqa: E402
from aheadrank.services.process import ServeProcess  # noqa: E402
from benchkit import SAMPLE, machine_info, write_record  # noqa: E402
from rich.table import Table  # noqa: E402

DEFAULT_RANKERS = ("mores-2ib-s2", "prettr-l5-e128", "tk-2l", "bert")
CELLS = ("native", "stored", "online", "cached")
console = serve_bench.console


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--collection", type=Path, default=None, help="BEIR folder (default: shared SciFact, else the sample)"
    )
    p.add_argument("--rankers", nargs="+", default=list(DEFAULT_RANKERS))
    p.add_argument("--texts", type=int, default=100, help="documents per request")
    p.add_argument("--requests", type=int, default=20, help="rounds of native, stored and cached requests")
    p.add_argument("--online-requests", type=int, default=5, help="requests of texts encoded online (cold)")
    p.add_argument(
        "--store-docs", type=int, default=1000, help="the store holds the collection's first N documents"
    )
    p.add_argument("--threads", type=int, default=2, help="server torch threads")
    p.add_argument("--max-doc-len", type=int, default=128)
    p.add_argument("--workdir", type=Path, default=Path("/tmp/aheadrank-bench-rag"))
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "rag.json")
    args = p.parse_args(argv)
    if args.collection is None:
        args.collection = serve_bench.SHARED_SCIFACT if serve_bench.SHARED_SCIFACT.is_dir() else SAMPLE
    args.overrides = {}  # what bench/serve.py's prepare() reads: untrained checkpoints only
    return args


def split_collection(args: argparse.Namespace) -> tuple[dict[str, str], dict[str, str], list[str]]:
    """(stored {docid: text}, unknown {docid: text}, queries); writes the stored part as a BEIR folder, which
    bench/serve.py's prepare() indexes (``args.collection`` is pointed at it)."""
    from aheadrank.indexer.collections import Collection
    from aheadrank.indexer.topics import read_queries

    need = args.texts * (args.online_requests + 1)
    docs = list(Collection(args.collection))
    n_stored = min(args.store_docs, len(docs) - need)
    if n_stored < args.texts:
        raise SystemExit(
            f"{args.collection}: {len(docs)} documents, too few for {args.texts} texts per request"
        )
    queries = list(read_queries(args.collection).values())
    folder = args.workdir / f"{args.collection.name}-first-{n_stored}"
    if not (folder / "corpus.jsonl").is_file():
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "corpus.jsonl").open("w") as f:  # the joined text as its body: the same text indexed
            for d in docs[:n_stored]:
                f.write(json.dumps({"_id": d.docid, "title": "", "text": d.text}) + "\n")
    args.source, args.collection = args.collection, folder
    stored = {d.docid: d.text for d in docs[:n_stored]}
    unknown = {d.docid: d.text for d in docs[n_stored : n_stored + need]}
    return stored, unknown, queries


def post(http: httpx.Client, url: str, body: dict) -> tuple[float, dict]:
    t = time.perf_counter()
    r = http.post(url, json=body)
    took = time.perf_counter() - t
    if r.status_code != 200:
        raise SystemExit(f"{url}: {r.status_code} {r.text[:300]}")
    return took, r.json()


def server_ms(body: dict) -> float:
    timings = body.get("timings") or body.get("meta", {}).get("timings", {})
    return float(timings.get("total_ms", float("nan")))


def texts_metric(http: httpx.Client, url: str, source: str) -> float:
    return sample_sum(http.get(url + "/metrics").text, "aheadrank_texts_total", source=source)


def run_ranker(target: dict, stored: dict, unknown: dict, queries: list[str], args) -> dict:
    """One server, the four cells; returns the cell timings and the checks."""
    ids, n = list(stored), args.texts
    unknown_texts = list(unknown.values())
    log = args.workdir / f"serve-{target['ranker']}.log"
    server = ServeProcess(
        ["--checkpoint", target["checkpoint"], "--store", target["store"], "--threads", str(args.threads),
         "--no-access-log", "--max-documents", str(max(n, 100))],
        log,
        clean_env=True,
    )  # fmt: skip
    cells: dict[str, dict[str, list[float]]] = {c: {"client_s": [], "server_ms": []} for c in CELLS}
    window_only = {"max_tokens_per_doc": args.max_doc_len}  # read as the store read it (module docstring)
    checks: dict = {}
    try:
        server.wait_ready(300)
        url = server.url
        with httpx.Client(trust_env=False, timeout=600) as http:

            def record(cell: str, took: float, body: dict) -> None:
                cells[cell]["client_s"].append(took)
                cells[cell]["server_ms"].append(server_ms(body))

            # online: texts the store does not hold, each sent once (cold cache)
            for i in range(args.online_requests):
                texts = unknown_texts[(i + 1) * n : (i + 2) * n]
                body = {"model": "m", "query": queries[i], "documents": texts, **window_only}
                record("online", *post(http, url + "/v2/rerank", body))
            cached_texts = unknown_texts[:n]
            body = {"model": "m", "query": queries[0], "documents": cached_texts, **window_only}
            post(http, url + "/v2/rerank", body)
            encoded_before = texts_metric(http, url, "encoded")
            stored_before = texts_metric(http, url, "stored")
            same_order = 0
            for i in range(args.requests):
                q = queries[(i + 1) % len(queries)]
                window = [ids[(i * n + j) % len(ids)] for j in range(n)]
                took, native = post(http, url + "/v1/rerank", {"query": q, "candidates": window})
                record("native", took, native)
                took, body = post(
                    http,
                    url + "/v2/rerank",
                    {"model": "m", "query": q, "documents": [stored[d] for d in window]},
                )
                record("stored", took, body)
                same_order += [window[x["index"]] for x in body["results"]] == [
                    x["docid"] for x in native["results"]
                ]
                body = {"model": "m", "query": q, "documents": cached_texts, **window_only}
                record("cached", *post(http, url + "/v2/rerank", body))
            checks = {
                "stored_ranked_as_native": f"{same_order}/{args.requests}",
                "texts_encoded_during_stored_and_cached_cells": texts_metric(http, url, "encoded")
                - encoded_before,
                "texts_looked_up_in_the_store": texts_metric(http, url, "stored") - stored_before,
            }
            metrics = http.get(url + "/metrics").text
            checks["cache"] = {
                k: sample_sum(metrics, f"aheadrank_text_cache_{k}") for k in ("hits_total", "misses_total", "evictions_total", "entries", "bytes")
            }  # fmt: skip
    finally:
        server.stop()
    out = {c: summary(v) for c, v in cells.items()}
    med = {c: out[c]["client_ms"]["p50"] for c in CELLS}
    out["ratios"] = {
        "stored_over_native": med["stored"] / med["native"],
        "online_over_stored": med["online"] / med["stored"],
        "online_over_cached": med["online"] / med["cached"],
    }
    out["checks"] = checks
    return out


def summary(cell: dict[str, list[float]]) -> dict:
    ms = sorted(1e3 * s for s in cell["client_s"])
    return {
        "requests": len(ms),
        "client_ms": {
            "p50": statistics.median(ms),
            "p90": ms[min(len(ms) - 1, int(0.9 * len(ms)))],
            "min": ms[0],
        },
        "server_total_ms_p50": statistics.median(cell["server_ms"]),
    }


def print_table(results: dict, args) -> None:
    table = Table(
        title=f"RAG path: {args.texts} texts per request, {args.threads} threads (client ms, median)"
    )
    for col in ("ranker", *CELLS, "stored/native (<=1.3)", "online/stored (>=10)", "online/cached"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        ratio = r["ratios"]
        table.add_row(
            name,
            *(f"{r[c]['client_ms']['p50']:.1f}" for c in CELLS),
            f"{ratio['stored_over_native']:.2f}",
            f"{ratio['online_over_stored']:.1f}",
            f"{ratio['online_over_cached']:.1f}",
        )
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    args = parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    stored, unknown, queries = split_collection(args)
    _, targets, spent = serve_bench.prepare(args)
    results = {}
    for target in targets:
        console.print(f"{target['ranker']}: serving {target['store_documents']} stored documents")
        results[target["ranker"]] = run_ranker(target, stored, unknown, queries, args)
        print_table(results, args)
    write_record(
        args.out,
        "rag",
        argv,
        machine_info(args.threads),
        t0,
        collection=str(args.source),
        store_documents=len(stored),
        texts_per_request=args.texts,
        requests=args.requests,
        online_requests=args.online_requests,
        prepare_s=spent,
        rankers={
            t["ranker"]: {k: t[k] for k in ("kind", "strategy", "store_bytes", "store_fields")}
            for t in targets
        },
        results=results,
    )
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
