"""The HTTP guards' cost against a real request: POST /v1/rerank of 100 stored candidates through the app with the
guards (API key read from the headers before the body, the body deadline, requests taking turns on the model
thread) and without them, alternating in blocks of 10, in one process (``bench/soak.py``'s ``guard_cost``), for a
MORES 2xIB S2 ranker on the packaged all-MiniLM-L6-v2 base (untrained: the same cost as trained) over the bundled
SciFact sample. Prints the medians and writes ``bench/results/guard_cost.json``.

    .venv/bin/python bench/guard_cost.py [--candidates 100] [--blocks 40] [--threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

from benchkit import SAMPLE, machine_info, write_record  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--candidates", type=int, default=100)
    ap.add_argument("--blocks", type=int, default=40, help="blocks of 10 requests per side")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/aheadrank-bench-guards"))
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "guard_cost.json")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from aheadrank.indexer.build import BuildOptions, build_store
    from aheadrank.rankers import init_ranker, save_checkpoint
    from soak import corpus, guard_cost

    t0 = time.perf_counter()
    ckpt, store = args.workdir / "ckpt", args.workdir / "store"
    if not (ckpt / "fingerprint.json").is_file():
        save_checkpoint(init_ranker("mores", ibs=2), ckpt, overwrite=True)
    if not (store / "manifest.json").is_file():
        build_store(BuildOptions(str(ckpt), str(SAMPLE), str(store), strategy="s2", progress=False))
    docids, _ = corpus()
    result = guard_cost(ckpt, store, args.blocks, docids, args.candidates, "MORES 2xIB S2 on MiniLM")
    print(
        f"guards {result['median_ms']['guarded']} ms / none {result['median_ms']['plain']} ms = {result['ratio']} "
        f"({result['requests_per_side']} requests a side)"
    )
    write_record(args.out, "guard_cost", argv, machine_info(args.threads), t0, **result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
