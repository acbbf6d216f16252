"""What the label-free build's open goals can and cannot show: each goal of the label-free issue that the committed
runs measure, with the paired difference, its 95 % confidence interval, the two-sided paired t-test's p, the
difference that test detects 80 % of the time over those queries (``detects``), and how many queries the observed
difference would need to be detected that often (``queries for it``).

Nothing is built, trained or chosen: it reads committed TREC runs and the collections' qrels.

- ``test``: the README's numbers. SciFact's rankers from ``maxp-scifact/``, its baselines (BM25, the bi-encoder, RRF,
  the equal-weight fusion: the same over any build) from ``scifact/``; Cranfield and Vaswani from
  ``maxp-cranfield-vaswani/``.
- ``train``: the same defaults on the queries of the collections' ``train`` splits (``train-split-scifact/``, MORES
  only, no RRF run; ``train-split/``).
- ``pooled``: both splits' queries together. No label-free build read a judgment of either split; the defaults were
  chosen while the test splits (not the train splits) were measured.

The goals: each served ranker at or above the better of RRF and the equal-weight fusion (better by its mean over the
same queries), significantly on SciFact; SciFact's served MORES at or above 0.75 (a one-sample test of the mean);
SciFact's pure MORES at or above BM25.

    .venv/bin/python bench/label_free_goals.py --out bench/results/label-free/goals

Writes ``label_free_goals.{json,md}`` to ``--out``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

RESULTS = ROOT / "bench" / "results" / "label-free"
RANKERS = ("mores-2ib-s2", "prettr-l5-e128", "tk-6l-base")
FUSIONS = ("rrf", "fusion-equal")
SERVED_TARGET = 0.75  # SciFact's served nDCG@10 goal
METRIC = "nDCG@10"
# (collection, split) -> (the folder of its rankers' runs, the folder of its baselines' runs), under RESULTS
SOURCES = {
    ("scifact", "test"): ("maxp-scifact/scifact/runs", "scifact/runs"),
    ("cranfield", "test"): ("maxp-cranfield-vaswani/cranfield/runs",) * 2,
    ("vaswani", "test"): ("maxp-cranfield-vaswani/vaswani/runs",) * 2,
    ("scifact", "train"): ("train-split-scifact/scifact/runs",) * 2,
    ("cranfield", "train"): ("train-split/cranfield/runs",) * 2,
    ("vaswani", "train"): ("train-split/vaswani/runs",) * 2,
}


def per_query_values(collection: str, split: str, data: Path) -> dict[str, dict[str, float]]:
    """{run name: {qid: nDCG@10}} of every committed run of ``collection`` on ``split`` (keys ``split:qid``)."""
    from aheadrank.indexer.topics import read_qrels

    from aheadrank.evaluation import per_query, read_run

    qrels = read_qrels(data / collection, split)
    rankers, baselines = SOURCES[(collection, split)]
    names = [*("bm25", "bi-encoder", *FUSIONS), *(f"{r}{s}" for r in RANKERS for s in ("", "+priors"))]
    out = {}
    for name in names:
        folder = baselines if name in ("bm25", "bi-encoder", *FUSIONS) else rankers
        path = RESULTS / folder / f"{name}.trec.zst"
        if path.is_file():
            values = per_query(read_run(path), qrels, (METRIC,))[METRIC]
            out[name] = {f"{split}:{q}": v for q, v in values.items()}
    return out


def pooled(splits: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    """The runs every split has, their queries together."""
    names = set.intersection(*(set(s) for s in splits))
    return {n: {q: v for s in splits for q, v in s[n].items()} for n in sorted(names)}


def row(goal: str, candidate: str, baseline: str, b: dict[str, float], a: dict[str, float] | float) -> dict:
    """One goal: ``b`` against run ``a`` (paired) or against the number ``a`` (the one-sample t-test of B - a)."""
    from aheadrank.evaluation import paired_test, queries_needed

    c = paired_test(dict.fromkeys(b, a) if isinstance(a, float) else a, b, metric=METRIC)
    side = "met" if c.mean_diff >= 0 else "not met"
    verdict = f"{side}, {'significantly' if c.p < 0.05 else 'not significantly'}"
    return {
        "goal": goal,
        "candidate": candidate,
        "baseline": baseline,
        "queries": c.n,
        "candidate_mean": c.mean_b,
        "baseline_mean": c.mean_a,
        "diff": c.mean_diff,
        "ci95": [c.ci_low, c.ci_high],
        "p": c.p,
        "detects": c.detectable,
        "queries_for_diff": queries_needed(c.mean_diff, c.sd),
        "verdict": verdict,
    }


def goals(values: dict[str, dict[str, float]], collection: str) -> list[dict]:
    """Every goal ``values`` (one collection, one split or pooled) can measure."""
    out = []
    fusions = [f for f in FUSIONS if f in values]
    best = max(fusions, key=lambda f: sum(values[f].values()))
    for r in RANKERS:
        served = f"{r}+priors"
        if served in values:
            goal = "served ≥ better fusion" + (", significantly" if collection == "scifact" else "")
            out.append(row(goal, served, best, values[served], values[best]))
    if collection == "scifact":
        if "mores-2ib-s2+priors" in values:
            out.append(
                row(
                    f"served ≥ {SERVED_TARGET}",
                    "mores-2ib-s2+priors",
                    str(SERVED_TARGET),
                    values["mores-2ib-s2+priors"],
                    SERVED_TARGET,
                )
            )
        if "mores-2ib-s2" in values:
            out.append(
                row("pure MORES ≥ BM25", "mores-2ib-s2", "bm25", values["mores-2ib-s2"], values["bm25"])
            )
    return out


def fmt(value, digits: int = 4, sign: bool = False) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def table(rows: list[dict]) -> str:
    lines = [
        "| collection | queries of | goal | candidate | baseline | n | candidate | baseline | diff | 95 % CI | p "
        "| detects | queries for diff | verdict |",
        "|---|---|---|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        low, high = r["ci95"]
        lines.append(
            f"| {r['collection']} | {r['split']} | {r['goal']} | {r['candidate']} | {r['baseline']} | {r['queries']} "
            f"| {fmt(r['candidate_mean'])} | {fmt(r['baseline_mean'])} | {fmt(r['diff'], sign=True)} "
            f"| [{fmt(low, sign=True)}, {fmt(high, sign=True)}] | {r['p']:.2g} | {fmt(r['detects'])} "
            f"| {r['queries_for_diff'] if r['queries_for_diff'] is not None else '> 10^7'} | {r['verdict']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    from benchkit import machine, write_record

    from aheadrank.evaluation import POWER

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data", help="the collections")
    parser.add_argument("--collections", nargs="+", default=["scifact", "cranfield", "vaswani"])
    parser.add_argument("--out", type=Path, default=ROOT / "work" / "label-free-goals")
    args = parser.parse_args(argv)
    t0 = time.perf_counter()
    for c in args.collections:
        if not (args.data / c / "qrels").is_dir():
            raise SystemExit(
                f"no qrels for {c} under {args.data}: give --data, the folder of the collections"
            )
    rows = []
    for c in args.collections:
        splits = {s: per_query_values(c, s, args.data) for s in ("test", "train")}
        for name, values in (*splits.items(), ("pooled", pooled(list(splits.values())))):
            rows += [{"collection": c, "split": name, **r} for r in goals(values, c)]
    md = "\n".join(
        [
            "# The label-free goals: what the committed runs can show (bench/label_free_goals.py)",
            "",
            "nDCG@10. diff: candidate − baseline; 95 % CI of it (paired t); p: two-sided paired t-test; detects: the"
            f" |diff| that test finds {POWER:.0%} of the time over these queries, given their spread; queries for diff: how"
            " many it would need for the observed diff to be found that often.",
            "",
            table(rows),
            "",
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "label_free_goals.md").write_text(md)
    print(md)
    return write_record(
        args.out / "label_free_goals.json", "label_free_goals", argv, machine("cpu"), t0, rows=rows
    )


if __name__ == "__main__":
    main()
