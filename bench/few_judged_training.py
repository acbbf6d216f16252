"""A judged build trained on N judged queries against the label-free build: how many judgments it takes.

``aheadrank build`` trains on judgments wherever the collection has ``qrels/train.tsv`` (``--labels auto``), however
few they are: the judged recipe holds out a fifth of them (at most ``val_queries``) for validation and for fitting the
served weights, and trains on the rest. ``bench/few_judgments.py`` found that a label-free build's weights fitted on
judged queries never served above its own; this bench asks the other half: is a ranker *trained* on N judged queries
better than the label-free build a user gets without them?

For each N in ``--sizes``, N of the collection's judged train queries are drawn (seeded, queries with a relevant
document only) into a copy of the collection under ``--workdir`` (its corpus linked, its ``qrels/train.tsv`` holding
the draw, its test split the collection's), and ``aheadrank build --labels train`` builds it with the defaults
(resumable: a run stopped part-way goes on). On the test split (nDCG@10), beside the baselines of the same
candidates (BM25, the equal-weight fusion of BM25 and the bi-encoder):

- ``pure``: the judged build's neural score alone;
- ``served``: the judged build as it serves (its priors' weights, fitted on its held-out queries);
- ``label-free``: the label-free build's served run (``--label-free-run``, a TREC run of the same collection's test
  split: by default the committed ``bench/results/label-free/maxp-scifact/`` run of today's default build), compared
  query by query with ``served`` (paired t-test).

    .venv/bin/python bench/few_judged_training.py --collection scifact --sizes 50 200 400

Writes ``--out`` (``bench/results/few-judged-training``): ``few_judged_training.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

log = logging.getLogger("bench.few_judged_training")

LABEL_FREE_RUN = ROOT / "bench/results/label-free/maxp-scifact/scifact/runs/mores-2ib-s2+priors.trec.zst"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collection", default="scifact")
    ap.add_argument("--ranker", default="mores-2ib-s2")
    ap.add_argument(
        "--sizes", nargs="+", type=int, default=[50, 200, 400], help="judged train queries per build"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--label-free-run", type=Path, default=LABEL_FREE_RUN, help="the label-free served run")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--progress", action="store_true")
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "few-judged-training")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "few-judged-training")
    args = ap.parse_args(argv)
    if any(n < 5 for n in args.sizes):
        ap.error("--sizes must be at least 5 (the recipe holds out a fifth)")
    args.collections = [args.collection]
    return args


def drawn(qrels: dict, size: int, seed: int) -> list[str]:
    """``size`` of the judged queries with a relevant document, drawn without replacement; the same for the same
    arguments, and every smaller draw of one seed is not a subset of a larger (each size its own draw)."""
    from aheadrank.evaluation import evaluated_qids

    qids = sorted(evaluated_qids(qrels))  # in string order: the draws measured were made from it
    if size > len(qids):
        raise SystemExit(f"--sizes {size}: the collection has only {len(qids)} judged train queries")
    rng = np.random.default_rng([seed, size])
    return sorted(rng.choice(qids, size=size, replace=False).tolist())


def judged_copy(source: Path, out: Path, qids: list[str]) -> Path:
    """A BEIR folder of ``source``'s corpus (linked), its queries, its test qrels and the train qrels of ``qids``."""
    from aheadrank.indexer.topics import qrels_file, read_qrels

    out.mkdir(parents=True, exist_ok=True)
    (out / "qrels").mkdir(exist_ok=True)
    corpus = out / "corpus.jsonl"
    if not corpus.exists():
        corpus.symlink_to((source / "corpus.jsonl").resolve())
    queries = out / "queries.jsonl"
    if not queries.exists():
        queries.symlink_to((source / "queries.jsonl").resolve())
    test = out / "qrels" / "test.tsv"
    if not test.exists():
        test.symlink_to(qrels_file(source, "test").resolve())
    train = read_qrels(source, "train")
    rows = [f"{q}\t{d}\t{g}\n" for q in qids for d, g in sorted(train[q].items())]
    text = "query-id\tcorpus-id\tscore\n" + "".join(rows)
    path = out / "qrels" / "train.tsv"
    if not path.is_file() or path.read_text() != text:  # never rewritten under a build that read it
        path.write_text(text)
    return out


