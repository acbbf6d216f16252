"""Index-build throughput against the pure model forward rate (the ceiling), per ranker's document side.

For each ranker: the full `aheadrank index` build (collection reading, tokenisation in a background thread,
length-sorted batches, encoding, float16 conversion, atomic shard writes, manifest) over a prefix of a
collection, and — in the same run, on the same length-sorted batches — the model forward alone
(``document_fields`` on pre-tokenised, pre-padded batches). Target: build ≥ 85% of the forward rate.
Optionally (``--bm25``) the time of the BM25 Lucene index of the whole collection.

    .venv/bin/python bench/index.py --docs 2000                 # MS MARCO prefix (../shared/data)
    .venv/bin/python bench/index.py --docs 300 --rankers tk-2l  # quick
    .venv/bin/python bench/index.py --docs 2000 --rankers mores-2ib-s2 --dask-workers 1 2 --out bench/results/index-dask.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RANKERS = (
    "bert",
    "mores-1ib-s2",
    "mores-2ib-s1",
    "mores-2ib-s2",
    "prettr-l5-e128",
    "tk-2l",
)  # rankers/variants.py
DEFAULT_COLLECTION = REPO.parent / "shared" / "data" / "msmarco-passages" / "passages.jsonl"


def write_prefix(src: Path, n: int, dst: Path) -> int:
    count = 0
    with src.open("rb") as fin, dst.open("wb") as fout:
        for line in fin:
            if count == n:
                break
            fout.write(line)
            count += 1
    return count


def forward_rate(ranker, texts: list[str], batch_size: int) -> dict:
    """Pure model forward over the build's own length-sorted batches (tokenised and padded beforehand)."""
    import torch
    from aheadrank.indexer.build import length_batches
    from aheadrank.rankers.text import pad

    seqs = ranker.tokenize_documents(texts)
    batches = [
        pad([seqs[i] for i in idx], ranker.device, ranker._text().pad)
        for idx in length_batches([len(s) for s in seqs], batch_size)
    ]
    tokens = sum(len(s) for s in seqs)
    with torch.inference_mode():
        ranker.document_fields(*batches[0])  # warm-up
        start = time.perf_counter()
        for ids, mask in batches:
            ranker.document_fields(ids, mask)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "docs_s": len(seqs) / seconds, "tokens_s": tokens / seconds, "tokens": tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collection", type=Path, default=DEFAULT_COLLECTION)
    ap.add_argument("--docs", type=int, default=2000, help="prefix of the collection to index")
    ap.add_argument("--rankers", nargs="+", default=list(RANKERS), choices=list(RANKERS))
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--shard-size", type=int, default=1000)
    ap.add_argument("--max-doc-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="forward/build rounds per ranker (medians)")
    ap.add_argument("--bm25", action="store_true", help="also time the BM25 index of the whole collection")
    ap.add_argument(
        "--dask-workers",
        type=int,
        nargs="*",
        default=[],
        help="also build on a local Dask cluster of each of these many workers (1 process each, cores / N "
        "torch threads; wall time includes the cluster's start), shards of docs / (4 × the largest N)",
    )
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "index.json")
    args = ap.parse_args()
    if not args.collection.exists():
        sys.exit(f"collection {args.collection} not found (pass --collection)")

    import torch
    from aheadrank.indexer.build import BuildOptions, build_store
    from aheadrank.indexer.collections import Collection
    from aheadrank.rankers import load_ranker, save_checkpoint
    from aheadrank.rankers.variants import parse_variant
    from aheadrank.store import read_manifest
    from rich.console import Console
    from rich.table import Table

    work = Path(args.workdir or tempfile.mkdtemp(prefix="aheadrank-bench-index-"))
    work.mkdir(parents=True, exist_ok=True)
    prefix = work / "prefix.jsonl"
    n = write_prefix(args.collection, args.docs, prefix)
    texts = [d.text for d in Collection(prefix)]
    rows = []
    for name in args.rankers:
        variant = parse_variant(name)
        strategy = variant.strategy
        ckpt = work / f"ckpt-{name}"
        if not ckpt.exists():
            save_checkpoint(variant.init(max_doc_len=args.max_doc_len), ckpt)
        ranker = load_ranker(ckpt, strategy=strategy)
        store = work / f"store-{name}"
        forwards, builds = [], []
        for _ in range(args.rounds):  # interleaved, so both see the same machine load; medians reported
            forwards.append(forward_rate(ranker, texts, args.batch_size)["docs_s"])
            builds.append(
                build_store(
                    BuildOptions(
                        str(ckpt),
                        str(prefix),
                        str(store),
                        strategy=strategy,
                        shard_size=args.shard_size,
                        batch_size=args.batch_size,
                        overwrite=True,
                        progress=False,
                    )
                )
            )
        forwards.append(forward_rate(ranker, texts, args.batch_size)["docs_s"])
        dask = {}
        for workers in args.dask_workers:
            t0 = time.perf_counter()
            done = build_store(
                BuildOptions(
                    str(ckpt),
                    str(prefix),
                    str(work / f"store-{name}-dask{workers}"),
                    strategy=strategy,
                    shard_size=max(1, n // (4 * max(args.dask_workers))),
                    batch_size=args.batch_size,
                    overwrite=True,
                    progress=False,
                    workers=workers,
                )
            )
            wall = time.perf_counter() - t0
            dask[workers] = {"wall_s": wall, "docs_s": done.documents / wall, "build_seconds": done.seconds}
        fwd = statistics.median(forwards)
        build = sorted(builds, key=lambda b: b.docs_per_s)[len(builds) // 2]
        manifest = read_manifest(store)
        rows.append(
            {
                "ranker": name,
                "kind": variant.kind,
                "options": variant.options,
                "strategy": strategy,
                "documents": build.documents,
                "tokens": build.tokens,
                "build_seconds": build.seconds,
                "load_seconds": build.load_seconds,
                "build_docs_s": build.docs_per_s,
                "build_tokens_s": build.tokens / build.seconds,
                "forward_docs_s": fwd,
                "forward_docs_s_all": forwards,
                "build_docs_s_all": [b.docs_per_s for b in builds],
                "forward_tokens_s": fwd * build.tokens / build.documents,
                "efficiency": build.docs_per_s / fwd,
                "target_met": build.docs_per_s / fwd >= 0.85,
                "store_bytes_per_doc": manifest.n_bytes / build.documents,
                "fields": manifest.spec.fields,
                "dask": dask,
            }
        )
    bm25 = None
    if args.bm25:
        from aheadrank.indexer.bm25 import build_bm25_index

        res = build_bm25_index(args.collection, work / "lucene", progress=False)
        bm25 = {
            "documents": res.documents,
            "seconds": res.seconds,
            "target_seconds": 60,
            "target_met": res.seconds < 60,
        }

    table = Table(
        title=f"index build vs pure forward — {n} docs of {args.collection.name}, batch {args.batch_size}"
    )
    for col in (
        "ranker",
        "build docs/s",
        "build tok/s",
        "forward docs/s",
        "build/forward",
        "≥85%",
        "bytes/doc",
        *(f"dask {w}w docs/s" for w in args.dask_workers),
    ):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["ranker"],
            f"{r['build_docs_s']:.1f}",
            f"{r['build_tokens_s']:.0f}",
            f"{r['forward_docs_s']:.1f}",
            f"{r['efficiency']:.1%}",
            "yes" if r["target_met"] else "NO",
            f"{r['store_bytes_per_doc']:,.0f}",
            *(f"{r['dask'][w]['docs_s']:.1f}" for w in args.dask_workers),
        )
    console = Console()
    console.print(table)
    if bm25:
        console.print(
            f"BM25 index of {bm25['documents']:,} documents: {bm25['seconds']:.1f} s (target < 60 s)"
        )
    result = {
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__,
        },
        "collection": str(args.collection),
        "docs": n,
        "batch_size": args.batch_size,
        "shard_size": args.shard_size,
        "max_doc_len": args.max_doc_len,
        "dask_workers": args.dask_workers,
        "rows": rows,
        "bm25": bm25,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
