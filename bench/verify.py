"""Store verification throughput: what `aheadrank serve --verify-store start|background` costs on this machine.

Builds a synthetic float16 store (StoreWriter), opens it as the service does, and times the sha256 of every
shard through the reader (``ShardVerification``, what the service runs):

* ``sha256 in memory``: hashlib alone over a buffer (the CPU bound);
* ``verify, warm``: every shard in the page cache;
* ``verify, cold``: each shard dropped from the page cache first (``posix_fadvise(DONTNEED)``), so the disk
  is read too (a store much larger than memory is always cold);
* fetch latency (a random batch, median) alone and while a background verification runs beside it, the
  verification thread at the lowest CPU priority as the service starts it.

Prints a table, the seconds a 100 GB store would take at each rate, and writes JSON.

    .venv/bin/python bench/verify.py                       # ~1 GB store
    .venv/bin/python bench/verify.py --docs 1000 --out /tmp/verify.json   # quick
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from aheadrank.store import StoreReader, StoreSpec, StoreWriter
from aheadrank.store.verify import ShardVerification

ROOT = Path(__file__).resolve().parent.parent
GB100 = 100e9


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=10_000, help="documents (x 128 tokens x 384 dims float16)")
    p.add_argument("--shard-size", type=int, default=1000)
    p.add_argument("--repeats", type=int, default=3, help="timed verifications per case (best kept)")
    p.add_argument("--fetches", type=int, default=40, help="timed fetches per latency case")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "verify.json")
    return p.parse_args(argv)


def build(path: Path, docs: int, shard_size: int) -> None:
    spec = StoreSpec(
        fields={"doc": 384}, fingerprint="bench", ranker_kind="bench", strategy=None, max_doc_len=128,
        compression="none", dtype="float16", shard_size=shard_size, config={},
    )  # fmt: skip
    rng = np.random.default_rng(0)
    block = rng.standard_normal((64, 128, 384), dtype=np.float32).astype(np.float16)
    with StoreWriter(path, spec, resume=False) as writer:
        for i in range(docs):
            writer.add(f"D{i}", {"doc": block[i % 64]})


def drop_cache(reader: StoreReader) -> None:
    for info in reader.manifest.shards:
        fd = os.open(reader.path / info.file, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def time_verify(reader: StoreReader, cold: bool, repeats: int) -> float:
    """Best MB/s of a full verification."""
    best = 0.0
    for _ in range(repeats):
        if cold:
            drop_cache(reader)
        v = ShardVerification([reader])
        t = time.perf_counter()
        if v.run():
            raise SystemExit("the store did not verify")
        best = max(best, v.bytes_done / (time.perf_counter() - t) / 1e6)
    return best


def fetch_ms(reader: StoreReader, ids: list[str], n: int, rng: np.random.Generator) -> float:
    times = []
    for _ in range(n):
        batch = [ids[i] for i in rng.choice(len(ids), 100, replace=False)]
        t = time.perf_counter()
        reader.fetch(batch)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="aheadrank-verify-", dir=args.workdir))
    try:
        store = work / "store"
        t = time.perf_counter()
        build(store, args.docs, args.shard_size)
        build_s = time.perf_counter() - t
        buf = np.random.default_rng(1).bytes(256 << 20)
        t = time.perf_counter()
        hashlib.sha256(buf).hexdigest()
        memory = len(buf) / (time.perf_counter() - t) / 1e6
        rng = np.random.default_rng(2)
        with StoreReader(store) as reader:
            size = reader.manifest.n_bytes
            warm = time_verify(reader, cold=False, repeats=args.repeats)
            cold = time_verify(reader, cold=True, repeats=args.repeats)
            ids = reader.docids()
            idle = fetch_ms(reader, ids, args.fetches, rng)
            drop_cache(reader)
            background = ShardVerification([reader], "background")
            background.start()
            during = fetch_ms(reader, ids, args.fetches, rng)
            overlapped = background.state == "running"
            background.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = [
        ("sha256 in memory (hashlib)", memory),
        ("verify, warm page cache", warm),
        ("verify, cold (read from disk)", cold),
    ]
    print(
        f"store: {size / 1e6:,.0f} MB in {len(range(0, args.docs, args.shard_size))} shards (built in {build_s:.1f} s)"
    )
    print("| case | MB/s | 100 GB store |")
    print("|---|---|---|")
    for name, rate in rows:
        print(f"| {name} | {rate:,.0f} | {GB100 / rate / 1e6 / 60:.1f} min |")
    print(
        f"fetch of 100 random documents, median: {idle:.2f} ms alone, {during:.2f} ms beside a background "
        f"verification{'' if overlapped else ' (it finished before the fetches did)'}"
    )
    result = {
        "command": "bench/verify.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "store_bytes": size,
        "shards": len(range(0, args.docs, args.shard_size)),
        "mb_per_s": {
            "sha256_memory": round(memory, 1),
            "verify_warm": round(warm, 1),
            "verify_cold": round(cold, 1),
        },
        "minutes_100gb": {
            "warm": round(GB100 / warm / 1e6 / 60, 2),
            "cold": round(GB100 / cold / 1e6 / 60, 2),
        },
        "fetch_ms_median": {
            "idle": round(idle, 3),
            "beside_verification": round(during, 3),
            "overlapped": overlapped,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
