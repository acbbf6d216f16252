"""Bounded load test of the reranker service: `aheadrank serve` under N concurrent closed-loop clients.

For each ranker (default ``tk-2l mores-2ib-s2 bert``; ``bert`` is the cross-encoder reference, served the
same way: its store holds only the input embeddings and all its layers run online) the script starts
``aheadrank serve`` as a subprocess on 127.0.0.1 (the container's entry point), waits for ``/ready``, then
for each depth runs ``--clients`` concurrent clients for ``--seconds``, each sending
``POST /v1/rerank {"query", "depth"}`` in a closed loop, queries cycling through the collection's queries
(every ranker sees the same sequence). Per request: status, client-side latency and the response's
``timings``; every ``--sample-interval`` s the server's resident memory (/proc/<pid>/status). Reported per
(ranker, depth): requests/s and its ratio to ``bert``'s at the same depth, p50/p95/p99 of the client latency
and of each server stage, errors by status (a 503 from the bounded queue is an error), peak RSS, RSS at the
start and end of the run and its slope in MB/min.

Prepared once and cached in ``--workdir``: the BM25 index of the collection, untrained checkpoints
(``rankers.init_ranker``; or ``--checkpoint NAME=DIR`` for trained ones) and their stores. Untrained
weights run exactly the same computation as trained ones, so they are fine for speed, not for rankings.

Bounded: after preparation, the run takes at most the bound printed at the start (per ranker: start-up
within ``--ready-timeout``; per depth: waiting for an idle server, ``--warmup`` requests and the drain of
requests still in flight at the end of the window, each within ``--request-timeout``, plus ``--seconds``).
Exit code 1 if any request failed (or a server did not start or stop cleanly), 130 if interrupted; the JSON
is written first either way.

    .venv/bin/python bench/serve.py --quick --out /tmp/serve-quick.json     # smoke run: 2 clients x 5 s
    .venv/bin/python bench/serve.py                                        # full run, bench/results/serve.json
    .venv/bin/python bench/serve.py --rankers tk-2l --depths 100 --clients 4 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import itertools
import json
import os
import re
import signal
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx  # noqa: E402
import numpy as np  # noqa: E402
from aheadrank.services.process import AHEADRANK, ServeProcess  # noqa: E402
from benchkit import (  # noqa: E402
    SAMPLE,
    cpu_sample,
    least_squares_slope,
    lower_envelope,
    machine_info,
    proc_status,
)
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

console = Console(width=None if sys.stdout.isatty() else 160)
SHARED_SCIFACT = REPO.parent / "shared" / "data" / "scifact"
DEFAULT_RANKERS = ("tk-2l", "mores-2ib-s2", "bert")
STAGES = ("queue_ms", "bm25_ms", "query_ms", "fetch_ms", "score_ms", "total_ms")
STOP_SIGNALS = tuple(
    sig for sig in (signal.SIGINT, signal.SIGTERM) if signal.getsignal(sig) is not signal.SIG_IGN
)
STOP_TIMEOUT = 30.0  # SIGTERM, then SIGKILL (the server's own graceful shutdown takes at most 10 s)


# ---- arguments --------------------------------------------------------------------------------------------
# --paths: the service's flag for each path (the compiled path is not served: bench/speed.py --paths measures it
# slower than the native one for every ranker, docs/performance.md)
PATH_FLAGS = {"native": ["--native", "all"], "reference": ["--native", "none"]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--collection",
        type=Path,
        default=None,
        help=f"BEIR folder (default {SHARED_SCIFACT} if present, else the bundled sample; --quick: the sample)",
    )
    p.add_argument(
        "--queries", type=Path, default=None, help="queries file or folder (default: the collection's)"
    )
    p.add_argument(
        "--rankers",
        nargs="+",
        default=list(DEFAULT_RANKERS),
        help="variant names (rankers/variants.py: bert, mores-<K>ib-s1|s2|mean|tied, prettr-l<l>-e<e>, tk-<n>l) "
        "or names given by --checkpoint",
    )
    p.add_argument(
        "--checkpoint",
        action="append",
        default=[],
        metavar="NAME=DIR",
        help="serve this (trained) checkpoint as ranker NAME instead of an untrained one (repeat)",
    )
    p.add_argument("--depths", type=int, nargs="+", default=None, help="BM25 depths (default 100 1000)")
    p.add_argument("--clients", type=int, default=None, help="concurrent closed-loop clients (default 8)")
    p.add_argument("--seconds", type=float, default=None, help="measured window per depth (default 60)")
    p.add_argument("--warmup", type=int, default=3, help="sequential requests per depth before the window")
    p.add_argument(
        "--request-timeout",
        type=float,
        default=600.0,
        help="per request, the client's and the server's deadline (--request-timeout-s); a timeout is an error",
    )
    p.add_argument("--ready-timeout", type=float, default=300.0, help="server start-up until /ready")
    p.add_argument("--sample-interval", type=float, default=0.5, help="seconds between RSS samples")
    p.add_argument("--threads", type=int, default=None, help="server torch threads (default: torch's choice)")
    p.add_argument("--max-doc-len", type=int, default=128, help="document word pieces of the new checkpoints")
    p.add_argument(
        "--serve-arg",
        action="append",
        default=[],
        metavar="ARG",
        help="extra argument for `aheadrank serve`, e.g. --serve-arg=--max-queue=4 (repeat)",
    )
    p.add_argument(
        "--paths",
        nargs="+",
        default=["native"],
        choices=list(PATH_FLAGS),
        help="per ranker one server per path in this run: native (the hand-written kernels, the default) or"
        " reference (--native none: PyTorch's code, what a machine without AVX-512 runs)",
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/aheadrank-bench-serve"))
    p.add_argument(
        "--save-requests", action="store_true", help="also write every request's record to the JSON"
    )
    p.add_argument(
        "--quick", action="store_true", help="smoke run: 2 clients x 5 s, depth 100, the bundled sample"
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "serve.json")
    args = p.parse_args(argv)
    q = args.quick
    if args.collection is None:
        args.collection = SAMPLE if q or not SHARED_SCIFACT.is_dir() else SHARED_SCIFACT
    if args.depths is None:
        args.depths = [100] if q else [100, 1000]
    if args.clients is None:
        args.clients = 2 if q else 8
    if args.seconds is None:
        args.seconds = 5.0 if q else 60.0
    args.overrides = {}
    for item in args.checkpoint:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            p.error(f"--checkpoint {item!r}: expected NAME=DIR")
        args.overrides[name] = Path(path)
    unused = [name for name in args.overrides if name not in args.rankers]
    if unused:
        p.error(f"--checkpoint given for {unused}, which --rankers does not name")
    unknown = [r for r in args.rankers if known_variant(r) is None and r not in args.overrides]
    if unknown:
        p.error(
            f"unknown ranker(s) {unknown}: use a variant name (rankers/variants.py) or --checkpoint NAME=DIR"
        )
    if min(args.depths) < 1 or args.clients < 1 or args.seconds <= 0 or args.warmup < 0:
        p.error("--depths and --clients must be >= 1, --seconds > 0, --warmup >= 0")
    if not args.collection.exists():
        p.error(f"collection {args.collection} not found")
    if not AHEADRANK.exists():
        p.error(f"{AHEADRANK} not found: run with the project's venv (.venv/bin/python)")
    return args


def time_bound(args: argparse.Namespace) -> float:
    """Worst-case wall time after preparation (see the module docstring)."""
    rt = args.request_timeout
    per_depth = rt + args.warmup * rt + args.seconds + rt
    return (
        len(args.rankers)
        * len(args.paths)
        * (args.ready_timeout + len(args.depths) * per_depth + STOP_TIMEOUT)
    )


# ---- preparation (cached in --workdir) -----------------------------------------------------------------------
def collection_key(path: Path) -> str:
    resolved = path.resolve()
    return f"{resolved.name}-{hashlib.sha1(str(resolved).encode()).hexdigest()[:8]}"


def known_variant(name: str):
    """The registry's variant of that name (rankers/variants.py), or None for a --checkpoint NAME of one's own."""
    from aheadrank.rankers.variants import parse_variant

    from aheadrank.errors import CheckpointError

    try:
        return parse_variant(name)
    except CheckpointError:
        return None


def prepare(args: argparse.Namespace) -> tuple[Path, list[dict], dict]:
    """The BM25 index, one checkpoint + store per ranker; returns (index, targets, seconds spent)."""
    import torch
    from aheadrank.indexer.bm25 import is_lucene_index
    from aheadrank.indexer.build import BuildOptions, build_store, release_rankers
    from aheadrank.rankers import read_fingerprint, save_checkpoint
    from aheadrank.rankers.checkpoint import load_config
    from aheadrank.rankers.variants import parse_variant
    from aheadrank.store import read_manifest

    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    key = collection_key(args.collection)
    progress = sys.stderr.isatty()
    spent: dict = {}

    lucene = work / f"lucene-{key}"
    if not is_lucene_index(lucene):
        from aheadrank.indexer.bm25 import build_bm25_index

        console.print(f"building the BM25 index of {args.collection} -> {lucene}")
        t = time.perf_counter()
        build_bm25_index(args.collection, lucene, progress=progress)
        spent["bm25"] = time.perf_counter() - t

    targets = []
    for name in args.rankers:
        trained = name in args.overrides
        if trained:
            ckpt = args.overrides[name].resolve()
        else:
            ckpt = work / f"ckpt-{name}-untrained-d{args.max_doc_len}"
            if not (ckpt / "fingerprint.json").is_file():
                console.print(f"initialising an untrained {name} checkpoint -> {ckpt}")
                save_checkpoint(parse_variant(name).init(max_doc_len=args.max_doc_len), ckpt)
        kind = load_config(ckpt).kind
        variant = known_variant(name)
        strategy = variant.strategy if variant is not None and variant.kind == kind else None
        fp = read_fingerprint(ckpt)
        store = work / f"store-{name}-{key}-{fp[:12]}"
        done = (store / "manifest.json").is_file() and read_manifest(store).complete
        if not done:
            console.print(f"building the {name} store of {args.collection} -> {store}")
            torch.set_num_threads(os.cpu_count() or 1)
            t = time.perf_counter()
            build_store(
                BuildOptions(
                    str(ckpt), str(args.collection), str(store), strategy=strategy, progress=progress
                )
            )
            spent[f"store {name}"] = time.perf_counter() - t
        manifest = read_manifest(store)
        targets.append(
            {
                "ranker": name,
                "kind": kind,
                "strategy": strategy,
                "trained": trained,
                "checkpoint": str(ckpt),
                "fingerprint": fp,
                "store": str(store),
                "store_documents": manifest.n_docs,
                "store_bytes": manifest.n_bytes,
                "store_fields": manifest.spec.fields,
            }
        )
    release_rankers()  # the build's model cache: not needed in this (client) process any more
    return lucene, targets, spent


def load_queries(args: argparse.Namespace) -> list[str]:
    from aheadrank.indexer.topics import read_queries

    source = args.queries or (args.collection if args.collection.is_dir() else args.collection.parent)
    queries = list(read_queries(source).values())
    if not queries:
        raise SystemExit(f"no queries in {source}")
    return queries


# ---- the server --------------------------------------------------------------------------------------------------
def proc_cpu_ticks(pid: int) -> int:
    try:
        return sum(int(v) for v in Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[11:13])
    except (OSError, ValueError):
        return 0


class BenchServer(ServeProcess):
    """`aheadrank serve` for one ranker, configured only by its flags (AHEADRANK_* variables are not passed
    on); it gets SIGTERM if the benchmark dies, so no server outlives it."""

    def __init__(
        self, target: dict, lucene: Path, args: argparse.Namespace, log_path: Path, path: str = "native"
    ):
        super().__init__(
            [
                "--checkpoint", target["checkpoint"],
                "--store", target["store"],
                "--index", str(lucene),
                "--max-candidates", str(max(1000, *args.depths)),
                # the server's own deadline (default 30 s) as long as the client's: a closed-loop load test
                # measures throughput, and 8 clients queued behind bert at depth 1000 wait minutes by design
                "--request-timeout-s", str(args.request_timeout),
                "--no-access-log",
                *(["--threads", str(args.threads)] if args.threads else []),
                *args.serve_arg,
                *PATH_FLAGS[path],
            ],
            log_path,
            clean_env=True,
        )  # fmt: skip

    def info(self) -> dict | None:
        try:
            return httpx.get(self.url + "/v1/info", timeout=10.0, trust_env=False).json()
        except (httpx.HTTPError, ValueError):
            return None

    def stop(self) -> int:
        return super().stop(STOP_TIMEOUT)

    def log_problems(self) -> list[str]:
        """Warning and error lines of the server's (JSON lines) log, and anything that is not JSON."""
        out = []
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return out
        for line in lines:
            try:
                level = json.loads(line).get("level", "")
            except (ValueError, AttributeError):
                level = "raw"
            if level not in ("info", "debug"):
                out.append(line[:500])
        return out


