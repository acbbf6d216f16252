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
DEPTH = 100


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
    from benchkit import Bm25Hits, eval_topics

    from aheadrank.baselines import dense_features
    from aheadrank.build import _variant, paths
    from aheadrank.evaluation import compare, evaluate

    collection = args.data / name
    source = args.workdir / name / lf.build_name(args, name, args.ranker)
    if not (source / "build.json").is_file():
        raise SystemExit(f"no build at {source}: run bench/label_free.py with the same settings first")
    queries, qrels = eval_topics(collection, "test", None)
    cands = Bm25Hits(collection, args.workdir, False).hits(queries, DEPTH)
    feats = dense_features(
        paths(args.workdir / name / "shared")["dense"], queries, cands, qrels, device=args.device
    )
    qids = sorted(q for q in feats if any(r > 0 for r in qrels.get(q, {}).values()))
    baselines = lf.label_free_baselines([(q, feats[q]) for q in qids])
    scores = {k: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for k, r in baselines.items()}
    best = max(("rrf", "fusion-equal"), key=scores.get)
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
            for kind, w in (
                ("pure", {"neural": 1.0}),
                ("served", {"neural": 1 / 3, "bm25": 1 / 3, "dense": 1 / 3}),
            ):
                run = lf.runs_from(vf, w)
                row["runs"][f"{agg}/{kind}"] = {
                    "ndcg10": evaluate(run, qrels, ("nDCG@10",))["nDCG@10"],
                    "vs_bm25": lf.comparison(compare, baselines["bm25"], run, qrels),
                    "vs_best_baseline": lf.comparison(compare, baselines[best], run, qrels),
                }
        out["windows"][str(window)] = row
        log.info("%s window %d: %s", name, window, {k: round(r["ndcg10"], 4) for k, r in row["runs"].items()})
    return out


def table(results: list[dict]) -> str:
    lines = []
    for r in results:
        b = r["baselines"]
        lines.append(
            f"\n### {r['collection']} (the ranker's window {r['ranker_window']}; BM25 {b['bm25']:.4f}, "
            f"{r['best_baseline']} {b[r['best_baseline']]:.4f})\n"
        )
        lines.append("| window | run | nDCG@10 | vs BM25 (diff, p) | vs better fusion (diff, p) |")
        lines.append("|---:|---|---:|---|---|")
        for window, row in r["windows"].items():
            for name, x in row["runs"].items():
                lines.append(
                    f"| {window} | {name} | {x['ndcg10']:.4f} | {x['vs_bm25']['diff']:+.4f} ({x['vs_bm25']['p']:.2g}) | "
                    f"{x['vs_best_baseline']['diff']:+.4f} ({x['vs_best_baseline']['p']:.2g}) |"
                )
    return "\n".join(lines)


def main(argv=None) -> int:
    import label_free as lf

    return lf.run_probe(argv, parse_args, bench_collection, table, "label_free_window")


if __name__ == "__main__":
    raise SystemExit(main())
