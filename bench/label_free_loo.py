"""The label-free served score's neural share, per ranker, chosen leave-one-collection-out.

A label-free build serves Σ w·zscore(feature) over the neural score, BM25 and the bi-encoder with fixed weights
(``aheadrank.build.LABEL_FREE_WEIGHTS``: 1/3 each). The issue allows "defaults that measure well across
collections", chosen on other collections' judgments and applied unchanged; `shares/` showed that a build's own
pseudo-queries cannot choose the share. This bench chooses it the way a default is chosen for a collection nobody
has judged: on the *other* collections' judgments.

The rule, fixed in the commit that added this file, before it was run on the current builds (`shares/` had shown
the test-split scores of earlier PreTTR and TK builds at these shares, so the grid and criterion were not chosen
blind; they are `shares/`' own grid and the issue's own bar):

- grid: neural share ``s`` in {0, 1/6, 1/3} (`shares/`' grid; 1/3 is today's default), BM25 and the bi-encoder
  (1 - s) / 2 each;
- for a ranker and a target collection T: the ``s`` with the largest mean, over the collections other than T, of
  served nDCG@10 at ``s`` minus the better of RRF (k = 60) and the equal-weight fusion on that collection's test
  split; ties go to the larger share. T's served score is the one at that ``s``, compared (paired t-test) with T's
  better fusion; T's judgments choose nothing;
- the ranker's label-free default (what a user's collection gets): the same rule over every collection given. It
  replaces 1/3 in ``aheadrank.build`` for that ranker's kind only where it differs from 1/3.

Nothing is built or encoded: every feature is read from a finished bench's committed runs
(``DIR/<collection>/runs/{bm25,bi-encoder,VARIANT}.trec.zst`` over BM25's top 100; z-scores are invariant to the
per-query affine maps the runs were written with). The recomputed ``fusion-equal``, ``rrf`` and ``VARIANT+priors``
(1/3 each) must equal the committed runs' nDCG@10, else the folder is refused.

    .venv/bin/python bench/label_free_loo.py \\
        --neural bench/results/label-free/defaults-steps0:mores-2ib-s2 \\
                 bench/results/label-free/prettr-pool8k:prettr-l5-e128 \\
                 bench/results/label-free/tk-base:tk-6l-base \\
        --out bench/results/label-free/loo

Writes ``--out``: ``label_free_loo.{json,md}`` and ``<collection>/runs/VARIANT+priors.trec.zst`` (the served run at
the share chosen without that collection).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from fractions import Fraction
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_loo")
SHARES = (Fraction(0), Fraction(1, 6), Fraction(1, 3))
CHECK_TOLERANCE = 1e-6  # nDCG@10 of a recomputed run against its committed twin


def parse_args(argv=None) -> argparse.Namespace:
    from label_free_passages import neural_list

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["scifact", "cranfield", "vaswani"])
    ap.add_argument("--neural", nargs="+", required=True, metavar="DIR:VARIANT")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "label-free" / "loo")
    args = ap.parse_args(argv)
    if len(args.collections) < 2:
        ap.error("--collections: at least two (each is chosen on the others)")
    args.neural = neural_list(ap, args.neural)
    return args


def weights(share: Fraction) -> dict[str, float]:
    """The served weights at a neural share, as a label-free build serves them (``aheadrank.build.share_weights``)."""
    from aheadrank.build import share_weights

    return share_weights(share)["neural+bm25+dense"]


def choose(margins: dict[str, dict[Fraction, float]], among: list[str]) -> Fraction:
    """The share with the largest mean margin over ``among`` (collection -> share -> served minus the better
    fusion); ties go to the larger share."""
    return max(SHARES, key=lambda s: (float(np.mean([margins[c][s] for c in among])), s))


def read_features(folder: Path, collection: str, variant: str, qrels: dict) -> list:
    """(qid, QueryFeatures) over the judged test queries: BM25's candidates, their BM25, bi-encoder and neural
    scores from the committed runs. A run over other candidates is refused (never a guess)."""
    from label_free_passages import neural_scores

    from aheadrank.evaluation import read_run
    from aheadrank.priors import QueryFeatures

    runs_dir = folder / collection / "runs"
    paths = {k: runs_dir / f"{k}.trec.zst" for k in ("bm25", "bi-encoder", variant)}
    for p in paths.values():
        if not p.exists():
            raise SystemExit(f"{folder}:{variant}: no {p}")
    bm25 = read_run(paths["bm25"])
    cands = {q: sorted(bm25[q].items(), key=lambda x: -x[1]) for q in bm25}
    qids = sorted(q for q in cands if any(r > 0 for r in qrels.get(q, {}).values()))
    dense = neural_scores(read_run(paths["bi-encoder"]), cands, qids, paths["bi-encoder"])
    neural = neural_scores(read_run(paths[variant]), cands, qids, paths[variant])
    out = []
    for q in qids:
        ds = [d for d, _ in cands[q]]
        f = {"bm25": np.array([s for _, s in cands[q]]), "dense": dense[q], "neural": neural[q]}
        out.append((q, QueryFeatures(ds, f, qrels.get(q, {}))))
    return out


def check_against_committed(folder: Path, collection: str, variant: str, runs: dict, qrels: dict) -> dict:
    """nDCG@10 of each recomputed run beside its committed twin; a SystemExit where they differ."""
    from aheadrank.evaluation import evaluate, read_run

    got = {}
    for name, run in runs.items():
        path = folder / collection / "runs" / f"{name}.trec.zst"
        if not path.exists():
            continue
        ours = evaluate(run, qrels, ("nDCG@10",))["nDCG@10"]
        theirs = evaluate(read_run(path), qrels, ("nDCG@10",))["nDCG@10"]
        if abs(ours - theirs) > CHECK_TOLERANCE:
            raise SystemExit(
                f"{path}: committed nDCG@10 {theirs:.6f}, recomputed from {folder}'s runs {ours:.6f}: the folder's "
                f"runs are not one build's features (refusing to choose a share from them)"
            )
        got[name] = round(theirs, 6)
    return got


def bench_ranker(args, folder: Path, variant: str) -> dict:
    from benchkit import eval_topics
    from label_free import comparison, label_free_baselines, runs_from, write_zst_run

    from aheadrank.evaluation import compare, evaluate

    per = {}
    for c in args.collections:
        _, qrels = eval_topics(args.data / c, "test", None)
        features = read_features(folder, c, variant, qrels)
        base = label_free_baselines(features)
        served = {s: runs_from(features, weights(s)) for s in SHARES}
        checks = check_against_committed(
            folder,
            c,
            variant,
            {
                "fusion-equal": base["fusion-equal"],
                "rrf": base["rrf"],
                f"{variant}+priors": served[SHARES[-1]],
            },
            qrels,
        )
        ndcg = {k: evaluate(base[k], qrels, ("nDCG@10",))["nDCG@10"] for k in ("bm25", "rrf", "fusion-equal")}
        best = max(("rrf", "fusion-equal"), key=lambda k: ndcg[k])
        at = {s: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for s, r in served.items()}
        per[c] = {
            "qrels": qrels,
            "best": best,
            "best_run": base[best],
            "served": served,
            "row": {
                "test_queries": len(features),
                "baselines": {k: round(v, 4) for k, v in ndcg.items()},
                "better_fusion": best,
                "served_by_share": {str(s): round(v, 4) for s, v in at.items()},
                "margin_by_share": {str(s): round(v - ndcg[best], 4) for s, v in at.items()},
                "checked_against_committed": checks,
            },
            "margins": {s: at[s] - ndcg[best] for s in SHARES},
        }
    margins = {c: p["margins"] for c, p in per.items()}
    out = {"from": f"{folder}:{variant}", "collections": {}}
    for c, p in per.items():
        others = [o for o in args.collections if o != c]
        s = choose(margins, others)
        run = p["served"][s]
        row = p["row"] | {
            "chosen_on": others,
            "share": str(s),
            "served": p["row"]["served_by_share"][str(s)],
            "vs_better_fusion": comparison(compare, p["best_run"], run, p["qrels"]),
            "vs_third": comparison(compare, p["served"][SHARES[-1]], run, p["qrels"]),
        }
        out["collections"][c] = row
        runs_dir = args.out / c / "runs"
        runs_dir.mkdir(parents=True, exist_ok=True)
        write_zst_run(runs_dir / f"{variant}+priors.trec.zst", run, f"{variant}_priors")
    out["default_share"] = str(choose(margins, list(args.collections)))
    return out


def table(results: dict) -> str:
    from label_free import diff_p

    shares = [str(s) for s in SHARES]
    lines = [
        "| ranker | collection | better fusion | "
        + " | ".join(f"served, share {s}" for s in shares)
        + " | share chosen on | served (chosen) vs better fusion | vs 1/3 |",
        "|---|---|---|" + "---:|" * len(shares) + "---|---|---|",
    ]
    for variant, r in results.items():
        for c, x in r["collections"].items():
            best = f"{x['better_fusion']} {x['baselines'][x['better_fusion']]:.4f}"
            cells = " | ".join(f"{x['served_by_share'][s]:.4f}" for s in shares)
            lines.append(
                f"| {variant} | {c} | {best} | {cells} | {x['share']} on {' + '.join(x['chosen_on'])} | "
                f"{x['served']:.4f}, {diff_p(x['vs_better_fusion'])} | {diff_p(x['vs_third'])} |"
            )
    lines.append("")
    lines.append(
        "Default share over every collection (the label-free build's, per ranker): "
        + ", ".join(f"{v} {r['default_share']}" for v, r in results.items())
    )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from label_free import write_outputs

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    t0 = time.perf_counter()
    results = {v: bench_ranker(args, folder, v) for folder, v in args.neural}
    extra = {"shares": [str(s) for s in SHARES], "results": results}
    write_outputs(args.out, "label_free_loo", table(results), argv, extra, t0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
