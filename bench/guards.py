"""What the input guards of issue 37 cost against the requests they guard.

The guards: the raw-body JSON shape check (services/jsonguard.py: nesting depth and value count, before the
body is parsed) and the store's docid lookup, now as wide as the longest stored docid (store/reader.py). Each
is timed on its own (median of ``--repeats``) on representative bodies, and divided by the median time of the
whole request it guards, served in-process (FastAPI TestClient) by a MORES 2xIB (s2) checkpoint on the
packaged MiniLM base with its store of the bundled 1,000-document SciFact sample (built in a temporary folder
unless ``--checkpoint``/``--store`` are given). The previous lookup (a fixed-width unicode array of every docid
asked) is timed beside the new one for reference, and both are measured (tracemalloc peak) on 1,000
candidates of which one is ``--long-docid-chars`` long.

    .venv/bin/python bench/guards.py --threads 1        # writes bench/results/guards.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from benchkit import machine_info, write_record
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "aheadrank" / "data" / "scifact-sample"
console = Console(width=None if sys.stdout.isatty() else 160)


def median_s(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def old_lookup(reader, docids: list[str]) -> np.ndarray:
    """The lookup before: every docid widened to the longest asked, as UTF-32, then encoded."""
    query = np.char.encode(np.asarray(docids, dtype=np.str_), "utf-8")
    pos = np.searchsorted(reader._ids, query, sorter=reader._sorter)
    index = reader._sorter[np.minimum(pos, len(reader._ids) - 1)]
    return reader._ids[index] == query


def lookup_memory(reader, ids: list[str], long_chars: int, n: int = 1000) -> dict:
    """tracemalloc peak of looking up ``n`` candidates of which one is ``long_chars`` characters (Arabic: two
    UTF-8 bytes each), with the lookup now and before (numpy reports its allocations to tracemalloc)."""
    import tracemalloc

    asked = [*ids[: n - 1], "ق" * long_chars]
    peaks = {}
    for name, fn in (("peak_mb", reader.known), ("old_peak_mb", lambda d: old_lookup(reader, d))):
        tracemalloc.start()
        fn(asked)
        peaks[name] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    return {"candidates": n, "long_docid_chars": long_chars, **peaks}


def build(work: Path) -> tuple[Path, Path]:
    from aheadrank.indexer.build import BuildOptions, build_store
    from aheadrank.rankers import init_ranker, save_checkpoint

    ckpt, store = work / "ckpt", work / "store"
    save_checkpoint(init_ranker("mores", ibs=2, seed=0), ckpt)
    build_store(BuildOptions(str(ckpt), str(SAMPLE), str(store), progress=False))
    return ckpt, store


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--store", type=Path)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument(
        "--long-docid-chars", type=int, default=50_000, help="the one long docid of the memory case"
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "guards.json")
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    from aheadrank.services import RerankBackend, ServiceSettings, create_app
    from aheadrank.services.jsonguard import max_values, shape_problem
    from fastapi.testclient import TestClient

    with tempfile.TemporaryDirectory(prefix="guards-") as tmp:
        ckpt, store = (args.checkpoint, args.store) if args.checkpoint else build(Path(tmp))
        settings = ServiceSettings(checkpoint=ckpt, store=store, device="cpu", access_log=False)
        backend = RerankBackend.load(settings)
        backend.warmup()
        reader = backend.reader
        ids = reader.docids()
        texts = [json.loads(line)["text"] for line in (SAMPLE / "corpus.jsonl").open()]
        depth, values = settings.max_json_depth, max_values(settings)
        cases = {
            "/v1/rerank, 100 candidates": {"query": "cancer risk", "candidates": ids[:100]},
            "/v1/rerank, 1000 candidates": {"query": "cancer risk", "candidates": ids[:1000]},
            "/rerank, 100 texts": {"query": "cancer risk", "texts": texts[:100]},
            "/v2/rerank, 100 objects": {
                "query": "cancer risk",
                "documents": [{"text": t, "id": str(i), "meta": {"n": i}} for i, t in enumerate(texts[:100])],
            },
        }
        rows = []
        with TestClient(create_app(backend)) as client:
            for name, body in cases.items():
                path = name.split(",")[0]
                raw = json.dumps(body).encode()
                assert shape_problem(raw, depth, values) is None

                def post(path=path, raw=raw):
                    return client.post(path, content=raw, headers={"content-type": "application/json"})

                assert post().status_code == 200
                request_s = median_s(post, args.repeats)
                shape_s = median_s(lambda raw=raw: shape_problem(raw, depth, values), args.repeats * 20)
                row = {
                    "case": name,
                    "body_bytes": len(raw),
                    "request_ms": request_s * 1e3,
                    "shape_us": shape_s * 1e6,
                }
                if "candidates" in body:
                    row["lookup_us"] = (
                        median_s(lambda ids=body["candidates"]: reader.known(ids), args.repeats * 20) * 1e6
                    )
                    row["old_lookup_us"] = (
                        median_s(lambda ids=body["candidates"]: old_lookup(reader, ids), args.repeats * 20)
                        * 1e6
                    )
                guard_us = row["shape_us"] + row.get("lookup_us", 0.0)
                row["guards_pct"] = 100 * guard_us / (row["request_ms"] * 1e3)
                rows.append(row)
        memory = lookup_memory(reader, ids, args.long_docid_chars)
        backend.close()

    console.print(
        f"one docid of {args.long_docid_chars:,} characters among {memory['candidates']:,} candidates: lookup peak "
        f"{memory['peak_mb']:.2f} MB (before: {memory['old_peak_mb']:.0f} MB)"
    )
    table = Table(title=f"input guards ({args.threads} thread(s); medians)")
    for col in ("case", "body KB", "request ms", "shape µs", "lookup µs (old)", "guards / request"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        lookup = f"{r['lookup_us']:.0f} ({r['old_lookup_us']:.0f})" if "lookup_us" in r else "-"
        table.add_row(
            r["case"],
            f"{r['body_bytes'] / 1024:.1f}",
            f"{r['request_ms']:.1f}",
            f"{r['shape_us']:.1f}",
            lookup,
            f"{r['guards_pct']:.2f} %",
        )
    console.print(table)
    write_record(args.out, "guards.py", argv, machine_info(args.threads), t_start, rows=rows, memory=memory)
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