# ---- the load ------------------------------------------------------------------------------------------------------
async def one_request(
    http: httpx.AsyncClient, url: str, query: str, depth: int, timeout: float, t0: float
) -> dict:
    start = time.perf_counter()
    rec: dict = {"start": start - t0}
    try:
        r = await asyncio.wait_for(http.post(url, json={"query": query, "depth": depth}), timeout)
    except (asyncio.TimeoutError, httpx.TimeoutException):
        rec["status"] = "timeout"
    except httpx.HTTPError as exc:
        rec["status"] = type(exc).__name__
    else:
        rec["status"] = str(r.status_code)
        try:
            body = r.json()
        except ValueError:
            body = {}
        if r.status_code == 200:
            rec["timings"] = {s: float(body["timings"].get(s, 0.0)) for s in STAGES}
            rec["candidates"] = body["candidates"]
            rec["reranked"] = body["reranked"]
            rec["missing"] = len(body.get("missing_from_store", []))
        else:
            rec["retry_after"] = r.headers.get("retry-after")
            rec["kind"] = body.get("kind") if isinstance(body, dict) else None
            rec["message"] = (body.get("error") if isinstance(body, dict) else None) or r.text[:200]
    end = time.perf_counter()
    rec["end"] = end - t0
    rec["latency_ms"] = (end - start) * 1e3
    return rec