def bench_collection(args, name: str) -> list[dict]:
    import label_free as lf
    from aheadrank.indexer.topics import read_qrels
    from aheadrank.rankers import load_config
    from benchkit import Bm25Hits, eval_topics

    from aheadrank.build import BuildPlan, build, paths, read_record
    from aheadrank.evaluation import compare, evaluate, read_run
    from aheadrank.priors import read_priors, recorded_aggregation

    source = args.data / name
    train_qrels = read_qrels(source, "train")
    label_free = read_run(args.label_free_run)
    queries, qrels = eval_topics(source, "test", None)  # every build is evaluated on the same candidates
    cands = Bm25Hits(source, args.workdir, False).hits(queries, lf.DEPTH)
    results = []
    for size in args.sizes:
        qids = drawn(train_qrels, size, args.seed)
        collection = judged_copy(source, args.workdir / f"{name}-{size}", qids)
        out = args.workdir / f"{name}-{size}" / "build"
        t0 = time.perf_counter()
        plan = BuildPlan(
            str(collection),
            str(out),
            ranker=args.ranker,
            device=args.device,
            labels="train",
            progress=args.progress,
        )
        build(plan, echo=lambda line, n=size: log.info("%s-%d %s", name, n, line))
        record = read_record(out)
        p = paths(out)
        priors = read_priors(p["checkpoint"])
        aggregation = recorded_aggregation(None, p["checkpoint"])
        test = lf.neural_features(
            p["checkpoint"], p["store"], queries, cands, qrels, args.device, args.progress, aggregation
        )
        weights = priors.widest()
        baselines = lf.label_free_baselines(test)
        runs = {
            "bm25": baselines["bm25"],
            "fusion-equal": baselines["fusion-equal"],
            "pure": lf.runs_from(test, {"neural": 1.0}),
            "served": lf.runs_from(test, weights),
            "label-free": {q: label_free[q] for q, _ in test if q in label_free},
        }
        held = load_config(p["checkpoint"]).extra.get("train", {}).get("val_qids") or []
        row = {
            "collection": name,
            "judged_queries": size,
            "held_out_queries": len(held),
            "trained_on": size - len(held),
            "test_queries": len(test),
            "weights": weights,
            "aggregation": aggregation,
            "stages_s": {s: round(v.get("seconds", 0.0), 1) for s, v in record.stages.items()},
            "seconds": round(time.perf_counter() - t0, 1),
            "ndcg10": {k: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for k, r in runs.items()},
            "served_vs_label_free": lf.comparison(compare, runs["label-free"], runs["served"], qrels),
            "served_vs_fusion": lf.comparison(compare, runs["fusion-equal"], runs["served"], qrels),
            "pure_vs_bm25": lf.comparison(compare, runs["bm25"], runs["pure"], qrels),
        }
        log.info("%s", json.dumps({k: row[k] for k in ("judged_queries", "ndcg10", "served_vs_label_free")}))
        results.append(row)
    return results


def table(results: list[list[dict]]) -> str:
    import label_free as lf

    lines = [
        "| collection | judged queries (trained on / held out) | BM25 | fusion | judged pure (vs BM25) | "
        "judged served | label-free served | judged − label-free (p) | served weights | build min |",
        "|---|---|---:|---:|---|---:|---:|---|---|---:|",
    ]
    for rows in results:
        for r in rows:
            x = r["ndcg10"]
            w = "/".join(f"{r['weights'].get(k, 0):.2f}" for k in ("neural", "bm25", "dense"))
            lines.append(
                f"| {r['collection']} | {r['judged_queries']} ({r['trained_on']} / {r['held_out_queries']}) | "
                f"{x['bm25']:.4f} | {x['fusion-equal']:.4f} | {x['pure']:.4f} {lf.diff_p(r['pure_vs_bm25'])} | "
                f"{x['served']:.4f} | {x['label-free']:.4f} | {lf.diff_p(r['served_vs_label_free'])} | {w} | "
                f"{sum(r['stages_s'].values()) / 60:.0f} |"
            )
    lines.append("")
    lines.append("Weights: neural / BM25 / bi-encoder, fitted on the held-out queries by the build.")
    return "\n".join(lines)


def main(argv=None) -> int:
    import label_free as lf

    return lf.run_probe(argv, parse_args, bench_collection, table, "few_judged_training")


if __name__ == "__main__":
    raise SystemExit(main())
