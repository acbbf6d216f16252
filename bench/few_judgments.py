"""How many judged queries it takes: a label-free build's served weights against weights fitted on N judged queries.

A user who brings a corpus and no judgments gets a label-free build (``aheadrank build --labels none``), served with
default weights (``aheadrank.build.label_free_weights``). A user who then judges a few queries can fit the served
weights on them with ``aheadrank fit-priors --split S --all-queries`` on the same build, and a user without us would
tune the BM25 + bi-encoder fusion on the same queries. This bench measures, in one run, what N judged queries buy:

- ``label-free``: the build's served score, its own weights (no judgment read);
- ``fitted on N``: for each N in ``--sizes`` and each of ``--draws`` random draws of N of the collection's judged
  train queries (seeded), the weights of every feature the build serves fitted on them by the grid fit-priors runs
  (``aheadrank.priors.fit_weights``: the widest feature set's weights, what a request with every feature gets);
  ``all``: every train query, one draw;
- ``fusion fitted on N``: on the same draws, BM25 and the bi-encoder alone, their weights fitted the same way (what
  a user would tune without us);
- ``guarded``: what ``aheadrank fit-priors`` does on a label-free build: the weights fitted on the draw only where
  5-fold cross-validation on its queries shows them better than the label-free weights (mean gain and paired t-test
  p < 0.05, ``aheadrank.priors.cross_validated``), else the label-free weights;

each evaluated on the test split (nDCG@10): the mean, the lowest and the highest over the draws, how many draws
serve above the label-free weights, and how many above the fusion fitted on the same draw. ``all`` gets paired
t-tests against the label-free weights and against the fitted fusion. The ranker is not retrained: only the
weights see the judgments (training on judged queries is the judged recipe, ``bench/results/cpu-core-360/``).

The builds are ``bench/label_free.py``'s (found by its folder name under ``--workdir``; run it first with the same
settings). The candidates' features, test and train, are cached under ``--workdir``.

    .venv/bin/python bench/label_free.py --collections scifact cranfield vaswani --rankers mores-2ib-s2 \\
        --workdir work/lf --out work/out-lf
    .venv/bin/python bench/few_judgments.py --collections scifact cranfield vaswani --workdir work/lf

Writes ``--out`` (``bench/results/few-judgments``): ``few_judgments.{json,md}``.
"""

from __future__ import annotations

import argparse
import logging
import pickle
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

log = logging.getLogger("bench.few_judgments")

SIZES = (5, 10, 20, 50, 100, 200)
DRAWS = 10
FUSION = ("bm25", "dense")


def parse_args(argv=None) -> argparse.Namespace:
    import label_free as lf

    from aheadrank.passages import LABEL_FREE_AGGREGATION

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["scifact", "cranfield", "vaswani"])
    ap.add_argument("--ranker", default="mores-2ib-s2")
    ap.add_argument("--sizes", nargs="+", type=int, default=list(SIZES), help="judged queries per draw")
    ap.add_argument("--draws", type=int, default=DRAWS, help="random draws per size")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--aggregation", default=LABEL_FREE_AGGREGATION, help="a long document's score from its passages"
    )
    lf.add_build_name_options(ap)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "few-judgments")
    args = ap.parse_args(argv)
    if args.draws < 1 or any(n < 1 for n in args.sizes):
        ap.error("--sizes and --draws must be at least 1")
    return lf.recipe_settings(args)


