"""Label-free with a query log: the ranker trained on real, unjudged queries, each labelled by the label-free teacher.

A user with no judgments often has queries: a log of what was searched. Here the log is every query of the
collection that is not in its test split (SciFact 809, Cranfield 150, Vaswani 62): their *texts* only. No judgment
of them is read; the test split's qids are read to leave its queries out, as evaluation reads them anyway. Each
log query's label is the equal-weight fusion's best candidate among BM25's top 100 (the teacher the label-free
build already computes, ``aheadrank.baselines.EQUAL_FUSION``), written as a qrels split ``teacher`` of a copy of
the collection (symbolic links to its corpus and queries), and the ranker is trained on it by the judged recipe
(``aheadrank build --labels teacher``: the cross-entropy on the label beside the listwise KL from the same fusion,
the validation on held-out log queries with the same labels). Nothing is chosen on any judgment.

Per collection: the shared stages (BM25, the dense field; no sentence windows) built once, the build trained on
the log (its BM25 index and dense field linked, not rebuilt), then the test split: BM25, the bi-encoder, RRF, the
equal-weight fusion, the ranker alone (``pure``) and served at 1/3 each with BM25 and the bi-encoder (the label-free
default weights without the window prior), for each ``--aggregation`` of a long document's passages.

    .venv/bin/python bench/label_free_query_log.py --collections scifact --rankers mores-2ib-s2 \\
        --out bench/results/label-free/query-log

Writes ``--out``: ``label_free_query_log.{json,md}`` and the runs ``<collection>/runs/*.trec.zst``.
"""

from __future__ import annotations

import argparse
import csv
import json
import logging
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_query_log")
DEPTH = 100
SPLIT = "teacher"  # the qrels split the log's teacher labels are written as
SERVED = {
    "neural": 1 / 3,
    "bm25": 1 / 3,
    "dense": 1 / 3,
}  # label_free.pure_and_served's: the default without windows


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["scifact", "cranfield", "vaswani"])
    ap.add_argument("--rankers", nargs="+", default=["mores-2ib-s2"])
    ap.add_argument("--aggregation", nargs="+", default=["maxp", "first+max"])
    ap.add_argument("--steps", type=int, default=None, help="training steps (default: the recipe's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free-query-log")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "label-free" / "query-log")
    ap.add_argument("--max-test-queries", type=int, default=None)
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    return ap.parse_args(argv)


def test_qids(collection: Path) -> set[str]:
    with open(collection / "qrels" / "test.tsv", newline="") as f:
        return {row[0] for row in csv.reader(f, delimiter="\t") if row and row[0] != "query-id"}


def log_queries(collection: Path) -> dict[str, str]:
    """Every query of ``collection`` outside its test split: the log (texts only)."""
    held = test_qids(collection)
    out = {}
    with open(collection / "queries.jsonl") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                if str(d["_id"]) not in held:
                    out[str(d["_id"])] = d["text"]
    return out


def teacher_labels(queries: dict[str, str], hits: dict, dense_field: Path, device: str) -> dict[str, str]:
    """{qid: the equal-weight fusion's best candidate} over each query's BM25 ``hits`` (ties: the first in BM25
    order)."""
    from aheadrank.baselines import EQUAL_FUSION, dense_features, feature_run

    run = feature_run(dense_features(dense_field, queries, hits, device=device), EQUAL_FUSION)
    return {q: max(scores, key=scores.get) for q, scores in sorted(run.items()) if scores}


def log_collection(collection: Path, labels: dict[str, str], out: Path) -> Path:
    """A copy of ``collection`` (links to its corpus, queries and test qrels) with the labels as qrels/teacher.tsv."""
    from aheadrank.fsfaults import atomic_write_text

    (out / "qrels").mkdir(parents=True, exist_ok=True)
    for name in ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv"):
        link = out / name
        if not link.exists():
            link.symlink_to((collection / name).resolve())
    lines = ["query-id\tcorpus-id\tscore\n", *(f"{q}\t{d}\t1\n" for q, d in labels.items())]
    atomic_write_text(out / "qrels" / f"{SPLIT}.tsv", "".join(lines))
    return out


