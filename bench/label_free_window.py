"""The passage window of a label-free build's stored passages. ``aheadrank build --passages`` splits a long document
at the ranker's window (``max_doc_len``: 128 word pieces for the packaged MORES); the bi-encoder's best window of 2
sentences (about 60 pieces, ``bench/label_free_passages.py``) scores far better than its whole document, so a
narrower window might serve the ranker better too. For each ``--windows`` value other than the ranker's, a copy of a
finished ``bench/label_free.py`` build (its ``--workdir`` and folder names; the main store hard-linked, not copied)
gets its passages rebuilt at that window (``aheadrank.indexer.build.build_passages`` with ``max_doc_len``), and the
pure and served (neural, BM25, bi-encoder 1/3 each) scores of the test split are measured under each
``--aggregations``, beside the label-free baselines. Nothing is trained.

Choose a window on one collection's judgments and apply it unchanged to the others (the issue's rule):

    .venv/bin/python bench/label_free_window.py --collections cranfield --windows 128 64 --steps 0 \\
        --out bench/results/label-free/window

Writes ``--out``: ``label_free_window.{json,md}``.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_window")


def parse_args(argv=None) -> argparse.Namespace:
    import label_free as lf

    from aheadrank.passages import AGGREGATIONS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["cranfield"])
    ap.add_argument("--ranker", default="mores-2ib-s2")
    ap.add_argument("--windows", nargs="+", type=int, default=[128, 64])
    ap.add_argument("--aggregations", nargs="+", choices=AGGREGATIONS, default=["maxp", "first+max"])
    lf.add_build_name_options(ap, passages=False)  # the source build stores passages: that is what is varied
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "label-free" / "window")
    args = ap.parse_args(argv)
    if any(w < 8 for w in args.windows):
        ap.error("--windows must be at least 8 word pieces")
    return lf.recipe_settings(args)


def rewindowed(
    source: Path, target: Path, collection: Path, window: int, strategy: str, device: str
) -> float:
    """``target``: ``source``'s build with its passages split at ``window`` (made once); the seconds it took."""
    from aheadrank.indexer.build import BuildOptions, build_passages
    from aheadrank.store import read_manifest
    from aheadrank.store.manifest import write_manifest_file
    from aheadrank.store.passages import PASSAGES_DIR

    if (target / "store" / PASSAGES_DIR / "manifest.json").is_file():
        return 0.0
    shutil.rmtree(target, ignore_errors=True)
    (target / "store").mkdir(parents=True)
    shutil.copy(source / "build.json", target / "build.json")
    shutil.copytree(source / "checkpoint", target / "checkpoint")
    for f in (source / "store").iterdir():
        if f.name not in (PASSAGES_DIR, "manifest.json"):  # the shards and dense/: hard links, read only
            subprocess.run(["cp", "-al", str(f), str(target / "store" / f.name)], check=True)
    shutil.copy(source / "store" / "manifest.json", target / "store" / "manifest.json")
    write_manifest_file(target / "store", replace(read_manifest(target / "store"), passages=None))
    t0 = time.perf_counter()
    opts = BuildOptions(
        str(target / "checkpoint"),
        str(collection),
        str(target / "store"),
        strategy=strategy,
        max_doc_len=window,
        device=device,
        progress=False,
    )
    build_passages(opts)
    return round(time.perf_counter() - t0, 1)


def bench_collection(args, name: str) -> dict:
    import label_free as lf
    from aheadrank.rankers import load_config

    from aheadrank.build import _variant, paths

    collection = args.data / name
    source, queries, qrels, cands, _, _, baselines, scores, best = lf.probe_setup(args, name)
    own = int(load_config(paths(source)["checkpoint"]).max_doc_len)
    out = {
        "collection": name,
        "ranker_window": own,
        "baselines": scores,
        "best_baseline": best,
        "windows": {},
    }
    for window in args.windows:
        d = source if window == own else args.workdir / name / "windows" / f"{source.name}-w{window}"
        seconds = (
            0.0
            if window == own
            else rewindowed(source, d, collection, window, _variant(args.ranker).strategy, args.device)
        )
        row = {"build": str(d), "passages_seconds": seconds, "runs": {}}
        for agg in args.aggregations:
            p = paths(d)
            vf = lf.neural_features(
                p["checkpoint"], p["store"], queries, cands, qrels, args.device, False, agg
            )
            for kind, x in lf.pure_and_served(vf, qrels, baselines, best).items():
                row["runs"][f"{agg}/{kind}"] = x
        out["windows"][str(window)] = row
        log.info("%s window %d: %s", name, window, {k: round(r["ndcg10"], 4) for k, r in row["runs"].items()})
    return out


def table(results: list[dict]) -> str:
    import label_free as lf

    return lf.window_table(results, "windows", "window")


def main(argv=None) -> int:
    import label_free as lf

    return lf.run_probe(argv, parse_args, bench_collection, table, "label_free_window")


if __name__ == "__main__":
    raise SystemExit(main())
