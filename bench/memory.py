"""The service's memory under load without the HTTP server: the app in this process, driven through httpx's ASGI
transport by N concurrent closed-loop clients, its anonymous memory (heap) sampled every ``--every`` requests.

What `bench/serve.py`'s soak measures from outside (a real `aheadrank serve`), this measures inside, so that the
server (uvicorn, h11, sockets) can be ruled in or out, and so that Python-level growth can be traced
(``--trace``: tracemalloc, the largest growths between the first sample and the last, with their tracebacks).
Each sample also has glibc's own account (``mallinfo2``): memory malloc'd and not freed, against memory freed but
held by the allocator, which tells a native leak from fragmentation; at the end ``malloc_trim`` shows how much of
the growth the allocator can give back.

    .venv/bin/python bench/memory.py --checkpoint CKPT --store STORE --index LUCENE --requests 1200 --clients 8 \
        --out /tmp/memory.json

Prints one line per sample and writes JSON (samples, slope, the tracemalloc top when asked).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import time
import tracemalloc
from pathlib import Path

from aheadrank.services.memory import malloc_stats, trim_heap
from benchkit import least_squares_slope, proc_status, write_json  # sets the offline variables


def anon_mb() -> float:
    """RssAnon of this process (heap, thread stacks, the JVM's heap), MB."""
    return proc_status()["RssAnon"] / 1024


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--index", required=True)
    p.add_argument("--queries", default="/work/shared/data/scifact/queries.jsonl", help="BEIR queries.jsonl")
    p.add_argument("--requests", type=int, default=1200, help="measured requests (after --warmup)")
    p.add_argument("--warmup", type=int, default=40)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--depth", type=int, default=1000)
    p.add_argument("--every", type=int, default=50, help="requests between samples")
    p.add_argument(
        "--trace", action="store_true", help="tracemalloc: Python allocations that grew, with tracebacks"
    )
    p.add_argument(
        "--malloc-trim-interval-s",
        type=float,
        default=None,
        help="the service setting (default: the service's); 0: never trim",
    )
    p.add_argument(
        "--onednn-cache-capacity",
        type=int,
        default=None,
        help="the service setting (default: the service's); oneDNN's own default is 1024",
    )
    p.add_argument(
        "--candidates",
        action="store_true",
        help="send each query's BM25 docids (searched once, before the run) instead of a depth: the service "
        "then never calls Lucene, which rules the JVM in or out",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    if min(args.requests, args.clients, args.every, args.depth) < 1:
        p.error("--requests, --clients, --every and --depth must be positive")
    return args


async def drive(
    app, queries: list[str], candidates: dict[str, list[str]], args: argparse.Namespace, samples: list
) -> None:
    import httpx

    transport = httpx.ASGITransport(app=app)
    sent = {"n": 0}
    total = args.warmup + args.requests
    t0 = [time.perf_counter()]
    base = [0.0]
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=600) as http:

        async def client() -> None:
            while sent["n"] < total:
                i = sent["n"]
                sent["n"] += 1
                query = queries[i % len(queries)]
                body = {"query": query, "depth": args.depth}
                if args.candidates:
                    body = {"query": query, "candidates": candidates[query]}
                r = await http.post("/v1/rerank", json=body)
                if r.status_code != 200:
                    raise RuntimeError(f"request {i}: {r.status_code} {r.text[:300]}")
                done = i + 1 - args.warmup
                if done == 0:
                    gc.collect()
                    if args.trace:
                        tracemalloc.start(25)
                    base[0] = anon_mb()
                    t0[0] = time.perf_counter()
                    samples.append(
                        {"requests": 0, "anon_mb": round(base[0], 1), "s": 0.0, "malloc": malloc_stats()}
                    )
                elif done > 0 and done % args.every == 0:
                    a = anon_mb()
                    m = malloc_stats()
                    samples.append(
                        {
                            "requests": done,
                            "anon_mb": round(a, 1),
                            "s": round(time.perf_counter() - t0[0], 1),
                            "malloc": m,
                        }
                    )
                    heap = (
                        f"  malloc in use {m['in_use']:8.1f} MB, freed and held {m['free_held']:8.1f} MB"
                        if m
                        else ""
                    )
                    print(f"{done:6d} requests  anon {a:8.1f} MB  ({a - base[0]:+.1f}){heap}", flush=True)

        await asyncio.gather(*[client() for _ in range(args.clients)])


async def trim_metrics(app) -> dict[str, float]:
    """The service's malloc_trim count and total seconds, from its /metrics."""
    import httpx
    from aheadrank.services.metrics import sample_sum

    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1") as http:
        text = (await http.get("/metrics")).text
    return {key: sample_sum(text, f"aheadrank_malloc_trim_seconds_{key}") for key in ("count", "sum")}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from aheadrank.services.app import create_app
    from aheadrank.services.backend import RerankBackend
    from aheadrank.services.settings import ServiceSettings

    chosen = {
        name: getattr(args, name)
        for name in ("malloc_trim_interval_s", "onednn_cache_capacity")
        if getattr(args, name) is not None
    }
    settings = ServiceSettings(
        **chosen,
        checkpoint=args.checkpoint,
        store=args.store,
        index=args.index,
        max_candidates=max(1000, args.depth),
        request_timeout_s=600,
        max_queue=max(64, args.clients),
    )
    backend = RerankBackend.load(settings)
    backend.warmup()
    app = create_app(backend)
    queries = [json.loads(line)["text"] for line in open(args.queries, encoding="utf-8") if line.strip()]
    candidates: dict[str, list[str]] = {}
    if args.candidates:
        candidates = {q: [d for d, _ in backend.searcher.search(q, args.depth)] for q in set(queries)}
        queries = [q for q in queries if candidates[q]]  # a query with no BM25 hit has nothing to re-rank
    samples: list[dict] = []
    trims: dict[str, float] = {}

    async def run() -> None:
        async with app.router.lifespan_context(app):
            await drive(app, queries, candidates, args, samples)
            trims.update(await trim_metrics(app))

    t = time.perf_counter()
    asyncio.run(run())
    gc.collect()
    top, live_total = [], None
    if args.trace:
        snap = tracemalloc.take_snapshot()  # what was allocated since the first sample and is still alive
        live_total = sum(st.size for st in snap.statistics("filename")) / 2**20
        print(f"tracemalloc: {live_total:.2f} MB of Python allocations made since the first sample are alive")
        stats = snap.statistics("traceback")[:8]
        top = [
            {"size_mb": round(s.size / 2**20, 2), "count": s.count, "traceback": s.traceback.format()[-10:]}
            for s in stats
        ]
        for s in top:
            print(f"{s['size_mb']:.2f} MB in {s['count']} blocks:\n    " + "\n    ".join(s["traceback"]))
    before_trim = anon_mb()
    trimmed = trim_heap()
    after_trim = anon_mb()
    if trimmed or after_trim < before_trim:
        print(f"malloc_trim: anon {before_trim:.1f} -> {after_trim:.1f} MB")
    xs = [s["requests"] for s in samples]
    ys = [s["anon_mb"] for s in samples]
    slope = least_squares_slope(xs, ys)
    result = {
        "benchmark": "bench/memory.py",
        "command": "bench/memory.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "service": {
            "malloc_trim_interval_s": settings.malloc_trim_interval_s,
            "onednn_cache_capacity": settings.onednn_cache_capacity,
            "malloc_trims": trims.get("count"),
            "malloc_trim_seconds_total": trims.get("sum"),
        },
        "samples": samples,
        "anon_growth_mb": round(ys[-1] - ys[0], 1) if ys else None,
        "mb_per_request_least_squares": None if slope is None else round(slope, 4),
        "anon_mb_before_trim": round(before_trim, 1),
        "anon_mb_after_malloc_trim": round(after_trim, 1),
        "tracemalloc_live_mb": None if live_total is None else round(live_total, 3),
        "tracemalloc_top_live": top,
        "wall_s": round(time.perf_counter() - t, 1),
    }
    if args.out:
        write_json(args.out, result)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