def bench_collection(args, name: str) -> dict:
    from benchkit import Bm25Hits, eval_topics
    from label_free import label_free_baselines, neural_features, pure_and_served, runs_from, write_zst_run

    from aheadrank.build import BuildPlan, build, paths
    from aheadrank.evaluation import evaluate

    collection = args.data / name
    work = args.workdir / name
    hits = Bm25Hits(collection, args.workdir, args.progress)
    shared = work / "shared"
    plan = BuildPlan(str(collection), str(shared), labels="none", windows=False, progress=args.progress)
    build(plan, search=hits.hits, until="dense", echo=log.info)
    log_q = log_queries(collection)
    t0 = time.perf_counter()
    labels = teacher_labels(log_q, hits.hits(log_q, DEPTH), paths(shared)["dense"], args.device)
    label_s = time.perf_counter() - t0
    logged = log_collection(collection, labels, work / "log-collection")
    queries, qrels = eval_topics(collection, "test", args.max_test_queries)
    cands = hits.hits(queries, DEPTH)
    result = {
        "collection": name,
        "log_queries": len(log_q),
        "labels": len(labels),
        "label_seconds": round(label_s, 1),
    }
    result["variants"] = {}
    out_runs = args.out / name / "runs"
    out_runs.mkdir(parents=True, exist_ok=True)
    for v in args.rankers:
        d = work / f"{v}-{SPLIT}"
        d.mkdir(parents=True, exist_ok=True)
        for key in ("lucene", "dense"):  # the shared stages' outputs, linked (the build skips a complete one)
            if not paths(d)[key].exists():
                paths(d)[key].symlink_to(paths(shared)[key].resolve())
        record = build(
            BuildPlan(
                str(logged),
                str(d),
                ranker=v,
                labels=SPLIT,
                steps=args.steps,
                passages=True,
                windows=False,
                device=args.device,
                progress=args.progress,
            ),
            search=hits.hits,
            echo=log.info,
        )
        row = {"build": record.stages, "aggregations": {}}
        p = paths(d)
        for agg in args.aggregation:
            vf = neural_features(
                p["checkpoint"], p["store"], queries, cands, qrels, args.device, args.progress, agg
            )
            base = label_free_baselines(vf)
            scores = {k: evaluate(run, qrels, ("nDCG@10",))["nDCG@10"] for k, run in base.items()}
            best = max(("rrf", "fusion-equal"), key=scores.get)
            rows = pure_and_served(vf, qrels, base, best)
            for kind, weights in (("pure", {"neural": 1.0}), ("served", SERVED)):
                tag = f"{v}-{SPLIT}-{kind}-{agg}".replace("+", "_")
                write_zst_run(out_runs / f"{tag}.trec.zst", runs_from(vf, weights), tag)
            row["aggregations"][agg] = {"baselines": scores, "best_baseline": best, "runs": rows}
            log.info("%s %s %s: %s", name, v, agg, {k: round(r["ndcg10"], 4) for k, r in rows.items()})
        result["test_queries"] = len(vf)
        result["variants"][v] = row
    return result


def table(results: list[dict]) -> str:
    from label_free import diff_p

    lines = []
    for r in results:
        lines += [
            "",
            f"### {r['collection']} ({r.get('test_queries', '?')} test queries; the log: {r['log_queries']} unjudged "
            f"queries, {r['labels']} teacher labels)",
            "",
            "| aggregation | run | nDCG@10 | vs BM25 (diff, p) | vs best label-free fusion (diff, p) |",
            "|---|---|---:|---|---|",
        ]
        for v, row in r["variants"].items():
            for agg, a in row["aggregations"].items():
                for name, score in a["baselines"].items():
                    lines.append(f"| {agg} | {name} | {score:.4f} | | |")
                for kind, x in a["runs"].items():
                    vs = f"{diff_p(x['vs_best_baseline'])} vs {a['best_baseline']}"
                    lines.append(
                        f"| {agg} | {v} {kind} | {x['ndcg10']:.4f} | {diff_p(x['vs_bm25'])} | {vs} |"
                    )
            stages = ", ".join(f"{k}={s.get('seconds', 0):.0f}" for k, s in row["build"].items())
            lines += ["", f"build stages (s) of {v}: {stages}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    from label_free import run_probe

    return run_probe(argv, parse_args, bench_collection, table, "label_free_query_log")


if __name__ == "__main__":
    raise SystemExit(main())
