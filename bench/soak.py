"""Soak: one `aheadrank serve` on 127.0.0.1 under N clients for T seconds, mixing valid, invalid, oversized,
slow-upload and non-reading clients; plus the cost of the guards, side by side.

The script builds (once, cached in ``--workdir``) a tiny untrained MORES (a 4-layer, 32-wide BERT with the
MiniLM tokenizer, the tests' kind: it builds in seconds and keeps the load on the HTTP side) and its store of
the bundled SciFact sample, starts the server with an API key and small body/read/send timeouts, and runs
``--clients`` asyncio clients until ``--seconds`` have passed. Client i plays one class, by i:

- ``valid``: POST /v1/rerank over 20 stored candidates, or /v2/rerank over 4 ad-hoc texts; any 5xx is a failure.
  Closed loop without think time: each sends its next request as soon as it has its answer (after a 503, it
  waits ``Retry-After`` as a real client does; the 503 still counts). That is the hardest pace a fixed set of
  clients can set, and it never drives the server past ``--max-queue``: at most one request per client is
  outstanding, and at most 48 of the 64 clients can hold a slot (36 valid, 8 invalid, 4 non-reading: oversized
  and slow-upload requests are refused or timed out before the queue) < ``--max-queue`` 64, so a 503
  ``overloaded`` here means slots held by requests nobody waits for, and a 504 a model thread that stopped
  taking turns (services/README.md, Reliability);
- ``invalid``: a bad key, no key, malformed JSON, a wrong shape, unknown docids (4xx expected);
- ``oversized``: a Content-Length over ``--max-body-bytes``, a chunked body that grows over it, too many
  candidates (413 expected);
- ``slow``: an authenticated body trickled byte by byte (408 expected) or an unauthenticated one (401 at once);
- ``nonreading``: a request whose answer is ~``--nonreading-mb`` MB (documents returned), a 4 KiB receive buffer,
  never read: the server must drop it (``--send-timeout``) and free its buffers. Its texts are one text
  repeated (split and scored once: a small work, a big answer) or, with ``--nonreading-distinct``, all
  different (each split into up to 10 passages and encoded: ~2,500 passages a request, in short turns).

A prober sends GET /health every 0.2 s (its latency percentiles), a sampler reads the server's RSS and open
descriptors from /proc and its queue depth and model-thread turns from /metrics every second. Reported: counts
per class and status, 5xx of valid requests (must be 0), peak/final RSS and descriptors, the queue's peak depth,
the model thread's turns (how many over 0.1 / 1 / 5 s: a long turn holds every request), /health p50/p99, and
the guard cost: the same valid request through the app
in-process (httpx's ASGI transport, before the server starts), with the guards (API key checked from the
headers, the body read against ``--body-timeout``, requests taking turns on the model thread) and without (no
key, no body deadline, first come first served), alternating, as a ratio of medians. Bounded loops: every
request has a timeout and every client stops at the deadline; the server is stopped at the end.

    .venv/bin/python bench/soak.py --clients 64 --seconds 600      # bench/results/soak.json
    .venv/bin/python bench/soak.py --clients 16 --seconds 30 --out /tmp/soak.json   # a short look
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import httpx  # noqa: E402
from aheadrank.services.process import ServeProcess  # noqa: E402
from benchkit import SAMPLE, machine_info, write_record  # noqa: E402

KEY = "soak-key-1"
CLASSES = ("valid", "invalid", "oversized", "slow", "nonreading")
# client i plays CLASSES[MIX[i % len(MIX)]]: half the clients valid, the rest spread over the faults
MIX = (0, 1, 0, 2, 0, 3, 0, 4, 0, 1, 0, 2, 0, 3, 0, 0)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--seconds", type=float, default=600)
    p.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024)
    p.add_argument("--body-timeout", type=float, default=5)
    p.add_argument("--send-timeout", type=float, default=5)
    p.add_argument("--read-timeout", type=float, default=5)
    p.add_argument("--nonreading-mb", type=float, default=10.0)
    p.add_argument(
        "--nonreading-distinct", action="store_true", help="non-reading clients send distinct texts"
    )
    p.add_argument("--guard-requests", type=int, default=400, help="requests per side for the guard cost")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/aheadrank-bench-soak"))
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "soak.json")
    return p.parse_args(argv)


# ---- preparation ------------------------------------------------------------------------------------
def prepare(work: Path) -> tuple[Path, Path]:
    """A tiny untrained MORES checkpoint and its store of the SciFact sample (cached)."""
    work.mkdir(parents=True, exist_ok=True)
    ckpt, store = work / "ckpt", work / "store"
    if not (ckpt / "fingerprint.json").is_file():
        import shutil

        import torch
        from aheadrank.rankers import init_ranker, save_checkpoint
        from aheadrank.rankers.base_model import TOKENIZER_FILES, packaged_base_dir
        from transformers import BertConfig, BertModel

        base = work / "tiny-bert"
        torch.manual_seed(1234)
        cfg = BertConfig(
            vocab_size=30522, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=256,
        )  # fmt: skip
        BertModel(cfg).save_pretrained(base)
        for name in TOKENIZER_FILES:
            if (packaged_base_dir() / name).is_file():
                shutil.copyfile(packaged_base_dir() / name, base / name)
        save_checkpoint(init_ranker("mores", base=base, seed=0, ibs=2, sim=False), ckpt)
    if not (store / "manifest.json").is_file():
        from aheadrank.indexer.build import BuildOptions, build_store

        build_store(BuildOptions(str(ckpt), str(SAMPLE), str(store), shard_size=400, progress=False))
    return ckpt, store


def corpus() -> tuple[list[str], list[str]]:
    docs = [json.loads(line) for line in (SAMPLE / "corpus.jsonl").open()]
    return [d["_id"] for d in docs], [f"{d.get('title', '')} {d.get('text', '')}".strip() for d in docs]


# ---- the guard cost, in-process ----------------------------------------------------------------------
def guard_cost(
    ckpt: Path, store: Path, n: int, docids: list[str], candidates: int = 20, model: str = "tiny MORES"
) -> dict:
    from aheadrank.services.app import create_app
    from aheadrank.services.backend import RerankBackend
    from aheadrank.services.settings import ServiceSettings

    base = ServiceSettings(checkpoint=ckpt, store=store, warmup=False, access_log=False, threads=1)
    backend = RerankBackend.load(base)
    backend.ready = True
    guarded = base.model_copy(update={"api_keys": [KEY], "body_timeout": 20.0, "interleave": True})
    plain = base.model_copy(update={"api_keys": [], "body_timeout": float("inf"), "interleave": False})
    apps = {}
    for name, settings in (("guarded", guarded), ("plain", plain)):
        backend.settings = settings
        apps[name] = (create_app(backend), settings)
    times: dict[str, list[float]] = {"guarded": [], "plain": []}
    rng = random.Random(7)

    async def one(client: httpx.AsyncClient, name: str) -> None:
        body = {"query": "gene expression", "candidates": rng.sample(docids, candidates)}
        t = time.perf_counter()
        r = await client.post("/v1/rerank", json=body, headers={"Authorization": f"Bearer {KEY}"})
        times[name].append(time.perf_counter() - t)
        assert r.status_code == 200, r.text

    async def run() -> None:
        clients = {
            name: httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1")
            for name, (app, _) in apps.items()
        }
        for name, (_, settings) in apps.items():  # warm both
            backend.settings = settings
            for _ in range(20):
                await one(clients[name], name)
            times[name].clear()
        for i in range(n):  # alternating, in blocks of 10
            for name in ("guarded", "plain") if i % 2 == 0 else ("plain", "guarded"):
                backend.settings = apps[name][1]
                for _ in range(10):
                    await one(clients[name], name)
        for c in clients.values():
            await c.aclose()

    asyncio.run(run())
    backend.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "requests_per_side": len(times["guarded"]),
        "median_ms": {k: round(v * 1e3, 4) for k, v in med.items()},
        "ratio": round(med["guarded"] / med["plain"], 4),
        "what": f"POST /v1/rerank, {candidates} stored candidates, {model}, in-process ASGI (guards: key from the "
        "headers, body deadline, turns) vs none; the h11 timers are a few call_later per connection on top",
    }


# ---- the soak ------------------------------------------------------------------------------------------
class Tally:
    def __init__(self) -> None:
        self.counts: dict[str, Counter] = defaultdict(Counter)
        self.valid_5xx: list[str] = []

    def add(self, cls: str, outcome: str | int) -> None:
        self.counts[cls][str(outcome)] += 1
        if cls == "valid" and isinstance(outcome, int) and outcome >= 500:
            self.valid_5xx.append(str(outcome))


def head(path: str, length: int | None, key: str | None, chunked: bool = False) -> bytes:
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    framing = "Transfer-Encoding: chunked\r\n" if chunked else f"Content-Length: {length}\r\n"
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n{auth}{framing}\r\n"
    ).encode()


async def status_of(reader: asyncio.StreamReader, timeout: float) -> str:
    try:
        line = await asyncio.wait_for(reader.readline(), timeout)
    except (asyncio.TimeoutError, ConnectionError):
        return "no_answer"
    parts = line.split()
    return parts[1].decode() if len(parts) > 1 else "closed"


async def raw(port: int, rcvbuf: int | None = None):
    sock = socket.socket()
    if rcvbuf:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock)


class Soak:
    def __init__(self, server: ServeProcess, args, docids: list[str], texts: list[str]) -> None:
        self.server, self.args, self.docids, self.texts = server, args, docids, texts
        self.tally = Tally()
        self.health: list[float] = []
        self.health_fail = 0
        self.samples: list[tuple[float, float, int]] = []
        self.until = 0.0
        self.auth = {"Authorization": f"Bearer {KEY}"}

    def running(self) -> bool:
        return time.monotonic() < self.until

    async def valid(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        if rng.random() < 0.7:
            body = {"query": "cell biology", "candidates": rng.sample(self.docids, 20)}
            r = await http.post("/v1/rerank", json=body, headers=self.auth)
        else:
            body = {"query": "protein", "documents": rng.sample(self.texts, 4)}
            r = await http.post("/v2/rerank", json=body, headers=self.auth)
        self.tally.add("valid", r.status_code)
        if r.status_code == 503:  # counted as a failure above; then as a real client does: wait Retry-After
            await asyncio.sleep(float(r.headers.get("retry-after", 1)))

    async def invalid(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        kind = rng.randrange(5)
        good = {"query": "q", "candidates": self.docids[:3]}
        if kind == 0:
            r = await http.post("/v1/rerank", json=good, headers={"Authorization": "Bearer wrong"})
        elif kind == 1:
            r = await http.post("/v1/rerank", json=good)
        elif kind == 2:
            r = await http.post(
                "/v1/rerank", content=b'{"query": "q", "candidates": [', headers={**self.auth, "Content-Type": "application/json"}
            )  # fmt: skip
        elif kind == 3:
            r = await http.post("/v2/rerank", json={"query": 5, "documents": "x"}, headers=self.auth)
        else:
            r = await http.post(
                "/v1/rerank", json={"query": "q", "candidates": ["no-such-doc"]}, headers=self.auth
            )
        self.tally.add("invalid", r.status_code)

    async def oversized(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        kind = rng.randrange(3)
        if kind == 0:  # declared over the limit: refused from the head
            reader, writer = await raw(self.server.port)
            writer.write(head("/v1/rerank", self.args.max_body_bytes + 1, KEY))
            await writer.drain()
            self.tally.add("oversized", await status_of(reader, 10))
            writer.close()
        elif kind == 1:  # chunked, growing over the limit
            reader, writer = await raw(self.server.port)
            writer.write(head("/v1/rerank", None, KEY, chunked=True))
            piece = b" " * 65536
            status = "no_answer"
            try:
                for _ in range(self.args.max_body_bytes // len(piece) + 4):
                    writer.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
                    await writer.drain()
                    if reader.at_eof() or len(reader._buffer):  # noqa: SLF001 - an early answer
                        break
                status = await status_of(reader, 10)
            except ConnectionError:
                status = "reset"
            self.tally.add("oversized", status)
            writer.close()
        else:
            body = {"query": "q", "candidates": [f"d{i}" for i in range(5000)]}
            r = await http.post("/v1/rerank", json=body, headers=self.auth)
            self.tally.add("oversized", r.status_code)

    async def slow(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        body = json.dumps({"query": "slow", "candidates": self.docids[:5]}).encode()
        authed = rng.random() < 0.6
        reader, writer = await raw(self.server.port)
        writer.write(head("/v1/rerank", len(body), KEY if authed else None))
        status = "no_answer"
        try:
            for i in range(len(body) - 1):  # never the last byte
                writer.write(body[i : i + 1])
                await writer.drain()
                try:
                    status = await status_of(reader, 0.4)
                except ConnectionError:
                    status = "reset"
                if status != "no_answer" or not self.running():
                    break
        except ConnectionError:
            status = "reset"
        if status == "no_answer" and not self.running():
            status = "cut_at_the_end"
        self.tally.add("slow", f"{status}{'' if authed else ' (no key)'}")
        writer.close()

    async def nonreading(self, http: httpx.AsyncClient, rng: random.Random) -> None:
        # the texts come back twice in the v1 shape: a body of half the answer, kept under the body limit
        n = max(1, int(min(self.args.nonreading_mb * 1e6 / 2, self.args.max_body_bytes * 0.9) / 20_000))
        # one text n times: scored once (equal texts in a request are), so the work is small and the answer big
        docs = [(rng.choice(self.texts) * 20)[:20_000]] * n
        if self.args.nonreading_distinct:  # each text its own: split and encoded, not looked up once
            docs = [f"{k} {d[: 20_000 - 8]}" for k, d in enumerate(docs)]
        body = json.dumps({"query": "q", "documents": docs, "return_documents": True}).encode()
        reader, writer = await raw(self.server.port, rcvbuf=4096)
        writer.write(head("/v1/rerank", len(body), KEY) + body)
        await writer.drain()
        await asyncio.sleep(self.args.send_timeout * 3 + 20)  # never read meanwhile: the server must drop it
        got, length = 0, None
        try:  # then read what is left: a dropped connection ends (reset or EOF) before the whole answer
            status = await status_of(reader, 5)
            while True:
                line = await asyncio.wait_for(reader.readline(), 5)
                if line in (b"\r\n", b""):
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            while length is None or got < length:
                chunk = await asyncio.wait_for(reader.read(1 << 16), 5)
                if not chunk:
                    break
                got += len(chunk)
            outcome = "answered_in_full" if length is not None and got >= length else f"dropped ({status})"
        except (ConnectionError, asyncio.TimeoutError):
            outcome = "dropped (reset)"
        self.tally.add("nonreading", outcome)
        writer.close()

    async def client(self, i: int) -> None:
        cls = CLASSES[MIX[i % len(MIX)]]
        rng = random.Random(i)
        act = getattr(self, cls)
        async with httpx.AsyncClient(base_url=self.server.url, timeout=60, trust_env=False) as http:
            while self.running():
                try:
                    await asyncio.wait_for(act(http, rng), timeout=120)
                except (httpx.HTTPError, ConnectionError, OSError, asyncio.TimeoutError) as exc:
                    self.tally.add(cls, type(exc).__name__)
                if cls != "valid":
                    await asyncio.sleep(rng.uniform(0.1, 0.5))

    async def prober(self) -> None:
        async with httpx.AsyncClient(base_url=self.server.url, timeout=10, trust_env=False) as http:
            while self.running():
                t = time.perf_counter()
                try:
                    ok = (await http.get("/health")).status_code == 200
                except httpx.HTTPError:
                    ok = False
                if ok:
                    self.health.append(time.perf_counter() - t)
                else:
                    self.health_fail += 1
                await asyncio.sleep(0.2)

    async def sampler(self, t0: float) -> None:
        """Each second: the server's RSS and descriptors (/proc), its queue depth and turns (/metrics)."""
        pid = self.server.pid
        async with httpx.AsyncClient(base_url=self.server.url, timeout=10, trust_env=False) as http:
            while self.running():
                try:
                    rss = next(
                        int(x.split()[1]) / 1024
                        for x in open(f"/proc/{pid}/status")
                        if x.startswith("VmRSS:")
                    )
                    fds = len(os.listdir(f"/proc/{pid}/fd"))
                except (OSError, StopIteration):
                    rss, fds = None, None
                try:
                    m = metric_values((await http.get("/metrics")).text)
                except httpx.HTTPError:
                    m = {}
                turns = m.get("aheadrank_model_turn_seconds_count")
                over_1s = (
                    turns - m['aheadrank_model_turn_seconds_bucket{le="1.0"}'] if turns is not None else None
                )
                self.samples.append(
                    (round(time.monotonic() - t0, 1), rss and round(rss, 1), fds, m.get("aheadrank_queue_depth"),
                     turns, over_1s, m.get("aheadrank_model_turn_seconds_sum"))
                )  # fmt: skip
                await asyncio.sleep(1.0)

    async def run(self) -> None:
        t0 = time.monotonic()
        self.until = t0 + self.args.seconds
        await asyncio.gather(
            self.sampler(t0), self.prober(), *(self.client(i) for i in range(self.args.clients))
        )


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text as {name{labels}: value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


def server_errors(url: str) -> dict[str, float]:
    """The server's own count of errors by kind (aheadrank_errors_total), from /metrics."""
    out: dict[str, float] = {}
    try:
        text = httpx.get(url + "/metrics", timeout=10, trust_env=False).text
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        if line.startswith("aheadrank_errors_total{"):
            kind = line.split('kind="', 1)[1].split('"', 1)[0]
            out[kind] = float(line.rsplit(" ", 1)[1])
    return out


def turn_summary(url: str) -> dict:
    """The model thread's turns (aheadrank_model_turn_seconds): how many, their mean, how many over 0.1/1/5 s."""
    try:
        m = metric_values(httpx.get(url + "/metrics", timeout=10, trust_env=False).text)
    except httpx.HTTPError:
        return {}
    name = "aheadrank_model_turn_seconds"
    n = m.get(f"{name}_count", 0.0)
    out = {"turns": int(n), "mean_ms": round(1e3 * m.get(f"{name}_sum", 0.0) / n, 2) if n else None}
    for le in ("0.1", "1.0", "5.0"):
        out[f"over_{le.rstrip('0').rstrip('.')}s"] = int(n - m.get(f'{name}_bucket{{le="{le}"}}', n))
    return out


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    ckpt, store = prepare(args.workdir)
    docids, texts = corpus()
    print("guard cost (in-process, alternating) ...", flush=True)
    guards = guard_cost(ckpt, store, max(1, args.guard_requests // 10), docids)
    server = ServeProcess(
        ["--checkpoint", str(ckpt), "--store", str(store), "--no-access-log",
         "--max-body-bytes", str(args.max_body_bytes), "--body-timeout", str(args.body_timeout),
         "--send-timeout", str(args.send_timeout), "--read-timeout", str(args.read_timeout),
         "--max-connections", str(max(256, 4 * args.clients)), "--max-documents", "1000"],
        args.workdir / "serve.log", env={"AHEADRANK_API_KEYS": KEY}, clean_env=True,
    )  # fmt: skip
    soak = Soak(server, args, docids, texts)
    try:
        server.wait_ready(600)
        print(f"soak: {args.clients} clients for {args.seconds:g} s against {server.url} ...", flush=True)
        asyncio.run(soak.run())
        alive = server.alive()
        errors = server_errors(server.url)
        turns = turn_summary(server.url)
    finally:
        code = server.stop()
    log = server.output()
    rss = [s[1] for s in soak.samples if s[1] is not None]
    fds = [s[2] for s in soak.samples if s[2] is not None]
    counts = {cls: dict(sorted(c.items())) for cls, c in sorted(soak.tally.counts.items())}
    summary = {
        "clients": args.clients,
        "seconds": args.seconds,
        "classes": {cls: sum(1 for i in range(args.clients) if CLASSES[MIX[i % len(MIX)]] == cls) for cls in CLASSES},
        "counts": counts,
        "valid_requests": sum(counts.get("valid", {}).values()),
        "valid_5xx": len(soak.tally.valid_5xx),
        "rss_mb": {"start": rss[0] if rss else None, "peak": max(rss, default=None), "end": rss[-1] if rss else None},
        "open_fds": {"start": fds[0] if fds else None, "peak": max(fds, default=None), "end": fds[-1] if fds else None},
        "health_ms": {
            "n": len(soak.health), "failed": soak.health_fail,
            "p50": round(pct(soak.health, 0.5) * 1e3, 2) if soak.health else None,
            "p99": round(pct(soak.health, 0.99) * 1e3, 2) if soak.health else None,
            "max": round(max(soak.health) * 1e3, 2) if soak.health else None,
        },
        "server_errors_by_kind": errors,
        "queue_depth_peak": max((x[3] for x in soak.samples if x[3] is not None), default=None),
        "model_turns": turns,
        "server_alive_at_end": alive,
        "server_exit_code": code,
        "tracebacks_in_log": log.count("Traceback"),
        "guard_cost": guards,
        "settings": {k: getattr(args, k) for k in ("max_body_bytes", "body_timeout", "send_timeout", "read_timeout", "nonreading_distinct")},
        "samples_columns": ["s", "rss_mb", "fds", "queue_depth", "turns", "turns_over_1s", "turn_seconds"],
        "samples": soak.samples[:: max(1, len(soak.samples) // 600)],
    }  # fmt: skip
    print(f"\n{'class':<12}{'clients':>8}  outcomes (status or what happened: count)")
    for cls in CLASSES:
        print(f"{cls:<12}{summary['classes'][cls]:>8}  {counts.get(cls, {})}")
    print(f"server errors by kind: {errors}")
    print(f"queue depth peak (1 s samples): {summary['queue_depth_peak']}; model thread turns: {turns}")
    h = summary["health_ms"]
    print(
        f"\nvalid requests {summary['valid_requests']}, 5xx among them {summary['valid_5xx']}; "
        f"RSS MB start/peak/end {summary['rss_mb']['start']}/{summary['rss_mb']['peak']}/{summary['rss_mb']['end']}; "
        f"open fds start/peak/end {summary['open_fds']['start']}/{summary['open_fds']['peak']}/{summary['open_fds']['end']}; "
        f"/health p50 {h['p50']} ms p99 {h['p99']} ms ({h['n']} probes, {h['failed']} failed); "
        f"guards/none median {guards['median_ms']['guarded']}/{guards['median_ms']['plain']} ms = {guards['ratio']}; "
        f"server exit {code}, tracebacks {summary['tracebacks_in_log']}"
    )  # fmt: skip
    write_record(args.out, "bench/soak.py", argv, machine_info(os.cpu_count() or 1), t_start, **summary)
    print(f"wrote {args.out}")
    ok = summary["valid_5xx"] == 0 and alive and code == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