async def queue_depth(http: httpx.AsyncClient, url: str) -> float | None:
    try:
        text = (await http.get(url + "/metrics", timeout=5.0)).text
    except httpx.HTTPError:
        return None
    m = re.search(r"^aheadrank_queue_depth (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


async def wait_idle(http: httpx.AsyncClient, url: str, timeout: float, alive) -> float:
    """Wait (at most ``timeout``) until no request waits for or holds the model: work of requests the
    client gave up on (timeouts) would otherwise run inside the next window."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout and alive():
        if not await queue_depth(http, url):
            break
        await asyncio.sleep(0.25)
    return time.perf_counter() - t0


async def sample_memory(pid: int, t0: float, interval: float, samples: list, stop: asyncio.Event) -> None:
    while True:
        s = proc_status(pid)
        if s is not None and "VmRSS" in s:
            samples.append((time.perf_counter() - t0, s))
        try:
            await asyncio.wait_for(stop.wait(), interval)
            return
        except asyncio.TimeoutError:
            pass


async def run_cell(server: ServeProcess, queries: list[str], depth: int, args: argparse.Namespace) -> dict:
    url = server.url + "/v1/rerank"
    n = args.clients + 2
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    timeout = httpx.Timeout(args.request_timeout, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as http:
        idle_before = await wait_idle(http, server.url, args.request_timeout, server.alive)
        warm = []
        for i in range(args.warmup):  # from the end of the query list: the window starts at query 0
            q = queries[-1 - i % len(queries)]
            warm.append(await one_request(http, url, q, depth, args.request_timeout, time.perf_counter()))
        counter = itertools.count()
        records: list[dict] = []
        samples: list = []
        stop = asyncio.Event()
        t0 = time.perf_counter()
        deadline = t0 + args.seconds

        async def client() -> None:
            while time.perf_counter() < deadline and server.alive():
                q = queries[next(counter) % len(queries)]
                rec = await one_request(http, url, q, depth, args.request_timeout, t0)
                records.append(rec)
                if rec.get("retry_after"):  # 503 from the bounded queue: back off as told (still an error)
                    with contextlib.suppress(ValueError):
                        pause = min(float(rec["retry_after"]), deadline - time.perf_counter())
                        await asyncio.sleep(max(0.0, pause))

        cpu0, server0 = cpu_sample(), proc_cpu_ticks(server.pid)
        sampler = asyncio.create_task(sample_memory(server.pid, t0, args.sample_interval, samples, stop))
        try:
            await asyncio.gather(*(client() for _ in range(args.clients)))
            t_end = time.perf_counter()
            cpu1, server1 = cpu_sample(), proc_cpu_ticks(server.pid)
        finally:
            stop.set()
            await sampler
    return {
        "depth": depth,
        "records": records,
        "warmup": warm,
        "samples": samples,
        "wall_s": t_end - t0,
        "idle_wait_s": idle_before,
        "cpu": cpu_usage(cpu0, cpu1, server1 - server0),
        "server_alive": server.alive(),
    }


async def run_cell_interruptible(
    server: ServeProcess, queries: list[str], depth: int, args: argparse.Namespace
) -> dict | None:
    """run_cell, or None on SIGINT/SIGTERM: the signal cancels this task, so every request, the connection
    pool and the sampler unwind in order (a KeyboardInterrupt raised at an arbitrary point inside the event
    loop can leave httpx's pool waiting forever)."""
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    for sig in STOP_SIGNALS:
        loop.add_signal_handler(sig, me.cancel)
    try:
        return await run_cell(server, queries, depth, args)
    except asyncio.CancelledError:
        return None
    finally:
        for sig in STOP_SIGNALS:
            loop.remove_signal_handler(sig)


def measure(server: ServeProcess, queries: list[str], depth: int, args: argparse.Namespace) -> dict:
    try:
        cell = asyncio.run(run_cell_interruptible(server, queries, depth, args))
    finally:
        install_signal_handlers()
    if cell is None:
        raise KeyboardInterrupt
    return cell


def cpu_usage(a: tuple[float, int, int], b: tuple[float, int, int], server_ticks: int) -> dict:
    """Cores used over the window by the server, by this (client) process and by everything else."""
    dt = b[0] - a[0]
    hz = os.sysconf("SC_CLK_TCK")
    if dt <= 0 or b[1] == 0:
        return {"server_cores": None, "client_cores": None, "other_cores": None}
    machine, own = (b[1] - a[1]) / hz / dt, (b[2] - a[2]) / hz / dt
    server = server_ticks / hz / dt
    return {
        "server_cores": round(server, 2),
        "client_cores": round(own, 2),
        "other_cores": round(max(0.0, machine - server - own), 2),
    }


# ---- numbers ---------------------------------------------------------------------------------------------------------
def pct(values: list[float]) -> dict | None:
    if not values:
        return None
    a = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(a, [50, 95, 99])
    return {
        "p50": round(float(p50), 3),
        "p95": round(float(p95), 3),
        "p99": round(float(p99), 3),
        "mean": round(float(a.mean()), 3),
        "max": round(float(a.max()), 3),
    }


def slope_mb_min(t: list[float], mb: list[float]) -> float | None:
    if len(t) < 3 or t[-1] - t[0] <= 0:
        return None
    per_s = least_squares_slope(t, mb)
    return None if per_s is None else round(per_s * 60.0, 2)


def late(t: list[float], values: list[float]) -> tuple[list[float], list[float]]:
    """The second half of a series (by time): past the allocations of the first requests."""
    half = (t[0] + t[-1]) / 2
    keep = [i for i, x in enumerate(t) if x >= half]
    return [t[i] for i in keep], [values[i] for i in keep]


FLOOR_WINDOW_S = 60.0  # windows of the anonymous-memory floor (the service trims every 10 s by default)


def memory_summary(samples: list) -> dict:
    if not samples:
        return {"samples": 0}
    t = [round(s[0], 2) for s in samples]
    rss = [s[1]["VmRSS"] / 1024 for s in samples]
    anon = [s[1].get("RssAnon", 0) / 1024 for s in samples]
    file = [s[1].get("RssFile", 0) / 1024 for s in samples]
    return {
        "samples": len(samples),
        "rss_start_mb": round(rss[0], 1),
        "rss_end_mb": round(rss[-1], 1),
        "rss_peak_mb": round(max(rss), 1),
        "rss_hwm_mb": round(samples[-1][1].get("VmHWM", 0) / 1024, 1),
        "rss_slope_mb_min": slope_mb_min(t, rss),
        "anon_start_mb": round(anon[0], 1),
        "anon_end_mb": round(anon[-1], 1),
        "anon_slope_mb_min": slope_mb_min(t, anon),
        "anon_slope_late_mb_min": slope_mb_min(*late(t, anon)),
        # the per-minute minima (what the service's periodic malloc_trim leaves): growth a trim does not return
        "anon_floor_slope_mb_min": slope_mb_min(*lower_envelope(t, anon, FLOOR_WINDOW_S)),
        "file_start_mb": round(file[0], 1),
        "file_end_mb": round(file[-1], 1),
        "series": {
            "t_s": t,
            "rss_mb": [round(x, 1) for x in rss],
            "anon_mb": [round(x, 1) for x in anon],
            "file_mb": [round(x, 1) for x in file],
        },
    }


def summarise(name: str, cell: dict, args: argparse.Namespace) -> dict:
    recs = cell["records"]
    ok = [r for r in recs if r["status"] == "200"]
    failed = [r for r in recs if r["status"] != "200"]
    warm_failed = [r for r in cell["warmup"] if r["status"] != "200"]
    busy = max((r["end"] for r in recs), default=0.0)
    examples: dict[str, str] = {}
    for r in failed + warm_failed:
        examples.setdefault(r["status"], f"{r.get('kind') or ''} {r.get('message') or ''}".strip())
    per_second = [0] * (int(busy) + 1)
    for r in ok:
        per_second[int(r["end"])] += 1
    out = {
        "ranker": name,
        "depth": cell["depth"],
        "requests": len(recs),
        "ok": len(ok),
        "errors": len(failed),
        "errors_by_status": dict(Counter(r["status"] for r in failed)),
        "warmup_requests": len(cell["warmup"]),
        "warmup_errors_by_status": dict(Counter(r["status"] for r in warm_failed)),
        "error_examples": examples,
        "window_s": args.seconds,
        "busy_s": round(busy, 3),
        "requests_per_s": round(len(ok) / busy, 4) if busy > 0 else 0.0,
        "requests_per_s_in_window": round(sum(r["end"] <= args.seconds for r in ok) / args.seconds, 4),
        "completions_per_second": per_second,
        "latency_ms": pct([r["latency_ms"] for r in ok]),
        "error_latency_ms": pct([r["latency_ms"] for r in failed]),
        "stages_ms": {s: pct([r["timings"][s] for r in ok]) for s in STAGES},
        "candidates_mean": round(float(np.mean([r["candidates"] for r in ok])), 1) if ok else None,
        "reranked_mean": round(float(np.mean([r["reranked"] for r in ok])), 1) if ok else None,
        "missing_from_store": sum(r["missing"] for r in ok),
        "memory": memory_summary(cell["samples"]),
        "cpu": cell["cpu"],
        "idle_wait_s": round(cell["idle_wait_s"], 2),
        "server_alive_after": cell["server_alive"],
    }
    if args.save_requests:
        out["request_records"] = recs
    return out


def add_ratios(cells: list[dict]) -> None:
    bert = {c["depth"]: c["requests_per_s"] for c in cells if c["ranker"] == "bert"}
    for c in cells:
        ref = bert.get(c["depth"])
        c["throughput_vs_bert"] = round(c["requests_per_s"] / ref, 2) if ref else None


# ---- output ------------------------------------------------------------------------------------------------------------
def ms(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def three(p: dict | None) -> str:
    return "—" if p is None else f"{ms(p['p50'])} / {ms(p['p95'])} / {ms(p['p99'])}"


def num(v: float | None, fmt: str = "{:+.1f}") -> str:
    return "—" if v is None else fmt.format(v)


def print_tables(cells: list[dict], args: argparse.Namespace, n_docs: int | None) -> None:
    title = (
        f"aheadrank serve under load — {args.clients} clients × {args.seconds:g} s per depth, "
        f"{args.collection.name} ({n_docs if n_docs is not None else '?'} docs)"
    )
    t = Table(title=title)
    for col in (
        "ranker",
        "depth",
        "req/s",
        "× bert",
        "ok",
        "errors",
        "latency ms p50 / p95 / p99",
        "RSS MB start → end",
        "peak",
        "MB/min RSS · anon · anon late · anon floor",
        "cores srv/cli/other",
    ):
        t.add_column(col, justify="right")
    for c in cells:
        m, cpu = c["memory"], c["cpu"]
        errs = ", ".join(f"{k}: {v}" for k, v in {**c["errors_by_status"]}.items()) or "0"
        if c["warmup_errors_by_status"]:
            errs += (
                " (warm-up: " + ", ".join(f"{k}: {v}" for k, v in c["warmup_errors_by_status"].items()) + ")"
            )
        t.add_row(
            c["ranker"],
            str(c["depth"]),
            f"{c['requests_per_s']:.2f}",
            num(c["throughput_vs_bert"], "{:.1f}×"),
            str(c["ok"]),
            f"[red]{errs}[/]" if errs != "0" else errs,
            three(c["latency_ms"]),
            f"{m['rss_start_mb']:,.0f} → {m['rss_end_mb']:,.0f}" if m["samples"] else "—",
            f"{m['rss_peak_mb']:,.0f}" if m["samples"] else "—",
            " · ".join(
                num(m.get(k))
                for k in (
                    "rss_slope_mb_min",
                    "anon_slope_mb_min",
                    "anon_slope_late_mb_min",
                    "anon_floor_slope_mb_min",
                )
            ),
            "/".join(num(cpu[k], "{:.1f}") for k in ("server_cores", "client_cores", "other_cores")),
        )
    console.print(t)
    s = Table(title="server stages, ms p50 / p95 / p99 (from the responses' timings)")
    for col in ("ranker", "depth", *(x.removesuffix("_ms") for x in STAGES)):
        s.add_column(col, justify="right")
    for c in cells:
        s.add_row(c["ranker"], str(c["depth"]), *(three(c["stages_ms"][x]) for x in STAGES))
    console.print(s)
    console.print(
        "req/s: successful requests / time until the last one ended (the model thread is busy throughout); "
        "MB/min: least-squares slope of the server's RSS over the window, of its anonymous memory (heap: "
        "leaks show here; RSS also counts store pages mapped so far), and of anon over the window's second "
        "half; cores: server / this client / other processes"
        + ("; windows under 30 s: slopes are start-up noise" if args.seconds < 30 else "")
    )


# ---- main --------------------------------------------------------------------------------------------------------------
def _terminate(signum, frame):  # SIGTERM: unwind like Ctrl-C, so every server is stopped
    raise KeyboardInterrupt


def install_signal_handlers() -> None:
    """Outside the event loop: SIGINT (unless ignored, as under nohup) and SIGTERM raise KeyboardInterrupt."""
    if signal.SIGINT in STOP_SIGNALS:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _terminate)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    t_start = time.perf_counter()
    import torch

    info = machine_info(args.threads or torch.get_num_threads())
    info["server_torch_threads"] = args.threads or f"torch default ({torch.get_num_threads()})"
    console.print(f"[bold]{info['cpu']}[/], {info['cpu_count']} cores, commit {info['git_commit']}")
    lucene, targets, prep = prepare(args)
    queries = load_queries(args)
    untrained = [t["ranker"] for t in targets if not t["trained"]]
    if untrained:
        console.print(
            f"[yellow]untrained weights[/] for {', '.join(untrained)}: the same computation as trained ones, "
            "so fine for speed; rankings are meaningless"
        )
    bound = time_bound(args)
    console.print(
        f"{len(queries)} queries; {', '.join(args.rankers)} × depths {args.depths}, {args.clients} clients × "
        f"{args.seconds:g} s; at most {bound:,.0f} s after preparation (the worst case: every wait at its "
        "timeout)"
    )
    logs = args.workdir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cells: list[dict] = []
    servers: list[dict] = []
    failures: list[str] = []
    interrupted = False
    try:
        for target, path in [(t, p) for t in targets for p in args.paths]:
            name = target["ranker"] if len(args.paths) == 1 else f"{target['ranker']}[{path}]"
            server = BenchServer(target, lucene, args, logs / f"serve-{name}.log", path)
            entry: dict = {**target, "path": path, "serve_args": server.args, "log": str(server.log_path)}
            servers.append(entry)
            try:
                entry["ready_s"] = round(server.wait_ready(args.ready_timeout), 2)
                entry["info"] = server.info()
                entry["memory_ready"] = proc_status(server.pid)
                console.print(f"{name}: ready in {entry['ready_s']:.1f} s (pid {server.pid}, {server.url})")
                for depth in args.depths:
                    if not server.alive():
                        failures.append(f"{name}: server died before depth {depth}")
                        break
                    cell = summarise(name, measure(server, queries, depth, args), args)
                    cells.append(cell)
                    console.print(
                        f"  depth {depth}: {cell['ok']} ok, {cell['errors']} errors, "
                        f"{cell['requests_per_s']:.2f} req/s, p50 {ms((cell['latency_ms'] or {}).get('p50'))} ms"
                    )
                entry["memory_end"] = proc_status(server.pid)
            except (RuntimeError, TimeoutError) as exc:
                failures.append(f"{name}: {exc}")
                console.print(f"[red]{name}: {exc}[/]")
            finally:
                entry["exit_code"] = server.stop()
                entry["log_problems"] = server.log_problems()
            if entry["exit_code"] != 0:
                failures.append(f"{name}: server exit code {entry['exit_code']} (expected 0 after SIGTERM)")
    except KeyboardInterrupt:
        interrupted = True
        failures.append("interrupted")
        console.print("[red]interrupted: servers stopped, writing what was measured[/]")

    add_ratios(cells)
    if cells:
        print_tables(cells, args, targets[0].get("store_documents") if targets else None)
    for s in servers:
        if s.get("log_problems"):
            console.print(f"[yellow]{s['ranker']}: {len(s['log_problems'])} warning/error log lines[/]")
    errors = sum(c["errors"] + sum(c["warmup_errors_by_status"].values()) for c in cells)
    info["load_average_end"] = list(os.getloadavg())
    result = {
        "benchmark": "bench/serve.py",
        "command": " ".join([Path(sys.argv[0]).as_posix(), *(argv if argv is not None else sys.argv[1:])]),
        "machine": info,
        "settings": {
            "collection": str(args.collection),
            "queries": len(queries),
            "rankers": args.rankers,
            "paths": {p: PATH_FLAGS[p] for p in args.paths},
            "depths": args.depths,
            "clients": args.clients,
            "seconds": args.seconds,
            "warmup_requests_per_depth": args.warmup,
            "request_timeout_s": args.request_timeout,
            "ready_timeout_s": args.ready_timeout,
            "sample_interval_s": args.sample_interval,
            "max_doc_len_new_checkpoints": args.max_doc_len,
            "quick": args.quick,
            "time_bound_s": bound,
            "request": 'POST /v1/rerank {"query": <query>, "depth": <depth>}, closed loop per client; '
            "queries cycle from the first, the same sequence for every ranker; after a 503 the client "
            "waits Retry-After (within the window) before its next request",
            "warmup": "warmup_requests_per_depth sequential requests (queries from the end of the list) "
            "before each window, not in the numbers; their errors count for the exit code",
            "requests_per_s": "successful requests / (end of the last request - start of the window): "
            "the server is busy until the last request in flight ends; requests_per_s_in_window counts "
            "only those that ended inside the window",
            "memory": "VmRSS of the server from /proc every sample_interval; RssAnon is heap (leaks), "
            "RssFile includes the memory-mapped store pages touched so far; slopes by least squares",
            "weights": "untrained (init_ranker) unless trained is true: the same computation, speed only",
        },
        "preparation_s": {k: round(v, 1) for k, v in prep.items()},
        "servers": servers,
        "cells": cells,
        "errors": errors,
        "failures": failures,
        "interrupted": interrupted,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    console.print(f"wrote {args.out} ({result['wall_s']} s)")
    if errors or failures:
        console.print(
            f"[red]FAILED: {errors} request errors; {'; '.join(failures) or 'no other failures'}[/]"
        )
        return 130 if interrupted else 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
