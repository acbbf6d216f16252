"""Representation-store benchmark: write throughput, size, and warm candidate-fetch speed vs numpy.

Builds one store per (compression, dtype) in {none, zstd} x {float16, int8} from the same synthetic
documents (gaussian float16 with a per-dimension scale), then, for a random batch of candidates, times
``StoreReader.fetch`` with a warm page cache against the same gather done by numpy on an in-memory array.

    .venv/bin/python bench/store.py                      # 20,000 docs x 128 tokens x 384 dims
    .venv/bin/python bench/store.py --docs 2000 --repeats 5 --out /tmp/store.json   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from aheadrank.store import StoreReader, StoreSpec, StoreWriter
from aheadrank.store.quant import load_torch

ROOT = Path(__file__).resolve().parent.parent

CONFIGS = [("none", "float16"), ("none", "int8"), ("zstd", "float16"), ("zstd", "int8")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--docs", type=int, default=20_000, help="documents per store")
    p.add_argument("--len", dest="doc_len", type=int, default=128, help="tokens per document")
    p.add_argument("--dim", type=int, default=384, help="field width")
    p.add_argument("--batch", type=int, default=1000, help="candidates per fetch")
    p.add_argument("--repeats", type=int, default=15, help="timed fetches per measurement")
    p.add_argument("--shard-size", type=int, default=4096, help="documents per shard")
    p.add_argument(
        "--zstd-docs", type=int, default=None, help="documents in the zstd stores (default: --docs)"
    )
    p.add_argument("--configs", default="all", help="comma list of compression:dtype, e.g. none:float16")
    p.add_argument("--workdir", type=Path, default=None, help="where stores are built (default: a temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the built stores")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "store.json")
    return p.parse_args(argv)


def make_documents(n: int, length: int, dim: int, seed: int) -> np.ndarray:
    """[n, length, dim] float16: N(0, 1) per value times a log-normal scale per dimension."""
    rng = np.random.default_rng(seed)
    scale = rng.lognormal(0.0, 0.5, dim).astype(np.float32)
    out = np.empty((n, length, dim), dtype=np.float16)
    step = max(1, (64 << 20) // (length * dim * 4))
    for a in range(0, n, step):
        block = rng.standard_normal((min(step, n - a), length, dim), dtype=np.float32)
        block *= scale
        out[a : a + len(block)] = block
    return out


def _relative(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def timed(fn: Any, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 2)


def build(path: Path, data: np.ndarray, compression: str, dtype: str, shard_size: int) -> dict[str, Any]:
    n, length, dim = data.shape
    spec = StoreSpec(
        fields={"doc": dim},
        fingerprint="bench",
        ranker_kind="bench",
        max_doc_len=length,
        compression=compression,
        dtype=dtype,
        shard_size=shard_size,
    )
    docids = [f"doc{i:07d}" for i in range(n)]
    t0 = time.perf_counter()
    with StoreWriter(path, spec, resume=False) as writer:
        for a in range(0, n, shard_size):
            b = min(n, a + shard_size)
            writer.add_many(docids[a:b], [{"doc": data[i]} for i in range(a, b)])
    seconds = time.perf_counter() - t0
    stored = sum(f.stat().st_size for f in path.glob("shard-*.h5"))
    return {
        "write_s": round(seconds, 2),
        "write_docs_per_s": round(n / seconds, 1),
        "write_input_MB_per_s": round(data.nbytes / seconds / 1e6, 1),
        "write_stored_MB_per_s": round(stored / seconds / 1e6, 1),
        "stored_bytes": stored,
        "bytes_per_token": round(stored / (n * length), 2),
        "size_vs_float16": round(stored / data.nbytes, 4),
    }


def fetch_numbers(
    path: Path, data: np.ndarray, batch: int, repeats: int, seed: int, dtype: str
) -> dict[str, Any]:
    """Warm fetch timings, each repeat paired with the numpy bound timed right after it (same load)."""
    n, length, dim = data.shape
    rng = np.random.default_rng(seed + 1)
    t0 = time.perf_counter()
    reader = StoreReader(path)
    open_s = time.perf_counter() - t0
    pick = rng.choice(n, size=min(batch, n), replace=False)
    docids = [f"doc{i:07d}" for i in pick]
    result = reader.fetch(docids)
    want = data[pick].astype(np.float32)
    error = float(np.abs(result.fields["doc"].astype(np.float32) - want).max())
    if dtype == "float16" and error != 0.0:
        raise AssertionError(f"{path}: float16 fetch is not bit-exact (max error {error})")
    del result, want
    reader.fetch(docids)  # warm
    same, bound = [], []
    for _ in range(repeats):
        same += timed(lambda: reader.fetch(docids), 1)
        bound += timed(lambda: data[pick], 1)
    fresh_batches = [
        [f"doc{i:07d}" for i in rng.choice(n, size=min(batch, n), replace=False)] for _ in range(repeats)
    ]
    it = iter(fresh_batches)
    fresh = timed(lambda: reader.fetch(next(it)), repeats)
    out_bytes = len(pick) * length * dim * 2
    reader.close()
    return {
        "open_ms": round(open_s * 1e3, 1),
        "fetch_ms": ms(same),
        "fetch_ms_min": round(min(same) * 1e3, 2),
        "fetch_ms_fresh_batches": ms(fresh),
        "fetch_GB_per_s": round(out_bytes / statistics.median(same) / 1e9, 2),
        "numpy_doc_gather_ms": ms(bound),
        "ratio_fetch_vs_numpy": round(statistics.median(same) / statistics.median(bound), 2),
        "max_abs_error": error,
        "output_bytes": out_bytes,
    }


def numpy_bound(data: np.ndarray, batch: int, repeats: int, seed: int) -> dict[str, Any]:
    """The same gather on an in-memory array: per document (``data[pick]``) and per token row (``np.take``)."""
    n, length, dim = data.shape
    pick = np.random.default_rng(seed + 1).choice(n, size=min(batch, n), replace=False)
    flat = data.reshape(n * length, dim)
    rows = (pick[:, None] * length + np.arange(length)).reshape(-1)
    data[pick]
    docs = timed(lambda: data[pick], repeats)
    tokens = timed(lambda: np.take(flat, rows, axis=0).reshape(len(pick), length, dim), repeats)
    out_bytes = len(pick) * length * dim * 2
    return {
        "numpy_doc_gather_ms": ms(docs),
        "numpy_row_take_ms": ms(tokens),
        "numpy_GB_per_s": round(out_bytes / statistics.median(docs) / 1e9, 2),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    configs = CONFIGS if args.configs == "all" else [tuple(c.split(":")) for c in args.configs.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="aheadrank-store-bench-", dir=args.workdir))
    print(f"generating {args.docs:,} x {args.doc_len} x {args.dim} float16 documents ...", flush=True)
    t0 = time.perf_counter()
    data = make_documents(args.docs, args.doc_len, args.dim, args.seed)
    print(f"  {data.nbytes / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s", flush=True)
    load_torch()  # import torch (used for float16/int8 casts) before anything is timed
    load_before = os.getloadavg()[0]
    bound = numpy_bound(data, args.batch, args.repeats, args.seed)
    print(f"numpy in-memory gather of {args.batch}: {bound['numpy_doc_gather_ms']} ms", flush=True)
    results = []
    try:
        for compression, dtype in configs:
            n = args.docs if compression == "none" else min(args.docs, args.zstd_docs or args.docs)
            subset = data[:n]
            path = workdir / f"{compression}-{dtype}"
            print(f"[{compression}/{dtype}] writing {n:,} documents ...", flush=True)
            row: dict[str, Any] = {"compression": compression, "dtype": dtype, "docs": n}
            row.update(build(path, subset, compression, dtype, args.shard_size))
            row.update(fetch_numbers(path, subset, args.batch, args.repeats, args.seed, dtype))
            row["load_average_1min"] = round(os.getloadavg()[0], 2)
            results.append(row)
            print(f"  {json.dumps(row)}", flush=True)
            if not args.keep:
                shutil.rmtree(path)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    report = {
        "benchmark": "store",
        "command": " ".join(
            [".venv/bin/python bench/store.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "params": {k: (_relative(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "summary": summarise(results),
        "data": "synthetic: N(0,1) x log-normal per-dimension scale, rounded to float16",
        "zstd_method": "one zstandard frame (level 3) per document and field; batch decompression with "
        "zstandard's multi_decompress_to_buffer (threads)",
        "numpy_bound": bound,
        "results": results,
        "environment": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "platform": platform.platform(),
            "load_average_1min_at_start": round(load_before, 2),
        },
        "note": "warm = page cache holds the store (just written); fetch_ms = median of repeated fetches of "
        "one random batch, fetch_ms_fresh_batches = a new random batch each time; ratio = median fetch / "
        "median numpy data[pick] on an in-memory [docs, len, dim] array, the two timed alternately so that "
        "both see the same machine load",
    }
    print_table(results, bound)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")
    return report


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    """The headline numbers: the fetch target, and what zstd and int8 buy and cost."""
    by = {(r["compression"], r["dtype"]): r for r in results}
    out: dict[str, Any] = {}
    base = by.get(("none", "float16"))
    if base:
        out["none_float16_fetch_vs_numpy"] = base["ratio_fetch_vs_numpy"]
        out["target_within_2x_numpy_met"] = base["ratio_fetch_vs_numpy"] <= 2.0
    for (compression, dtype), r in by.items():
        if (compression, dtype) == ("none", "float16") or not base:
            continue
        ref = by.get(("none", dtype)) if compression == "zstd" else base
        if ref:
            out[f"{compression}_{dtype}_vs_none_{ref['dtype']}"] = {
                "bytes_per_token": f"{r['bytes_per_token']} vs {ref['bytes_per_token']}",
                "size_saving_pct": round(100 * (1 - r["bytes_per_token"] / ref["bytes_per_token"]), 1),
                "fetch_time_x": round(r["fetch_ms"] / ref["fetch_ms"], 2),
                "write_docs_per_s_x": round(r["write_docs_per_s"] / ref["write_docs_per_s"], 2),
            }
    return out


def print_table(results: list[dict[str, Any]], bound: dict[str, Any]) -> None:
    head = (
        f"{'store':<14}{'docs':>7}{'B/token':>9}{'size':>7}{'write doc/s':>12}{'write MB/s':>11}"
        f"{'fetch ms':>10}{'fresh ms':>10}{'GB/s':>7}{'vs numpy':>9}"
    )
    print(head)
    print("-" * len(head))
    for r in results:
        print(
            f"{r['compression'] + '/' + r['dtype']:<14}{r['docs']:>7}{r['bytes_per_token']:>9}"
            f"{r['size_vs_float16']:>7.3f}{r['write_docs_per_s']:>12,.0f}{r['write_input_MB_per_s']:>11,.0f}"
            f"{r['fetch_ms']:>10}{r['fetch_ms_fresh_batches']:>10}{r['fetch_GB_per_s']:>7}"
            f"{r['ratio_fetch_vs_numpy']:>8}x"
        )
    print(
        f"numpy in-memory: data[pick] {bound['numpy_doc_gather_ms']} ms, row take {bound['numpy_row_take_ms']} ms"
    )


if __name__ == "__main__":
    main()
