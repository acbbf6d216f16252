"""Can a label-free build choose its neural share? The served score of a label-free build is neural, BM25 and
bi-encoder z-scores in equal parts (``aheadrank.build.LABEL_FREE_WEIGHTS``); a build has nothing but its held-out
pseudo-queries to choose another share on. For each finished build of ``bench/label_free.py`` (its ``--workdir``
and folder names; nothing is built or trained here) this measures the share ``w`` of the neural score (BM25 and
bi-encoder ``(1 - w) / 2`` each) three ways:

- ``pseudo-source``: mean nDCG@10 on the build's held-out pseudo-queries, the source document relevant;
- ``pseudo-near``: the same with the calibration's labels (``aheadrank.build.near_source_labels``: a candidate
  whose bi-encoder cosine with the source is >= ``NEAR_SOURCE`` counts as relevant too);
- ``test``: nDCG@10 on the collection's test split (its judgments), as served (``--aggregation``).

and applies one rule fixed before any of this was measured (``RULE``): the share in ``RULE_SHARES`` with the best
``pseudo-near`` (ties: the larger), against the default 1/3 on the test split (paired t-test).

    .venv/bin/python bench/label_free_shares.py --collections scifact cranfield vaswani \\
        --rankers mores-2ib-s2 prettr-l5-e128 tk-2l --steps 0 --out bench/results/label-free/shares

Writes ``--out``: ``label_free_shares.{json,md}``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_shares")
DEPTH = 100
SHARES = (0.0, 0.1, 1 / 6, 0.2, 0.25, 1 / 3, 0.5, 1.0)
RULE_SHARES = (0.0, 1 / 6, 1 / 3)
RULE = "the share in {0, 1/6, 1/3} with the best pseudo-near nDCG@10 (ties: the larger)"


def parse_args(argv=None) -> argparse.Namespace:
    import label_free as lf

    from aheadrank.passages import AGGREGATIONS, DEFAULT_AGGREGATION

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["scifact", "cranfield", "vaswani"])
    ap.add_argument("--rankers", nargs="+", default=["mores-2ib-s2", "prettr-l5-e128", "tk-6l-base"])
    lf.add_build_name_options(ap)
    ap.add_argument("--aggregation", default=DEFAULT_AGGREGATION, choices=AGGREGATIONS)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "label-free" / "shares")
    ap.add_argument("--progress", action="store_true")
    return lf.recipe_settings(ap.parse_args(argv))


def weights(share: float) -> dict[str, float]:
    return {"neural": share, "bm25": (1 - share) / 2, "dense": (1 - share) / 2}


def rule_choice(pseudo_near: dict[float, float]) -> float:
    """:data:`RULE`: the share of :data:`RULE_SHARES` with the best held-out score; ties go to the larger."""
    return max(RULE_SHARES, key=lambda w: (round(pseudo_near[w], 12), w))


def pseudo_scores(build_dir: Path, device: str, progress: bool) -> dict[str, dict[float, float]]:
    """{labels: {share: mean nDCG@10}} on the build's held-out pseudo-queries."""
    from aheadrank.build import near_source_labels, paths, pseudo_validation
    from aheadrank.priors import FEATURES, mean_ndcg10, zscore
    from aheadrank.rerank import collect_features

    p = paths(build_dir)
    val, cands, qrels = pseudo_validation(build_dir)
    feats, _ = collect_features(p["checkpoint"], p["store"], val, cands, qrels, device, progress)
    near, _ = near_source_labels(p["store"], feats)
    out = {}
    for labels, qs in (("pseudo-source", feats), ("pseudo-near", near)):
        z = [{f: zscore(q.features[f]) for f in FEATURES if f in q.features} for q in qs]
        out[labels] = {w: mean_ndcg10(qs, z, weights(w)) for w in SHARES}
    out["queries"] = len(feats)
    return out


def bench_build(args, name: str, variant: str, queries, qrels, cands) -> dict:
    import label_free as lf

    from aheadrank.build import paths
    from aheadrank.evaluation import compare, evaluate

    d = args.workdir / name / lf.build_name(args, name, variant)
    if not (d / "build.json").is_file():
        raise SystemExit(f"no build at {d}: run bench/label_free.py with the same settings first")
    p = paths(d)
    pseudo = pseudo_scores(d, args.device, args.progress)
    vf = lf.neural_features(
        p["checkpoint"], p["store"], queries, cands, qrels, args.device, args.progress, args.aggregation
    )
    runs = {w: lf.runs_from(vf, weights(w)) for w in SHARES}
    test = {w: evaluate(runs[w], qrels, ("nDCG@10",))["nDCG@10"] for w in SHARES}
    chosen = rule_choice(pseudo["pseudo-near"])
    return {
        "build": str(d),
        "pseudo_queries": pseudo["queries"],
        "shares": [
            {
                "share": w,
                "pseudo_source": pseudo["pseudo-source"][w],
                "pseudo_near": pseudo["pseudo-near"][w],
                "test": test[w],
            }
            for w in SHARES
        ],
        "rule": {
            "share": chosen,
            "test": test[chosen],
            "vs_default": lf.comparison(compare, runs[1 / 3], runs[chosen], qrels),
            "best_test_share": max(SHARES, key=test.get),
        },
    }


def bench_collection(args, name: str) -> dict:
    from benchkit import Bm25Hits, eval_topics

    collection = args.data / name
    queries, qrels = eval_topics(collection, "test", None)
    cands = Bm25Hits(collection, args.workdir, args.progress).hits(queries, DEPTH)
    out = {"collection": name, "variants": {}}
    for v in args.rankers:
        out["variants"][v] = bench_build(args, name, v, queries, qrels, cands)
        log.info("%s %s: rule %s", name, v, out["variants"][v]["rule"])
    return out


def table(results: list[dict]) -> str:
    lines = [f"Rule (fixed before the measurement): {RULE}.\n"]
    for r in results:
        for v, row in r["variants"].items():
            rule = row["rule"]
            lines.append(
                f"\n### {r['collection']} × {v} ({row['pseudo_queries']} held-out pseudo-queries)\n\n"
                "| neural share | pseudo-source | pseudo-near | test |\n|---:|---:|---:|---:|"
            )
            for s in row["shares"]:
                mark = " (rule)" if s["share"] == rule["share"] else ""
                lines.append(
                    f"| {s['share']:.3f}{mark} | {s['pseudo_source']:.4f} | {s['pseudo_near']:.4f} | {s['test']:.4f} |"
                )
            vs = rule["vs_default"]
            lines.append(
                f"\nrule: share {rule['share']:.3f}, test {rule['test']:.4f} ({vs['diff']:+.4f} vs 1/3, p {vs['p']:.2g}); "
                f"best share on the test split {rule['best_test_share']:.3f}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    import label_free as lf

    return lf.run_probe(argv, parse_args, bench_collection, table, "label_free_shares", rule=RULE)


if __name__ == "__main__":
    raise SystemExit(main())
