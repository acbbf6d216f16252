"""What BM25's JVM keeps resident after a build's queries stage, and what ``release_java_memory`` gives back.

``aheadrank build`` runs Pyserini in its own process: the BM25 index, then the label-free training queries'
searches (3,000 pseudo-queries over BM25's top candidates). The JVM grows its heap for them, up to Java's default
maximum (a quarter of the machine's memory), and keeps it through every later stage unless told to give it back
(``aheadrank.indexer.bm25.release_java_memory``, which the build calls after each stage since it was added).
This bench runs the queries stage's work (``aheadrank.runs.build_label_free_training_data``) in a fresh child
process per round, reads its resident memory (``VmRSS``) right after, calls the release, and reads it again once
the JVM has handed the heap back (polled for up to 10 s).

    .venv/bin/python bench/java_memory.py --collection ../shared/data/scifact

Writes ``--out``: ``java_memory.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

CHILD = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, sys.argv[4])  # bench/
    from benchkit import proc_status
    from aheadrank.indexer.bm25 import release_java_memory
    from aheadrank.runs import build_label_free_training_data

    def rss():
        return proc_status()["VmRSS"] / 1024

    collection, index, queries = sys.argv[1], sys.argv[2], int(sys.argv[3])
    start = rss()
    t0 = time.perf_counter()
    data, hits, pq = build_label_free_training_data(collection, index, max_queries=queries, seed=0)
    seconds = time.perf_counter() - t0
    after = rss()
    t1 = time.perf_counter()
    release_java_memory()
    released = rss()
    while time.perf_counter() - t1 < 10:
        time.sleep(0.2)
        released = min(released, rss())
    print(json.dumps({"queries": len(pq.queries), "search_s": round(seconds, 1), "rss_start_mb": round(start),
                      "rss_after_queries_mb": round(after), "rss_after_release_mb": round(released),
                      "release_s": round(time.perf_counter() - t1, 1)}))
    """
)


def main(argv=None) -> int:
    from benchkit import ensure_bm25_index, machine_info, write_record

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collection", type=Path, default=ROOT.parent / "shared" / "data" / "scifact")
    ap.add_argument("--max-queries", type=int, default=3000, help="the build's default")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "java-memory")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    index = ensure_bm25_index(args.collection, args.workdir, False)
    rows = []
    for _ in range(args.rounds):
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                str(args.collection),
                str(index),
                str(args.max_queries),
                str(ROOT / "bench"),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if out.returncode != 0:
            raise SystemExit(f"the child failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    lines = [
        f"{args.collection.name}: the queries stage's searches in a fresh process, then `release_java_memory()`",
        "",
        "| round | queries | search (s) | RSS before (MB) | RSS after the searches (MB) | RSS after the release (MB) "
        "| given back (MB) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, r in enumerate(rows, 1):
        back = r["rss_after_queries_mb"] - r["rss_after_release_mb"]
        lines.append(
            f"| {i} | {r['queries']:,} | {r['search_s']} | {r['rss_start_mb']:,} | {r['rss_after_queries_mb']:,} | "
            f"{r['rss_after_release_mb']:,} | {back:,} |"
        )
    md = "\n".join(lines) + "\n"
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "java_memory.md").write_text(md)
    fields = {"collection": args.collection.name, "rounds": rows}
    write_record(args.out / "java_memory.json", "java_memory", argv, machine_info(2), t0, **fields)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
