"""TK's time-budget evaluation: effectiveness of each ranker when a query may spend at most B ms re-ranking.

Per ranker (a checkpoint and its store), on this machine: the per-query cost of re-ranking the first n
BM25 candidates through the precomputed path (``encode_query`` + store fetch + ``score_batch``, the
``aheadrank.runs.score_stored`` loop that ``rerank-run`` and the service share) is timed at several n
(median over ``--timing-queries`` real queries × ``--repeats`` interleaved rounds, after a warm-up) and a
line ``t(n) = a + b·n`` is fitted by least squares. For each budget B (a 1-2-5 log scale from 10 ms up to
the first value at which every ranker re-ranks the full ``--depth``, or ``--budgets``) the depth a ranker can
afford is ``k = clamp(floor((B − a) / b), 0, depth)``: its first k BM25 candidates are re-ranked and the
tail keeps BM25 order, exactly what the service's ``time_budget_ms`` does. nDCG@10 and MRR@10 of those runs
on the ``--split`` queries are reported against B, with BM25 (k = 0) as the floor line.

Scores are computed once per query over the full depth (or read back from the run files
``bench/effectiveness.py`` wrote, when their depth covers ``--depth``): a document's score does not depend
on which other candidates are scored with it, so the run at depth k re-orders the first k by those scores.

Rankers: ``--checkpoint NAME=DIR`` with ``--store NAME=DIR`` pairs (plus ``--collection``; the BM25 index
from ``--index`` or built in ``--workdir``), or by default every ranker of ``--effectiveness`` (the JSON
``bench/effectiveness.py`` wrote: its checkpoints, stores, collection, BM25 index, split and queries).

    .venv/bin/python bench/time_budget.py                                   # rankers of bench/results/effectiveness.json
    .venv/bin/python bench/time_budget.py --depth 1000 --rankers bert mores-2ib-s2 tk-2l
    .venv/bin/python bench/time_budget.py --quick --effectiveness /tmp/eff/effectiveness.json --out /tmp/tb.json
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import logging
import math
import shlex
import statistics
import sys
import time
from pathlib import Path

from benchkit import (
    SAMPLE,
    Bm25Hits,
    clean,
    eval_topics,
    machine,
    stage,
    write_json,
)

REPO = Path(__file__).resolve().parents[1]
METRICS = ("nDCG@10", "MRR@10")
log = logging.getLogger("bench.time_budget")


def parse_pairs(items: list[str], what: str) -> dict[str, Path]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"{what} {item!r}: expected NAME=DIR")
        out[name] = Path(path)
    return out


def default_sizes(depth: int) -> list[int]:
    steps = [1, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000]
    return sorted({n for n in steps if n < depth} | {depth})


def log_budgets(lo: float, hi: float) -> list[float]:
    """1-2-5 steps from ``lo`` to the first value >= ``hi``."""
    out, decade = [], 10.0 ** math.floor(math.log10(lo))
    while True:
        for m in (1, 2, 5):
            b = m * decade
            if b >= lo - 1e-9:
                out.append(b)
                if b >= hi:
                    return out
        decade *= 10


# ---- cost model -------------------------------------------------------------------------------------------
def time_ranker(
    ranker, reader, queries: list[str], cands: list[list[str]], sizes, repeats, batch, scorer=None
) -> dict:
    """Median ms per query at each n (query encoding + fetch + score of the first n candidates, plus, with a
    ``scorer``, the dense query embedding, the dense field's fetch and the priors); line fit."""
    import numpy as np

    from aheadrank.rerank import apply_priors, score_stored

    def one(query: str, ids: list[str]) -> float:
        t0 = time.perf_counter()
        qs = ranker.encode_query(query)
        qvec = scorer.query_vector(query) if scorer is not None and scorer.stored_dense_on() else None
        scored, _ = score_stored(ranker, reader, qs, ids, {"fetch": 0.0, "score": 0.0}, batch)
        if scorer is not None:
            dense = scorer.stored_dense(qvec, ids) if qvec is not None else None
            window = scorer.stored_window(qvec, ids, dense) if dense is not None else None
            apply_priors(scorer, scored, {d: 0.0 for d in ids}, dense, window=window)
        return (time.perf_counter() - t0) * 1e3

    for query, ids in zip(queries, cands, strict=True):  # warm-up: page cache, kernels, allocator
        one(query, ids[: max(sizes)])
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(repeats):  # interleaved, so every n sees the same machine load
        for n in sizes:
            for query, ids in zip(queries, cands, strict=True):
                samples[n].append(one(query, ids[:n]))
    medians = [statistics.median(samples[n]) for n in sizes]
    xs, ys = np.array(sizes, dtype=float), np.array(medians)
    slope, intercept = np.polyfit(xs, ys, 1) if len(sizes) > 1 else (ys[0] / xs[0], 0.0)
    if intercept < 0:  # a per-query overhead cannot be negative: fit through the origin instead
        slope, intercept = float((xs * ys).sum() / (xs * xs).sum()), 0.0
    slope, intercept = max(float(slope), 1e-6), float(intercept)
    pred = intercept + slope * xs
    ss_tot = float(((ys - ys.mean()) ** 2).sum())
    r2 = 1.0 - float(((ys - pred) ** 2).sum()) / ss_tot if ss_tot > 0 else math.nan
    return {
        "sizes": list(sizes),
        "median_ms": medians,
        "min_ms": [min(samples[n]) for n in sizes],
        "samples_per_size": len(samples[sizes[0]]),
        "intercept_ms": intercept,
        "per_doc_ms": slope,
        "r2": r2,
    }


def affordable_depth(budget_ms: float, timing: dict, depth: int) -> int:
    k = math.floor((budget_ms - timing["intercept_ms"]) / timing["per_doc_ms"])
    return max(0, min(depth, k))


# ---- runs -------------------------------------------------------------------------------------------------
def full_scores(ranker, reader, queries: dict, candidates: dict, batch: int, progress: bool) -> dict:
    """{qid: {docid: score}} over every query's candidates, through the stored representations."""
    from tqdm.auto import tqdm

    from aheadrank.rerank import score_stored

    out = {}
    for qid in tqdm(sorted(queries), desc="score", unit="q", disable=not progress):
        qs = ranker.encode_query(queries[qid])
        scored, _ = score_stored(ranker, reader, qs, candidates[qid], {"fetch": 0.0, "score": 0.0}, batch)
        out[qid] = dict(scored)
    return out


def budget_run(candidates: dict, scores: dict, k: int) -> dict:
    """The first k candidates re-ordered by the ranker, the rest in BM25 order (unknown docids stay in
    place after the re-ranked head); rank-derived scores, so evaluation sees exactly this order."""
    from aheadrank.evaluation import by_score

    run = {}
    for qid, docids in candidates.items():
        mine = scores.get(qid, {})
        head = docids[:k]
        order = [d for d, _ in by_score([(d, mine[d]) for d in head if d in mine])]
        order += [d for d in head if d not in mine] + docids[k:]
        run[qid] = {d: float(len(order) - i) for i, d in enumerate(order)}
    return run


# ---- plot ---------------------------------------------------------------------------------------------------
def plot(path: Path, result: dict) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not importable: no plot written")
        return False
    fig, axes = plt.subplots(1, len(METRICS), figsize=(6 * len(METRICS), 4.5), squeeze=False)
    budgets = result["settings"]["budgets_ms"]
    for ax, metric in zip(axes[0], METRICS, strict=True):
        for i, (name, row) in enumerate(result["rankers"].items()):
            # tab20 + a line style per ten rankers: no two of up to 40 lines look alike (the default cycle has 10)
            style = {"color": plt.cm.tab20(i % 20), "ls": ("-", "--", ":", "-.")[i // 10 % 4]}
            ax.plot(budgets, [b[metric] for b in row["budgets"]], marker="o", ms=3, label=name, **style)
        ax.axhline(result["bm25"][metric], color="black", ls="--", lw=1, label="BM25")
        ax.set_xscale("log")
        ax.set_xlabel("time budget per query (ms)")
        ax.set_ylabel(metric)
        ax.grid(True, which="both", alpha=0.3)
    s = result["settings"]
    fig.suptitle(
        f"{s['collection_name']} {s['split']} ({s['queries']} queries), BM25 top-{s['depth']}: re-ranked head "
        f"within the budget, tail in BM25 order ({result['machine']['device']})",
        fontsize=10,
    )
    axes[0][-1].legend(fontsize=7, loc="best")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    budgets = result["settings"]["budgets_ms"]
    table = Table(title=f"nDCG@10 (re-ranked depth) per time budget; BM25 {result['bm25']['nDCG@10']:.4f}")
    table.add_column("ranker")
    table.add_column("a ms", justify="right")
    table.add_column("ms/doc", justify="right")
    table.add_column(f"full {result['settings']['depth']} ms", justify="right")
    for b in budgets:
        table.add_column(f"{b:g} ms", justify="right")
    for name, row in result["rankers"].items():
        t = row["timing"]
        table.add_row(
            name,
            f"{t['intercept_ms']:.1f}",
            f"{t['per_doc_ms']:.3f}",
            f"{row['full_depth_ms']:.0f}",
            *[f"{x['nDCG@10']:.3f} ({x['depth']})" for x in row["budgets"]],
        )
    Console(width=None if sys.stdout.isatty() else 240).print(table)


# ---- main -------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--effectiveness", type=Path, default=REPO / "bench" / "results" / "effectiveness.json")
    ap.add_argument("--checkpoint", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--store", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--rankers", nargs="+", default=None, help="names or globs to keep (default: all)")
    ap.add_argument("--collection", type=Path, default=None, help="BEIR directory (with --checkpoint)")
    ap.add_argument("--index", type=Path, default=None, help="its BM25 index (else built in --workdir)")
    ap.add_argument("--split", default=None, help="qrels split (default: the effectiveness run's, or test)")
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument("--depth", type=int, default=100, help="full re-ranking depth (e.g. 100 or 1000)")
    ap.add_argument("--budgets", type=float, nargs="+", default=None, help="ms (default: 10, 20, 50, ...)")
    ap.add_argument("--sizes", type=int, nargs="+", default=None, help="n at which the cost is timed")
    ap.add_argument("--timing-queries", type=int, default=None, help="queries per timed size (default 5)")
    ap.add_argument("--repeats", type=int, default=None, help="timed rounds (default 3)")
    ap.add_argument(
        "--batch", type=int, default=256, help="candidates per fetch + score call (as rerank-run)"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workdir", type=Path, default=REPO / "work" / "bench-time-budget")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "time_budget.json")
    ap.add_argument("--plot", type=Path, default=None, help="PNG (default: --out with .png)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 20 queries, 2 timing queries, 2 rounds")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    args = ap.parse_args(argv)
    args.timing_queries = args.timing_queries or (2 if args.quick else 5)
    args.repeats = args.repeats or (2 if args.quick else 3)
    if args.quick and args.max_queries is None:
        args.max_queries = 20
    args.plot = args.plot or args.out.with_suffix(".png")
    return args


def resolve_rankers(args) -> tuple[dict, dict]:
    """({name: {checkpoint, store, run_file?}}, settings taken over from the effectiveness JSON)."""
    given = parse_pairs(args.checkpoint, "--checkpoint")
    stores = parse_pairs(args.store, "--store")
    if set(given) != set(stores):
        raise SystemExit(
            f"--checkpoint and --store must name the same rankers: {sorted(given)} vs {sorted(stores)}"
        )
    inherited: dict = {}
    rankers = {n: {"checkpoint": str(given[n]), "store": str(stores[n])} for n in given}
    if not given:
        if not args.effectiveness.is_file():
            raise SystemExit(
                f"{args.effectiveness} not found: run bench/effectiveness.py first, or pass --effectiveness, "
                "or --checkpoint NAME=DIR --store NAME=DIR pairs"
            )
        eff = json.loads(args.effectiveness.read_text())
        inherited = eff["settings"]
        for name, row in eff["rankers"].items():
            rankers[name] = {
                "checkpoint": row["checkpoint"],
                "store": row["store"]["path"],
                "run_file": row["run_file"],
                "run_depth": inherited["depth"],
                "pure": row.get("pure", True),
            }
    if args.rankers:
        keep = [n for n in rankers if any(fnmatch.fnmatchcase(n, p) for p in args.rankers)]
        if not keep:
            raise SystemExit(f"--rankers {args.rankers} match none of {', '.join(rankers)}")
        rankers = {n: rankers[n] for n in keep}
    return rankers, inherited


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    args = parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    rankers, inherited = resolve_rankers(args)

    from aheadrank.rankers import load_ranker
    from aheadrank.store import StoreReader

    from aheadrank.evaluation import evaluate, read_run
    from aheadrank.runs import bm25_candidates

    collection = (args.collection or Path(inherited.get("collection") or SAMPLE)).resolve()
    split = args.split or inherited.get("split", "test")
    max_queries = args.max_queries if args.max_queries is not None else inherited.get("max_queries")
    queries, qrels = eval_topics(collection, split, max_queries)
    if args.index is not None:
        hits = bm25_candidates(args.index, queries, args.depth)
    else:  # the hits bench/effectiveness.py cached for the same queries, when they come from its JSON
        work = (
            Path(inherited["workdir"]) if inherited.get("workdir") and not args.collection else args.workdir
        )
        hits = Bm25Hits(collection, work, args.progress).hits(queries, args.depth)
    candidates = {q: [d for d, _ in h] for q, h in hits.items()}
    bm25 = evaluate({q: {d: float(s) for d, s in h} for q, h in hits.items()}, qrels, METRICS)
    stage(
        f"bm25: {len(queries)} {split} queries of {collection.name}, top-{args.depth}: nDCG@10 {bm25['nDCG@10']:.4f}"
    )
    timing_qids = [q for q in sorted(queries) if len(candidates[q]) >= args.depth][: args.timing_queries]
    if not timing_qids:
        raise SystemExit(f"no query has {args.depth} BM25 candidates to time")
    sizes = sorted({min(n, args.depth) for n in args.sizes}) if args.sizes else default_sizes(args.depth)

    rows = {}
    for name, spec in rankers.items():
        reader = StoreReader(spec["store"])
        ranker = load_ranker(spec["checkpoint"], device=args.device, strategy=reader.spec.strategy)
        reader.check_fingerprint(ranker.fingerprint)
        stage(f"time {name}: n in {sizes}, {len(timing_qids)} queries × {args.repeats} rounds")
        scorer = None
        if not spec.get("pure", True):
            from aheadrank.rerank import PriorScorer

            scorer = PriorScorer(ranker, spec["store"], args.device)
        timing = time_ranker(
            ranker,
            reader,
            [queries[q] for q in timing_qids],
            [candidates[q] for q in timing_qids],
            sizes,
            args.repeats,
            args.batch,
            scorer,
        )
        if scorer is not None:
            scorer.close()
        full_ms = timing["intercept_ms"] + timing["per_doc_ms"] * args.depth
        stage(
            f"time {name}: {timing['intercept_ms']:.1f} ms + {timing['per_doc_ms']:.3f} ms/doc "
            f"(R² {timing['r2']:.3f}); full depth {full_ms:.0f} ms"
        )
        scores = None
        if (
            spec.get("run_file")
            and spec.get("run_depth", 0) >= args.depth
            and Path(spec["run_file"]).is_file()
        ):
            scores = read_run(spec["run_file"])
            if set(queries) <= set(scores):
                stage(f"scores {name}: from {spec['run_file']}")
                source = spec["run_file"]
            else:
                scores = None
        if scores is None:
            stage(f"scores {name}: {len(queries)} queries × {args.depth} candidates through {spec['store']}")
            scores = full_scores(ranker, reader, queries, candidates, args.batch, args.progress)
            source = "scored"
        rows[name] = {
            **{k: v for k, v in spec.items() if k != "run_depth"},
            "strategy": reader.spec.strategy,
            "fingerprint": ranker.fingerprint,
            "timing": timing,
            "full_depth_ms": full_ms,
            "scores_from": source,
            "_scores": scores,
        }
        reader.close()
        del ranker

    budgets = args.budgets or log_budgets(10.0, max(r["full_depth_ms"] for r in rows.values()))
    for name, row in rows.items():
        scores = row.pop("_scores")
        by_depth: dict[int, dict] = {}
        row["budgets"] = []
        for b in budgets:
            k = affordable_depth(b, row["timing"], args.depth)
            if k not in by_depth:
                by_depth[k] = evaluate(budget_run(candidates, scores, k), qrels, METRICS)
            predicted = row["timing"]["intercept_ms"] + row["timing"]["per_doc_ms"] * k
            row["budgets"].append({"budget_ms": b, "depth": k, "predicted_ms": predicted, **by_depth[k]})
        row["full_depth"] = evaluate(budget_run(candidates, scores, args.depth), qrels, METRICS)
        stage(
            f"{name}: "
            + ", ".join(
                f"{x['budget_ms']:g} ms -> depth {x['depth']} nDCG@10 {x['nDCG@10']:.3f}"
                for x in row["budgets"]
            )
        )

    result = {
        "command": shlex.join(
            [".venv/bin/python", "bench/time_budget.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "settings": {
            "collection": str(collection),
            "collection_name": collection.name,
            "bm25_index": str(args.index) if args.index else None,
            "split": split,
            "queries": len(queries),
            "max_queries": max_queries,
            "depth": args.depth,
            "budgets_ms": budgets,
            "sizes": sizes,
            "timing_queries": timing_qids,
            "repeats": args.repeats,
            "batch": args.batch,
            "cost_model": "t(n) = intercept + per_doc·n, least squares over the median ms per query at each n "
            "(encode_query + fetch + score_batch of the first n BM25 candidates); depth(B) = "
            "clamp(floor((B - intercept) / per_doc), 0, depth); head re-ranked, tail in BM25 order",
            "effectiveness": str(args.effectiveness) if not args.checkpoint else None,
        },
        "machine": machine(args.device),
        "bm25": bm25,
        "rankers": rows,
        "wall_s": time.perf_counter() - t_start,
    }
    write_json(args.out, result)
    result = clean(result)
    plotted = plot(args.plot, result)
    print_table(result)
    stage(f"wrote {args.out}" + (f" and {args.plot}" if plotted else " (no plot: matplotlib missing)"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
