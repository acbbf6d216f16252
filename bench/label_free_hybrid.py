"""Hybrid candidates for a label-free build: re-rank BM25's top 100 together with the bi-encoder's top 100.

Every label-free number so far re-ranks BM25's top 100 only, so a relevant document that BM25 ranks lower (or
does not retrieve: no query word in it) is lost to every run, the served one included, while the bi-encoder
that the served score already weighs could have found it: the store's dense field holds every document's
embedding, so its exact top 100 is one matrix product. A user assembling RRF or a z-score fusion by hand would
fuse the two systems' lists, not re-rank one of them. This probe measures, for finished ``bench/label_free.py``
builds (its ``--workdir`` and folder names; nothing is built or trained here):

- ``bm25`` candidates: BM25's top 100 (what every label-free folder so far measured; the served rows equal the
  build's committed ``VARIANT+priors`` runs);
- ``hybrid`` candidates: BM25's top 100 ∪ the bi-encoder's top 100 over every document (cosine with the store's
  dense field), each candidate's BM25 feature its exact BM25 score (0 where no query word is in it);

and, over each candidate set, the label-free baselines (BM25, the bi-encoder, RRF k = 60, the equal-weight z-score
fusion), each ranker's pure score and its served score with the build's own weights (``priors.json``: the window
prior where the build has it), plus the recall of each set (judged relevant documents among the candidates).

The rule, written into the commit that added this script before any of it ran: hybrid candidates become the
label-free build's served candidates only if, on Cranfield, the served score over them is at least the served
score over BM25's top 100 for each of the three rankers (MORES 2×IB S2, PreTTR l5/e128, ``tk-6l-base``); then
applied unchanged to SciFact and Vaswani. The bi-encoder's depth (100, BM25's) is fixed here, not chosen.
Comparisons (paired t-tests): hybrid served against BM25-top-100 served, and against the better of RRF and the
equal-weight fusion over the same hybrid candidates (what the served score must beat is then the user's fusion
of the two lists).

    .venv/bin/python bench/label_free_hybrid.py --collections cranfield --out bench/results/label-free/hybrid

Writes ``--out``: ``label_free_hybrid.{json,md}`` and ``<collection>/runs/<run>.trec.zst`` for the hybrid runs.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_hybrid")
DEPTH = 100  # BM25's depth in every label-free folder, and the bi-encoder's here (fixed, not chosen)


def parse_args(argv=None) -> argparse.Namespace:
    import label_free as lf

    from aheadrank.passages import AGGREGATIONS, LABEL_FREE_AGGREGATION

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["cranfield"])
    ap.add_argument("--rankers", nargs="+", default=["mores-2ib-s2", "prettr-l5-e128", "tk-6l-base"])
    ap.add_argument("--aggregation", choices=AGGREGATIONS, default=LABEL_FREE_AGGREGATION)
    lf.add_build_name_options(ap)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "label-free" / "hybrid")
    ap.add_argument("--progress", action="store_true")
    return lf.recipe_settings(ap.parse_args(argv))


def dense_top(dense_dir: Path, queries: dict[str, str], k: int, device: str) -> dict[str, list[str]]:
    """Each query's ``k`` documents of highest cosine with it over the whole dense field (exact, best first)."""
    from aheadrank.rankers.dense import dense_encoder
    from aheadrank.store import StoreReader

    enc = dense_encoder(None, device=device)
    with StoreReader(dense_dir) as reader:
        if reader.spec.fingerprint != enc.fingerprint:
            raise SystemExit(f"{dense_dir} was written by another dense encoder than the base's")
        docids = reader.docids()
        mat = np.concatenate(
            [
                reader.fetch(docids[i : i + 4096]).fields["dense"][:, 0, :].astype(np.float32)
                for i in range(0, len(docids), 4096)
            ]
        )
    qids = sorted(queries)
    sims = enc.encode_queries([queries[q] for q in qids]).astype(np.float32) @ mat.T
    out = {}
    for q, row in zip(qids, sims, strict=True):
        top = np.argpartition(-row, min(k, len(row) - 1))[:k]
        out[q] = [docids[i] for i in top[np.argsort(-row[top], kind="stable")]]
    return out


def hybrid(top: dict, every: dict, dense: dict[str, list[str]]) -> dict[str, list[tuple[str, float]]]:
    """BM25's top list, then the bi-encoder's documents it lacks with their exact BM25 score (``every``: BM25's
    hits over the whole collection) or 0 where none of the query's words is in them."""
    out = {}
    for q, hits in top.items():
        have = {d for d, _ in hits}
        exact = dict(every.get(q, []))
        out[q] = list(hits) + [(d, float(exact.get(d, 0.0))) for d in dense.get(q, []) if d not in have]
    return out


def recall(cands: dict, qrels: dict, qids: list[str]) -> float:
    """Mean over queries of the share of judged relevant documents among the candidates."""
    shares = []
    for q in qids:
        rel = {d for d, r in qrels.get(q, {}).items() if r > 0}
        shares.append(len(rel & {d for d, _ in cands.get(q, [])}) / len(rel))
    return float(np.mean(shares)) if shares else 0.0