def cached_features(args, build: Path, collection: Path, split: str) -> tuple[list, dict]:
    """(qid, QueryFeatures) of the split's judged queries over their BM25 candidates, every feature the build serves
    (``bench/label_free.py``'s ``neural_features``), and the split's qrels; cached under the build's folder."""
    import label_free as lf
    from benchkit import Bm25Hits, eval_topics, read_json

    from aheadrank.build import paths

    queries, qrels = eval_topics(collection, split, None)
    stamp = read_json(build / "build.json")
    key = f"few-judgments-{split}-{args.aggregation}-{lf.DEPTH}.pkl"
    path = build / key
    if path.is_file():
        with path.open("rb") as f:
            saved = pickle.load(f)
        if saved["build"] == stamp and saved["queries"] == queries:
            return saved["features"], qrels
    cands = Bm25Hits(collection, args.workdir, False).hits(queries, lf.DEPTH)
    p = paths(build)
    t0 = time.perf_counter()
    feats = lf.neural_features(
        p["checkpoint"], p["store"], queries, cands, qrels, args.device, True, args.aggregation
    )
    log.info(
        "%s %s: %d queries scored in %.0f s", collection.name, split, len(feats), time.perf_counter() - t0
    )
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        pickle.dump({"build": stamp, "queries": queries, "features": feats}, f)
    tmp.replace(path)
    return feats, qrels


def test_ndcg(features: list, weights: dict, qrels: dict) -> tuple[float, dict]:
    """The test split's nDCG@10 of ``Σ w·z`` and its run."""
    import label_free as lf

    from aheadrank.evaluation import evaluate

    run = lf.runs_from(features, weights)
    return evaluate(run, qrels, ("nDCG@10",))["nDCG@10"], run


def draws_of(qids: list[str], size: int, draws: int, seed: int) -> list[list[str]]:
    """``draws`` random samples of ``size`` of ``qids`` without replacement (one, all of them, where ``size`` is
    at least their number); the same for the same arguments."""
    if size >= len(qids):
        return [sorted(qids)]
    return [
        sorted(np.random.default_rng([seed, size, d]).choice(sorted(qids), size=size, replace=False).tolist())
        for d in range(draws)
    ]


def measure(
    train: list, test: list, qrels: dict, served: dict, sizes, draws: int, seed: int
) -> tuple[float, dict]:
    """The test split's nDCG@10 with the ``served`` weights, and per size (``"all"``: every train query, one draw)
    the weights of ``served``'s features and of the fusion fitted on each draw of train queries, with the test
    split's nDCG@10 of each (``train``, ``test``: (qid, QueryFeatures); ``qrels``: the test split's)."""
    import label_free as lf

    from aheadrank.evaluation import compare
    from aheadrank.priors import cross_validated, fit_weights

    by_qid = dict(train)
    default, default_run = test_ndcg(test, served, qrels)
    out = {}
    for size in sorted({n for n in sizes if n < len(train)}) + ["all"]:
        n = len(train) if size == "all" else size
        t0 = time.perf_counter()
        rows = []
        for sample in draws_of(sorted(by_qid), n, draws, seed):
            qs = [by_qid[q] for q in sample]
            w, _ = fit_weights(qs, list(served))
            wf, _ = fit_weights(qs, FUSION)
            cv = cross_validated(qs, list(served), served)
            ndcg, run = test_ndcg(test, w, qrels)
            fusion, fusion_run = test_ndcg(test, wf, qrels)
            guarded = ndcg if cv["fitted"] else default
            rows.append(
                {
                    "weights": w,
                    "ndcg10": ndcg,
                    "fusion_weights": wf,
                    "fusion_ndcg10": fusion,
                    "guard": cv,
                    "guarded_ndcg10": guarded,
                }
            )
        got = np.array([r["ndcg10"] for r in rows])
        fus = np.array([r["fusion_ndcg10"] for r in rows])
        grd = np.array([r["guarded_ndcg10"] for r in rows])
        entry = {
            "n": n,
            "draws": rows,
            "mean": float(got.mean()),
            "min": float(got.min()),
            "max": float(got.max()),
            "fusion_mean": float(fus.mean()),
            "fusion_min": float(fus.min()),
            "fusion_max": float(fus.max()),
            "above_label_free": int((got > default).sum()),
            "above_fusion": int((got > fus).sum()),
            "guarded_mean": float(grd.mean()),
            "guarded_min": float(grd.min()),
            "guarded_max": float(grd.max()),
            "guard_took_fit": int(sum(r["guard"]["fitted"] for r in rows)),
            "seconds": round(time.perf_counter() - t0, 1),
        }
        if size == "all":  # one draw: its paired tests
            entry["vs_label_free"] = lf.comparison(compare, default_run, run, qrels)
            entry["vs_fusion"] = lf.comparison(compare, fusion_run, run, qrels)
            entry["label_free_vs_fusion"] = lf.comparison(compare, fusion_run, default_run, qrels)
        out[str(size)] = entry
        log.info(
            "N=%s: fitted %.4f, fusion fitted %.4f (%.0f s)", size, got.mean(), fus.mean(), entry["seconds"]
        )
    return default, out


