"""A store build's peak memory and time against its shard size, side by side in one run.

The indexer holds a shard's encoded fields in memory until the shard is written, and encodes the next shard while
the last is written (indexer/build.py), so a build's memory grows with ``--shard-size``; a build stopped and
resumed redoes the shard it was in. For each shard size this runs ``aheadrank index`` (the command itself, in a
child process whose peak resident set size ``wait4`` reports) over the same collection with the same untrained
checkpoint of each ranker (its values do not change what the build holds in memory), then checks that every
store holds the same fields: the shard size changes where a document is, never what is stored.

    .venv/bin/python bench/build_memory.py                                  # SciFact, MORES 2×IB S2, passages
    .venv/bin/python bench/build_memory.py --rankers mores-2ib-s2 tk-6l-base --shard-sizes 10000 1024 256

Prints a table and writes JSON (``--out``); the ratios to the first shard size are what compare across machines.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchkit import machine_info, write_record  # noqa: E402

DEFAULT_COLLECTION = REPO.parent / "shared" / "data" / "scifact"


def run_index(
    checkpoint: Path, collection: Path, store: Path, strategy: str | None, shard_size: int, passages: bool
):
    """``aheadrank index`` in a child process: (wall seconds, peak RSS in MB); its output is shown if it fails."""
    cmd = [
        sys.executable,
        "-m",
        "aheadrank.cli",
        "index",
        "--checkpoint",
        str(checkpoint),
        "--collection",
        str(collection),
        "--store",
        str(store),
        "--shard-size",
        str(shard_size),
        "--no-dense",
        "--no-progress",
        *(["--strategy", strategy] if strategy else []),
        *(["--passages"] if passages else []),
    ]
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - t0
        log.seek(0)
        output = log.read().decode("utf-8", "replace")
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{output}")
    return seconds, usage.ru_maxrss / 1024  # ru_maxrss: kB on Linux


# Documents are encoded in length-sorted batches within their shard, so another shard size batches them with
# other documents: the same values up to the float rounding of other matrix shapes (float16 keeps 11 bits)
TOLERANCE = 2**-8  # largest difference allowed, relative to the field's largest value in the batch


def same_fields(a: Path, b: Path, sample: int, seed: int = 0) -> tuple[int, float]:
    """The documents (a seeded sample of ``sample``) both stores hold, compared field by field: (how many were
    compared, the largest difference relative to the field's largest value); raises where the docids or lengths
    differ or a difference exceeds :data:`TOLERANCE`."""
    import numpy as np
    from aheadrank.store import StoreReader

    worst = 0.0
    with StoreReader(a) as ra, StoreReader(b) as rb:
        ids = ra.docids()
        if ids != rb.docids():
            raise SystemExit(f"{a} and {b} hold other docids")
        pick = sorted(random.Random(seed).sample(ids, min(sample, len(ids))))
        for start in range(0, len(pick), 64):
            batch = pick[start : start + 64]
            fa, fb = ra.fetch(batch), rb.fetch(batch)
            if not np.array_equal(fa.lengths, fb.lengths):
                raise SystemExit(f"{a} and {b}: other document lengths")
            for name, va in fa.fields.items():
                x, y = np.asarray(va, np.float32), np.asarray(fb.fields[name], np.float32)
                diff = float(np.abs(x - y).max() / max(float(np.abs(x).max()), 1e-12))
                worst = max(worst, diff)
                if diff > TOLERANCE:
                    raise SystemExit(
                        f"{a} and {b}: field {name} differs (by {diff:.2e} of its largest value)"
                    )
    return len(pick), worst


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collection", type=Path, default=DEFAULT_COLLECTION)
    ap.add_argument("--rankers", nargs="+", default=["mores-2ib-s2"])
    ap.add_argument("--shard-sizes", nargs="+", type=int, default=[10_000, 1_024])
    ap.add_argument(
        "--passages",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="store long documents as passages too (what a label-free build does)",
    )
    ap.add_argument("--sample", type=int, default=512, help="documents compared between the stores")
    ap.add_argument("--base", default=None, help="base model folder (default: the packaged MiniLM)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument(
        "--out", type=Path, default=REPO / "bench" / "results" / "build-memory" / "build_memory.json"
    )
    args = ap.parse_args(argv)

    from aheadrank.indexer.build import store_disk_bytes
    from aheadrank.rankers import save_checkpoint
    from aheadrank.rankers.variants import parse_variant
    from aheadrank.store import read_manifest

    t_start = time.perf_counter()
    info = machine_info(1)
    rows = []
    with tempfile.TemporaryDirectory(dir=args.workdir, prefix="aheadrank-build-memory-") as tmp:
        root = Path(tmp)
        for name in args.rankers:
            variant = parse_variant(name)
            ckpt = root / variant.model
            if not ckpt.exists():
                save_checkpoint(variant.init(base=args.base), ckpt)
            stores = []
            for size in args.shard_sizes:
                store = root / f"{name}-{size}"
                seconds, rss_mb = run_index(
                    ckpt, args.collection, store, variant.strategy, size, args.passages
                )
                manifest = read_manifest(store)
                passages = store / "passages"
                row = {
                    "ranker": name,
                    "shard_size": size,
                    "documents": manifest.n_docs,
                    "shards": len(manifest.shards),
                    "passages": read_manifest(passages).n_docs
                    if (passages / "manifest.json").is_file()
                    else 0,
                    "seconds": round(seconds, 1),
                    "peak_rss_mb": round(rss_mb),
                    "store_mb": round(store_disk_bytes(store)["all"] / 1e6),
                }
                if stores:
                    first = stores[0]
                    row["compared"], row["max_rel_diff"] = same_fields(first, store, args.sample)
                    if (first / "passages" / "manifest.json").is_file():
                        row["compared_passages"], worst = same_fields(
                            first / "passages", passages, args.sample
                        )
                        row["max_rel_diff"] = max(row["max_rel_diff"], worst)
                    base = rows[-len(stores)]
                    row["rss_ratio"] = round(row["peak_rss_mb"] / base["peak_rss_mb"], 3)
                    row["time_ratio"] = round(row["seconds"] / base["seconds"], 3)
                stores.append(store)
                rows.append(row)
                print(f"{name} shard {size}: {row}", flush=True)
            for store in stores:
                shutil.rmtree(store, ignore_errors=True)

    header = "| ranker | shard size | shards | passages | time (s) | peak RSS (MB) | RSS ratio | time ratio | same fields |"
    lines = [header, "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        same = "(reference)"
        if "compared" in r:
            passages = f", {r['compared_passages']} passages" if "compared_passages" in r else ""
            same = f"{r['compared']} docs{passages} (within {r['max_rel_diff']:.1e})"
        lines.append(
            f"| {r['ranker']} | {r['shard_size']:,} | {r['shards']} | {r['passages']:,} | {r['seconds']:.0f} | "
            f"{r['peak_rss_mb']:,} | {r.get('rss_ratio', 1.0):.2f} | {r.get('time_ratio', 1.0):.2f} | "
            f"{same} |"
        )
    table = "\n".join(lines)
    print(table)
    write_record(
        args.out,
        "build_memory",
        argv,
        info,
        t_start,
        collection=str(args.collection),
        passages=args.passages,
        rows=rows,
    )
    args.out.with_suffix(".md").write_text(
        f"# Store build memory against shard size (bench/build_memory.py)\n\n{table}\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
