"""BM25 search time with the raw documents inside the searched Lucene index vs in their own index (commit 14f7dea).

Anserini's ``SimpleSearcher.search`` loads every hit's stored document; with the raw texts stored beside the
postings (Pyserini's ``-storeRaw``) that load dominates a search at depth 1000. ``build_bm25_index`` now puts the
raw texts in a second index (``texts/``, for ``Bm25Searcher.doc_text``) unless ``separate_texts=False``. This
script builds the collection both ways in one run and times ``Bm25Searcher.search`` at each depth over the same
queries, the two indexes alternating query by query, and checks that both return the same ranked lists.

    .venv/bin/python bench/bm25.py                                    # SciFact (../shared/data), bench/results/bm25.json
    .venv/bin/python bench/bm25.py --collection aheadrank/data/scifact-sample --queries 50
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from aheadrank.indexer.bm25 import Bm25Searcher, build_bm25_index
from benchkit import machine_info, write_record
from rich.console import Console
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "scifact"
SAMPLE = REPO / "aheadrank" / "data" / "scifact-sample"
console = Console(width=None if sys.stdout.isatty() else 140)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collection", type=Path, default=SHARED if SHARED.is_dir() else SAMPLE)
    p.add_argument("--queries", type=int, default=300, help="queries of the collection's queries.jsonl")
    p.add_argument("--depths", type=int, nargs="+", default=[100, 1000])
    p.add_argument("--rounds", type=int, default=3, help="passes over the queries (the first one is warm-up)")
    p.add_argument("--threads", type=int, default=2, help="indexing threads")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "bm25.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    queries_file = args.collection / "queries.jsonl"
    with open(queries_file, encoding="utf-8") as f:
        queries = [json.loads(line)["text"] for line in f if line.strip()][: args.queries]
    corpus = args.collection / "corpus.jsonl"
    rows, builds = [], {}
    with tempfile.TemporaryDirectory(prefix="aheadrank-bench-bm25-") as tmp:
        layouts = {"texts inside": False, "texts apart": True}
        for name, apart in layouts.items():
            result = build_bm25_index(
                corpus, Path(tmp) / name.replace(" ", "-"), threads=args.threads, progress=False,
                separate_texts=apart,
            )  # fmt: skip
            builds[name] = {"documents": result.documents, "index_s": round(result.index_seconds, 2)}
        searchers = {name: Bm25Searcher(Path(tmp) / name.replace(" ", "-")) for name in layouts}
        try:
            for depth in args.depths:
                times: dict[str, list[float]] = {name: [] for name in layouts}
                same = True
                for round_ in range(args.rounds):
                    for query in queries:
                        hits = {}
                        for name, searcher in searchers.items():
                            t0 = time.perf_counter()
                            hits[name] = searcher.search(query, depth)
                            if round_:
                                times[name].append(time.perf_counter() - t0)
                        same = same and hits["texts inside"] == hits["texts apart"]
                med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
                rows.append(
                    {
                        "depth": depth,
                        "queries": len(queries),
                        "ms_median": med,
                        "ms_mean": {name: statistics.fmean(t) * 1e3 for name, t in times.items()},
                        "speedup_median": med["texts inside"] / med["texts apart"],
                        "same_results": same,
                    }
                )
        finally:
            for searcher in searchers.values():
                searcher.close()
    table = Table(title=f"BM25 search, {args.collection.name}, median ms per query (interleaved)")
    for col in ("depth", "texts inside", "texts apart", "×", "same lists"):
        table.add_column(col, justify="right")
    for r in rows:
        m = r["ms_median"]
        table.add_row(
            str(r["depth"]),
            f"{m['texts inside']:.2f}",
            f"{m['texts apart']:.2f}",
            f"{r['speedup_median']:.2f}",
            str(r["same_results"]),
        )
    console.print(table)
    write_record(
        args.out,
        "bm25",
        argv,
        machine_info(1),
        t_start,
        collection=str(args.collection),
        builds=builds,
        rows=rows,
    )
    console.print(f"wrote {args.out}")
    return 0 if all(r["same_results"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
