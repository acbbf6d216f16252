"""A judged build's served weights against equal weights: does the fit on the queries its trainer held out pay?

``aheadrank build --labels S`` trains the ranker on judged queries and fits the served weights (the neural score,
BM25, the bi-encoder) on the ones its trainer held out (the recipe's ``val_queries``, ``rankers/recipe.py``: 100 on SciFact).
``bench/few_judgments.py`` found that on label-free builds weights fitted on 5 to 809 judged queries never served
above equal z-score weights; this bench asks the same of a judged build, on the test split (nDCG@10):

- ``fitted``: the build's priors (fitted on the held-out queries), as it serves;
- ``equal``: the same features at equal weights (``aheadrank.build.share_weights`` at 1/3);
- ``guarded``: what the cross-validated guard of ``aheadrank fit-priors`` on a label-free build would choose from the
  held-out queries between the two (``aheadrank.priors.cross_validated``).

Each against ``fitted`` (paired t-test). Nothing is trained; the builds are given.

    .venv/bin/aheadrank build --collection ../shared/data/scifact --out work/jb-scifact --labels train
    .venv/bin/python bench/judged_weights.py --builds scifact=work/jb-scifact

Writes ``--out`` (``bench/results/judged-weights``): ``judged_weights.{json,md}``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

log = logging.getLogger("bench.judged_weights")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument(
        "--builds", nargs="+", required=True, help="COLLECTION=BUILD_DIR (a judged aheadrank build)"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "judged-weights", help="BM25 hits cache")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "judged-weights")
    args = ap.parse_args(argv)
    try:
        args.builds = dict(b.split("=", 1) for b in args.builds)
    except ValueError:
        ap.error("--builds takes COLLECTION=BUILD_DIR")
    args.collections = list(args.builds)
    return args


def bench_collection(args, name: str) -> dict:
    import label_free as lf
    from aheadrank.rankers import load_config
    from benchkit import Bm25Hits, eval_topics

    from aheadrank.build import paths, read_record
    from aheadrank.evaluation import compare, evaluate
    from aheadrank.priors import cross_validated, read_priors, recorded_aggregation

    build = Path(args.builds[name])
    record = read_record(build)
    if record is None or "priors" not in record.stages:
        raise SystemExit(f"{build} is not a finished aheadrank build")
    p = paths(build)
    priors = read_priors(p["checkpoint"])
    if priors.fitted_on.get("label_free"):
        raise SystemExit(f"{build} is a label-free build: bench/few_judgments.py measures those")
    fitted = priors.widest()
    names = list(fitted)
    equal = lf.third_share_weights(names)
    collection = args.data / name
    aggregation = recorded_aggregation(None, p["checkpoint"])
    hits = Bm25Hits(collection, args.workdir, False)
    test_q, test_qrels = eval_topics(collection, "test", None)

    def scored(queries: dict, qrels: dict) -> list:
        return lf.neural_features(
            p["checkpoint"],
            p["store"],
            queries,
            hits.hits(queries, lf.DEPTH),
            qrels,
            args.device,
            True,
            aggregation,
        )

    test = scored(test_q, test_qrels)
    split = priors.fitted_on.get("split", "train")
    held = load_config(p["checkpoint"]).extra.get("train", {}).get("val_qids") or []
    train_q, train_qrels = eval_topics(collection, split, None)
    val_q = {q: train_q[q] for q in held if q in train_q}
    val = scored(val_q, train_qrels)
    cv = cross_validated([f for _, f in val], names, equal)
    guarded = equal if not cv["fitted"] else fitted  # the guard's choice between the two
    runs = {k: lf.runs_from(test, w) for k, w in (("fitted", fitted), ("equal", equal), ("guarded", guarded))}
    out = {
        "collection": name,
        "build": str(build),
        "test_queries": len(test),
        "held_out_queries": len(val),
        "aggregation": aggregation,
        "weights": {"fitted": fitted, "equal": equal},
        "guard": cv,
        "runs": {},
    }
    for k, run in runs.items():
        out["runs"][k] = {
            "ndcg10": evaluate(run, test_qrels, ("nDCG@10",))["nDCG@10"],
            "vs_fitted": lf.comparison(compare, runs["fitted"], run, test_qrels),
        }
    log.info("%s: %s", name, {k: round(r["ndcg10"], 4) for k, r in out["runs"].items()})
    return out


def table(results: list[dict]) -> str:
    import label_free as lf

    lines = [
        "| collection | held-out queries | fitted (as built) | equal weights (vs fitted) | guarded (vs fitted) | "
        "the guard on the held-out queries |",
        "|---|---:|---:|---|---|---|",
    ]
    for r in results:
        x, g = r["runs"], r["guard"]
        p = "n/a" if g.get("p") is None else f"{g['p']:.2g}"
        said = f"fitted {g.get('fitted_ndcg10')} vs equal {g.get('kept_ndcg10')}, p {p}: " + (
            "fitted" if g["fitted"] else "equal"
        )
        lines.append(
            f"| {r['collection']} | {r['held_out_queries']} | {x['fitted']['ndcg10']:.4f} | "
            f"{x['equal']['ndcg10']:.4f} {lf.diff_p(x['equal']['vs_fitted'])} | "
            f"{x['guarded']['ndcg10']:.4f} {lf.diff_p(x['guarded']['vs_fitted'])} | {said} |"
        )
    lines.append("")
    for r in results:
        lines.append(f"- {r['collection']}: fitted {r['weights']['fitted']}; equal {r['weights']['equal']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    import label_free as lf

    return lf.run_probe(argv, parse_args, bench_collection, table, "judged_weights")


if __name__ == "__main__":
    raise SystemExit(main())