def run_collection(args, name: str) -> dict:
    import label_free as lf
    from aheadrank.store import read_manifest
    from benchkit import Bm25Hits, eval_topics

    from aheadrank.baselines import dense_features
    from aheadrank.build import paths
    from aheadrank.evaluation import compare, evaluate
    from aheadrank.priors import read_priors

    collection = args.data / name
    shared = args.workdir / name / "shared"
    dense_dir = paths(shared)["dense"]
    if not (dense_dir / "manifest.json").is_file():
        raise SystemExit(f"no dense field at {dense_dir}: run bench/label_free.py --collections {name} first")
    queries, qrels = eval_topics(collection, "test", None)
    hits = Bm25Hits(collection, args.workdir, args.progress)
    t0 = time.perf_counter()
    top = hits.hits(queries, DEPTH)
    every = hits.hits(queries, read_manifest(dense_dir).n_docs)
    dense = dense_top(dense_dir, queries, DEPTH, args.device)
    sets = {"bm25": top, "hybrid": hybrid(top, every, dense)}
    log.info("%s: candidates in %.0f s", name, time.perf_counter() - t0)
    ndcg = lambda run: evaluate(run, qrels, ("nDCG@10",))["nDCG@10"]  # noqa: E731
    result = {"collection": name, "sets": {}}
    runs: dict[str, dict[str, dict]] = {}
    for set_name, cands in sets.items():
        feats = dense_features(dense_dir, queries, cands, qrels, device=args.device)
        qids = sorted(q for q in feats if any(r > 0 for r in qrels.get(q, {}).values()))
        base = lf.label_free_baselines([(q, feats[q]) for q in qids])
        row = {
            "queries": len(qids),
            "mean_candidates": float(np.mean([len(cands[q]) for q in qids])),
            "recall": recall(cands, qrels, qids),
            "baselines": {k: ndcg(r) for k, r in base.items()},
            "rankers": {},
        }
        row["best_baseline"] = max(("rrf", "fusion-equal"), key=row["baselines"].get)
        runs[set_name] = dict(base)
        for v in args.rankers:
            d = args.workdir / name / lf.build_name(args, name, v)
            if not (d / "build.json").is_file():
                raise SystemExit(
                    f"no build at {d}: run bench/label_free.py --collections {name} --rankers {v}"
                )
            p = paths(d)
            vf = lf.neural_features(
                p["checkpoint"],
                p["store"],
                queries,
                cands,
                qrels,
                args.device,
                args.progress,
                args.aggregation,
            )
            weights = read_priors(p["checkpoint"]).widest()
            runs[set_name][v] = lf.runs_from(vf, {"neural": 1.0})
            runs[set_name][f"{v}+priors"] = lf.runs_from(vf, weights)
            row["rankers"][v] = {"weights": weights}
        result["sets"][set_name] = row
    h, b = result["sets"]["hybrid"], result["sets"]["bm25"]
    for set_name, row in result["sets"].items():
        best = runs[set_name][row["best_baseline"]]
        for v in args.rankers:
            for kind, run_name in (("pure", v), ("served", f"{v}+priors")):
                run = runs[set_name][run_name]
                entry = {
                    "ndcg10": ndcg(run),
                    "vs_bm25": lf.comparison(compare, runs[set_name]["bm25"], run, qrels),
                    "vs_best_baseline": lf.comparison(compare, best, run, qrels),
                }
                if set_name == "hybrid":
                    entry["vs_bm25_candidates"] = lf.comparison(compare, runs["bm25"][run_name], run, qrels)
                row["rankers"][v][kind] = entry
    result["rule_met"] = all(
        h["rankers"][v]["served"]["ndcg10"] >= b["rankers"][v]["served"]["ndcg10"] for v in args.rankers
    )
    out_runs = args.out / name / "runs"
    out_runs.mkdir(parents=True, exist_ok=True)
    for run_name, run in runs["hybrid"].items():
        lf.write_zst_run(out_runs / f"{run_name}.trec.zst", run, run_name.replace("+", "_"))
    return result


def table(results: list[dict]) -> str:
    from label_free import diff_p

    lines = ["# Hybrid candidates (BM25 top 100 ∪ bi-encoder top 100) for label-free builds"]
    for r in results:
        b, h = r["sets"]["bm25"], r["sets"]["hybrid"]
        lines.append(
            f"\n### {r['collection']} ({h['queries']} test queries; recall BM25 top 100 {b['recall']:.4f}, "
            f"hybrid {h['recall']:.4f} with {h['mean_candidates']:.1f} candidates a query; rule met on this "
            f"collection: {r['rule_met']})\n"
        )
        lines.append(
            "| run | BM25 top 100 | hybrid | hybrid vs BM25 top 100 (diff, p) | hybrid vs its better fusion |"
        )
        lines.append("|---|---:|---:|---|---|")
        for k in b["baselines"]:
            lines.append(f"| {k} | {b['baselines'][k]:.4f} | {h['baselines'][k]:.4f} | | |")
        for v in h["rankers"]:
            for kind, name in (("pure", v), ("served", f"{v}+priors")):
                x, y = b["rankers"][v][kind], h["rankers"][v][kind]
                lines.append(
                    f"| {name} | {x['ndcg10']:.4f} | {y['ndcg10']:.4f} | {diff_p(y['vs_bm25_candidates'])} | "
                    f"{diff_p(y['vs_best_baseline'])} vs {h['best_baseline']} |"
                )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from label_free import run_probe

    return run_probe(argv, parse_args, run_collection, table, "label_free_hybrid", depth=DEPTH)


if __name__ == "__main__":
    raise SystemExit(main())