def bench_collection(args, name: str) -> dict:
    import label_free as lf

    from aheadrank.build import paths
    from aheadrank.priors import read_priors

    collection = args.data / name
    build, _, _, _, _, _, _, scores, best = lf.probe_setup(args, name)
    served = read_priors(paths(build)["checkpoint"]).widest()
    test, test_qrels = cached_features(args, build, collection, "test")
    train, _ = cached_features(args, build, collection, "train")
    default, sizes = measure(train, test, test_qrels, served, args.sizes, args.draws, args.seed)
    return {
        "collection": name,
        "build": str(build),
        "test_queries": len(test),
        "train_queries": len(train),
        "baselines": scores,
        "best_baseline": best,
        "label_free": {"weights": served, "ndcg10": default},
        "sizes": sizes,
    }


def table(results: list[dict]) -> str:
    import label_free as lf

    lines = []
    for r in results:
        b, best, lf_row = r["baselines"], r["best_baseline"], r["label_free"]
        w = ", ".join(f"{k} {v:.2f}" for k, v in lf_row["weights"].items())
        lines.append(
            f"\n### {r['collection']} ({r['test_queries']} test queries; BM25 {b['bm25']:.4f}, bi-encoder "
            f"{b['bi-encoder']:.4f}, {best} {b[best]:.4f}; label-free served {lf_row['ndcg10']:.4f}: {w})\n"
        )
        lines.append(
            "| judged queries | draws | served, weights fitted on them: mean (lowest–highest) | draws above the "
            "label-free weights | fusion fitted on them: mean (lowest–highest) | draws above that fusion | "
            "guarded (fit-priors): mean (lowest–highest) | draws where the guard took the fit |"
        )
        lines.append("|---:|---:|---|---:|---|---:|---|---:|")
        for size, e in r["sizes"].items():
            k = len(e["draws"])
            label = f"all ({e['n']})" if size == "all" else str(e["n"])
            lines.append(
                f"| {label} | {k} | {e['mean']:.4f} ({e['min']:.4f}–{e['max']:.4f}) | {e['above_label_free']}/{k} | "
                f"{e['fusion_mean']:.4f} ({e['fusion_min']:.4f}–{e['fusion_max']:.4f}) | {e['above_fusion']}/{k} | "
                f"{e['guarded_mean']:.4f} ({e['guarded_min']:.4f}–{e['guarded_max']:.4f}) | {e['guard_took_fit']}/{k} |"
            )
        a = r["sizes"]["all"]
        lines.append(
            f"\nEvery train query: served {a['mean']:.4f} against the label-free weights "
            f"{lf.diff_p(a['vs_label_free'])}, against the fusion fitted on them {lf.diff_p(a['vs_fusion'])}; "
            f"weights {a['draws'][0]['weights']}. The label-free weights against that fusion: "
            f"{lf.diff_p(a['label_free_vs_fusion'])}."
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    import label_free as lf

    return lf.run_probe(argv, parse_args, bench_collection, table, "few_judgments")


if __name__ == "__main__":
    raise SystemExit(main())
