"""Absolute, calibrated scores (issue 39): on held-out test queries, is /rerank's relevance_score a probability,
and does the absolute score rank a request's documents at least as well as today's per-request z-score?

The checkpoint's priors and calibration come from ``aheadrank fit-priors`` (the trainer's held-out part of the
train split) or, for a label-free build (``--build DIR`` of ``aheadrank build --labels none``), from its priors
stage: the default weights, calibrated on the pseudo-queries the trainer held out (each one's source document
its one relevant candidate). Here, on the test split (BM25 top-``--depth`` candidates, features through the store as
``fit-priors`` collects them), per feature set:

- ``relative``: today's served score, each feature z-scored over the query's candidates and combined by the
  fitted weights; its "probability" is what /rerank returned, sigmoid of that score;
- ``platt``: the absolute score (fixed statistics, its weights, Platt's sigmoid), the served one now;
- ``isotonic``: isotonic regression (scikit-learn) of the same absolute combination, fitted on the same
  held-out train queries: the alternative calibration, for comparison;
- ``platt-judged`` (a calibration fitted on pseudo-queries only): the same combination (its weights) calibrated
  instead on ``--judged-queries`` judged train queries drawn at random: what judgments would have given;
- ``platt-source-only`` (idem): calibrated on the same pseudo-queries with only each one's source document
  relevant (without ``aheadrank.build.near_source_labels``' near-source documents).

ECE: 10 equal-width bins over every (query, candidate) pair. nDCG@10 within the candidates (the ranking a
request of those documents gets). The reliability curve is plotted to ``--plot``.

    .venv/bin/python bench/calibration.py --checkpoint CKPT --store STORE --index BM25 \\
        --collection ../shared/data/scifact
    .venv/bin/python bench/calibration.py --build DIR --collection ../shared/data/scifact  # label-free
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import numpy as np
from benchkit import machine_info, write_record
from rich.console import Console
from rich.table import Table

from aheadrank.evaluation import paired_test
from aheadrank.passages import served_aggregation
from aheadrank.priors import (
    QueryFeatures,
    expected_calibration_error,
    fit_calibration,
    ndcg10,
    read_priors,
)

REPO = Path(__file__).resolve().parents[1]
console = Console(width=None if sys.stdout.isatty() else 160)
# ad-hoc texts have neural(+dense)(+window: --ad-hoc-windows), stored candidates all of theirs; each set measured
# where the checkpoint's calibration has it (the window where the priors weigh it) and the store has its features
FEATURE_SETS = (
    "neural",
    "neural+dense",
    "neural+dense+window",
    "neural+bm25+dense",
    "neural+bm25+dense+window",
)


def features(args, split: str, qids: list[str] | None) -> list[QueryFeatures]:
    from aheadrank.indexer.topics import read_beir_split

    from aheadrank.rerank import collect_features
    from aheadrank.runs import bm25_candidates

    queries, qrels = read_beir_split(args.collection, split)
    if qids is not None:
        queries = {q: queries[q] for q in qids if q in queries}
    cands = bm25_candidates(args.index, queries, args.depth)
    feats, _ = collect_features(
        args.checkpoint, args.store, queries, cands, qrels, args.device, aggregation=args.aggregation
    )
    return feats


def pseudo_features(args, near: float | None) -> tuple[list[QueryFeatures], list[QueryFeatures]]:
    """The build's held-out pseudo-queries as its priors stage calibrated on them (``near``: its
    near-source threshold), and the same with only the source documents relevant."""
    from aheadrank.build import near_source_labels, pseudo_validation
    from aheadrank.rerank import collect_features

    val, cands, qrels = pseudo_validation(args.build)
    source_only = collect_features(
        args.checkpoint, args.store, val, cands, qrels, args.device, aggregation=args.aggregation
    )[0]
    return near_source_labels(args.store, source_only, near)[0], source_only


def judged_sample(collection: Path, n: int, seed: int = 0) -> list[str]:
    """``n`` judged train queries drawn at random (sorted qids, ``seed``)."""
    from aheadrank.indexer.topics import read_beir_split

    _, qrels = read_beir_split(collection, "train")
    qids = sorted(q for q, r in qrels.items() if any(g > 0 for g in r.values()))
    return sorted(random.Random(seed).sample(qids, min(n, len(qids))))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-np.asarray(x, dtype=np.float64)))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--build", type=Path, help="an `aheadrank build` directory: its checkpoint, store and index"
    )
    ap.add_argument("--checkpoint", type=Path)
    ap.add_argument("--store", type=Path, help="its store, with the dense field")
    ap.add_argument("--index", type=Path, help="the collection's BM25 index")
    ap.add_argument(
        "--judged-queries",
        type=int,
        default=100,
        help="a calibration fitted on pseudo-queries is compared with one fitted on this many judged train queries",
    )
    ap.add_argument("--collection", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bins", type=int, default=10)
    ap.add_argument(
        "--out",
        type=Path,
        help="default: bench/results/calibration.json, with --build calibration-label-free-COLLECTION.json",
    )
    ap.add_argument("--plot", type=Path, help="default: --out's name with .png")
    args = ap.parse_args(argv)
    if args.build is not None:
        from aheadrank.build import paths

        p = paths(args.build)
        args.checkpoint, args.store, args.index = p["checkpoint"], p["store"], p["lucene"]
    if None in (args.checkpoint, args.store, args.index):
        ap.error("give --build DIR, or --checkpoint, --store and --index")
    name = f"calibration-label-free-{args.collection.name}" if args.build else "calibration"
    args.out = args.out or REPO / "bench" / "results" / f"{name}.json"
    args.plot = args.plot or args.out.with_suffix(".png")
    import torch
    from aheadrank.rankers import load_config
    from sklearn.isotonic import IsotonicRegression

    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    priors = read_priors(args.checkpoint)
    # a long document scored by its passages as served: what the priors were fitted with
    args.aggregation = served_aggregation(None, priors)
    cal = priors.calibrated() if priors is not None else None
    if cal is None:
        sys.exit(f"{args.checkpoint} has no calibrated priors: run `aheadrank fit-priors` first")
    pseudo = cal.fitted_on.get("labels") == "pseudo-queries"
    if pseudo:
        if args.build is None:
            sys.exit(
                "a calibration fitted on pseudo-queries is measured with --build DIR (its held-out queries)"
            )
        fit, source_only = pseudo_features(args, cal.fitted_on.get("near_source"))
    else:
        held_out = load_config(args.checkpoint).extra.get("train", {}).get("val_qids")
        fit = features(args, priors.fitted_on.get("split", "train"), held_out)
    judged_cal, judged_fit = None, []
    if pseudo and args.judged_queries > 0:  # the same combination, calibrated on judgments instead
        judged_fit = features(args, "train", judged_sample(args.collection, args.judged_queries))
        judged_cal = fit_calibration(judged_fit, {"labels": "judged", "split": "train"}, weights=cal.weights)
    source_cal = None
    if pseudo and cal.fitted_on.get("near_source") is not None:
        source_cal = fit_calibration(source_only, {"labels": "pseudo-queries"}, weights=cal.weights)
    test = features(args, "test", None)
    labels = np.concatenate([[q.qrels.get(d, 0) > 0 for d in q.docids] for q in test]).astype(float)
    fit_labels = np.concatenate([[q.qrels.get(d, 0) > 0 for d in q.docids] for q in fit]).astype(float)
    rows, curves = {}, {}
    for key in FEATURE_SETS:
        names = key.split("+")
        if key not in cal.platt or not all(f in test[0].features for f in names):
            continue

        def feats(q, names=names):
            return {f: q.features[f] for f in names}

        relative = [priors.combine(feats(q)) for q in test]
        absolute = [cal.logits(feats(q)) for q in test]
        iso = IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)
        iso.fit(np.concatenate([cal.combine(feats(q)) for q in fit]), fit_labels)
        isotonic = [iso.predict(cal.combine(feats(q))) for q in test]
        methods = {
            "relative": (relative, np.concatenate([sigmoid(s) for s in relative])),
            "platt": (absolute, np.concatenate([sigmoid(s) for s in absolute])),
            "isotonic": (isotonic, np.concatenate(isotonic)),
        }
        if judged_cal is not None:
            judged = [judged_cal.logits(feats(q)) for q in test]
            methods["platt-judged"] = (judged, np.concatenate([sigmoid(s) for s in judged]))
        if source_cal is not None:
            source = [source_cal.logits(feats(q)) for q in test]
            methods["platt-source-only"] = (source, np.concatenate([sigmoid(s) for s in source]))
        for method, (scores, probs) in methods.items():
            ece, table = expected_calibration_error(probs, labels, args.bins)
            # the top 10 of each query by this score: what a RAG app thresholds after re-ranking
            top = [np.argsort(-np.asarray(s), kind="stable")[:10] for s in scores]
            offsets = np.cumsum([0] + [len(q.docids) for q in test])[:-1]
            pick = np.concatenate([o + t for o, t in zip(offsets, top, strict=True)])
            ece10, _ = expected_calibration_error(probs[pick], labels[pick], args.bins)
            per_query = {
                str(i): ndcg10(s, q.docids, q.qrels)
                for i, (s, q) in enumerate(zip(scores, test, strict=True))
            }
            ndcg = float(np.mean(list(per_query.values())))
            if method == "relative":
                today = per_query
            vs = paired_test(today, per_query, "nDCG@10", margins=(0.02,))
            rows[f"{key} {method}"] = {
                "features": key,
                "method": method,
                "ece": ece,
                "ece_top10": ece10,
                "ndcg10": ndcg,
                "vs_relative": {
                    "diff": vs.mean_diff,
                    "p": vs.p,
                    "non_inferior_2pct": vs.non_inferiority[0].non_inferior,
                },
                "mean_p": float(probs.mean()),
                "reliability": table,
            }
            curves[(key, method)] = table
    record = write_record(
        args.out,
        "calibration",
        argv,
        machine_info(args.threads),
        t_start,
        checkpoint=args.checkpoint.name,
        collection=args.collection.name,
        fit={
            "split": priors.fitted_on.get("split"),
            "labels": cal.fitted_on.get("labels", "judged"),
            "queries": len(fit),
            "candidates": int(fit_labels.size),
            "relevant": int(fit_labels.sum()),
            "near_source": cal.fitted_on.get("near_source"),
        },
        judged_fit=None
        if judged_cal is None
        else {
            "split": "train",
            "queries": len(judged_fit),
            "platt": judged_cal.platt,
            "stats": judged_cal.stats,
        },
        build=None if args.build is None else build_summary(args.build),
        test={
            "split": "test",
            "queries": len(test),
            "candidates": int(labels.size),
            "relevant": int(labels.sum()),
        },
        depth=args.depth,
        passage_aggregation=args.aggregation,
        bins=args.bins,
        calibration={"method": cal.method, "weights": cal.weights, "platt": cal.platt, "stats": cal.stats},
        relative_weights=priors.weights,
        rows=rows,
    )
    table = Table(title=f"calibration on {args.collection.name} test ({len(test)} queries, top-{args.depth})")
    for col in ("features", "relevance_score", "ECE", "ECE top 10", "nDCG@10", "mean p"):
        table.add_column(col, justify="left" if col in ("features", "relevance_score") else "right")
    for r in rows.values():
        table.add_row(
            r["features"],
            r["method"],
            f"{r['ece']:.4f}",
            f"{r['ece_top10']:.4f}",
            f"{r['ndcg10']:.4f}",
            f"{r['mean_p']:.4f}",
        )
    console.print(table)
    plot(curves, args.plot, len(test), args.collection.name)
    write_markdown(args.out.with_suffix(".md"), record, args.plot.name)
    return record


def write_markdown(path: Path, record: dict, plot_name: str) -> None:
    """The table and, per feature set, the reliability of the served (Platt) score, beside the plot."""
    t, fit = record["test"], record["fit"]
    if fit.get("labels") == "pseudo-queries":
        b = record.get("build") or {}
        fitted = (
            f"the label-free build's priors stage: default weights, calibrated on {fit['queries']} held-out "
            f"pseudo-queries ({fit['candidates']:,} pairs, {fit['relevant']} relevant: each one's source "
            f"document and the candidates whose bi-encoder cosine with it is >= {fit.get('near_source')}; no "
            f"judgment read); build: {b.get('ranker')}, {b.get('steps')} training steps (kept: step "
            f"{b.get('best_step')})"
        )
        judged = record.get("judged_fit")
        if judged:
            fitted += (
                f". `platt-judged`: the same combination calibrated on {judged['queries']} judged train "
                "queries instead (what judgments would give); `platt-source-only`: calibrated on the pseudo-queries "
                "with only the source documents relevant"
            )
    else:
        fitted = (
            f"priors and calibration fitted by `aheadrank fit-priors` on {fit['queries']} held-out "
            f"{fit['split']} queries ({fit['candidates']:,} pairs)"
        )
    lines = [
        f"# Calibration of relevance_score: {record['collection']} test ({t['queries']} queries, BM25 "
        f"top-{record['depth']}, {t['candidates']:,} pairs, {t['relevant']} relevant; a document stored as passages "
        f"scored by `{record.get('passage_aggregation', 'first+max')}` of theirs)",
        "",
        f"Checkpoint `{record['checkpoint']}`; {fitted}. Command: `{record['command']}`. ECE: {record['bins']} "
        "equal-width bins; 'top 10': the 10 best of each query by that score. Plot: ["
        + plot_name
        + "]("
        + plot_name
        + ").",
        "",
        "| features | relevance_score | ECE | ECE top 10 | nDCG@10 | vs relative: diff, p, non-inferior (2 %) | mean p |",
        "|---|---|---:|---:|---:|---|---:|",
    ]
    for r in record["rows"].values():
        lines.append(
            f"| {r['features']} | {r['method']} | {r['ece']:.4f} | {r['ece_top10']:.4f} | {r['ndcg10']:.4f} "
            f"| {r['vs_relative']['diff']:+.4f}, p {r['vs_relative']['p']:.2f}, "
            f"{'yes' if r['vs_relative']['non_inferior_2pct'] else 'no'} | {r['mean_p']:.4f} |"
        )
    for r in record["rows"].values():
        if r["method"] not in ("platt", "platt-judged", "platt-source-only"):
            continue
        lines += [
            "",
            f"Reliability, {r['features']} ({'served' if r['method'] == 'platt' else r['method']}):",
            "",
            "| bin | pairs | mean p | fraction relevant |",
        ]
        lines.append("|---|---:|---:|---:|")
        for b in r["reliability"]:
            lines.append(
                f"| {b['lo']:.1f}-{b['hi']:.1f} | {b['n']:,} | {b['mean_p']:.3f} | {b['frac']:.3f} |"
            )
    path.write_text("\n".join(lines) + "\n")


def build_summary(build_dir: Path) -> dict:
    """What the build was: its ranker, training steps and priors stage (build.json)."""
    from aheadrank.build import read_record

    record = read_record(build_dir)
    train = record.stages.get("train", {}) if record else {}
    return {
        "dir": build_dir.name,
        "ranker": record.plan.get("ranker") if record else None,
        "steps": train.get("steps"),
        "best_step": train.get("best_step"),  # the step kept (best on the held-out pseudo-queries)
        "labels": record.plan.get("labels") if record else None,
        "priors": record.stages.get("priors") if record else None,
    }


def plot(curves: dict, path: Path, queries: int, collection: str = "scifact") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted({k for k, _ in curves}, key=FEATURE_SETS.index)
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 4.2), squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        ax.plot([0, 1], [0, 1], color="grey", lw=0.8, ls="--", label="perfect")
        for method, style in (
            ("platt", "o-"),
            ("platt-judged", "d--"),
            ("platt-source-only", "v-."),
            ("isotonic", "s-"),
            ("relative", "x:"),
        ):
            table = curves.get((key, method))
            if table:
                label = "platt (served)" if method == "platt" else method
                ax.plot([b["mean_p"] for b in table], [b["frac"] for b in table], style, label=label, ms=4)
        ax.set_title(key)
        ax.set_xlabel("predicted probability (bin mean)")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
    axes[0][0].set_ylabel("fraction relevant")
    axes[0][0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"relevance_score reliability, {collection} test ({queries} queries)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    main()
