"""How much a label-free PreTTR's served score owes to the documents its start is fitted on.

A label-free PreTTR l5/e128 serves its untrained start (the validation keeps it: bench/results/label-free/): a
compressor from a PCA of ``PCA_DOCS`` documents' layer-5 states and the similarity residual's map P fitted by ridge
regression on ``--pool-docs`` documents (``rankers/prettr.py`` ``fit_pool_map``), both drawn with a seed. Here the
same start is made from the collection's documents for each ``--seeds`` × ``--pool-docs`` and scored the way the
service scores a float16 store (``score_batch`` over each test query's BM25 top 100, the documents' first window:
no passages), pure and served (neural, BM25 and bi-encoder 1/3 each, z-scores per query). Beside them the residual's
ceiling: the served score with the bi-encoder's own score in the neural score's place (what a PreTTR whose P were
exact would serve at most through its residual). P's R² is reported on the documents it was fitted on and on
``HELD_OUT`` others. Nothing is trained and no judgment chooses anything; the test judgments only score.

    .venv/bin/python bench/label_free_prettr_init.py --collections vaswani cranfield --seeds 0 1 2 \\
        --pool-docs 2048 8192 --out bench/results/label-free/prettr-init

Writes ``--out``: ``label_free_prettr_init.{json,md}``. ``--pool-docs`` with no value measures only the baselines and
the ceiling (no PreTTR start is made).
"""

from __future__ import annotations

import argparse
import logging
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_prettr_init")
DEPTH = 100
HELD_OUT = 1024  # documents P's held-out R² is measured on
VARIANT = "prettr-l5-e128"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["vaswani", "cranfield"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument(
        "--pool-docs",
        nargs="*",
        type=int,
        default=[2048],
        help="documents P is fitted on, one start per value and seed (none: only the baselines and the ceiling)",
    )
    ap.add_argument("--base", default=None)
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "label-free" / "prettr-init")
    ap.add_argument("--progress", action="store_true")
    return ap.parse_args(argv)


def pool_r2(model, texts: list[str]) -> float:
    """P's R² (all dimensions together) on ``texts``: the mapped mean of the stored states against the base
    bi-encoder's embedding, as ``fit_pool_map`` measures it on its own documents."""
    import torch
    from aheadrank.rankers.base import masked_mean
    from aheadrank.rankers.text import pad

    xs, ys = [], []
    with torch.no_grad():
        for i in range(0, len(texts), 32):
            toks = model.tokenize_documents(texts[i : i + 32])
            ids, mask = pad(toks, model.device)
            s = model.decompress(model.compress(model.lower(ids, mask, 1, model.doc_offset)))
            xs.append(model.pool_map(masked_mean(s, mask)))
            ys.append(model.bi_encoder_embedding(toks))
    x, y = torch.cat(xs).double(), torch.cat(ys).double()
    return 1.0 - float(((x - y) ** 2).sum() / ((y - y.mean(0)) ** 2).sum())


def stored_scores(model, queries: dict, cands: dict, qids: list[str], texts: dict) -> dict[str, np.ndarray]:
    """Each query's candidates scored as the service scores a float16 store (first window), in candidate order."""
    import torch
    from aheadrank.rankers.text import pad

    docids = sorted({d for q in qids for d, _ in cands[q]})
    stored = {}
    with torch.no_grad():
        for i in range(0, len(docids), 32):
            toks = model.tokenize_documents([texts[d] for d in docids[i : i + 32]])
            ids, mask = pad(toks, model.device)
            r = model.document_fields(ids, mask)["doc"].half()
            for j, d in enumerate(docids[i : i + 32]):
                stored[d] = r[j, : len(toks[j])]
        out = {}
        for q in qids:
            ds = [d for d, _ in cands[q]]
            width = max(len(stored[d]) for d in ds)
            fields = torch.zeros(len(ds), width, stored[ds[0]].shape[1], dtype=torch.float16)
            mask = torch.zeros(len(ds), width, dtype=torch.bool)
            for j, d in enumerate(ds):
                fields[j, : len(stored[d])] = stored[d]
                mask[j, : len(stored[d])] = True
            state = model.query_state(*pad(model.tokenize_queries([queries[q]]), model.device))
            out[q] = model.score_batch(state, {"doc": fields}, mask).double().numpy()
    return out


def bench_collection(args, name: str) -> dict:
    from aheadrank.indexer.collections import Collection
    from aheadrank.rankers import init_ranker
    from aheadrank.rankers.dense import dense_encoder
    from aheadrank.rankers.recipe import PCA_DOCS, sample_texts
    from benchkit import Bm25Hits, eval_topics
    from label_free import comparison, label_free_baselines, runs_from

    from aheadrank.build import LABEL_FREE_WEIGHTS
    from aheadrank.evaluation import compare, evaluate
    from aheadrank.priors import QueryFeatures

    collection = args.data / name
    queries, qrels = eval_topics(collection, "test", None)
    cands = Bm25Hits(collection, args.workdir, args.progress).hits(queries, DEPTH)
    qids = sorted(q for q in queries if cands.get(q) and any(r > 0 for r in qrels.get(q, {}).values()))
    texts = {d.docid: d.text for d in Collection(collection)}
    encoder = dense_encoder(args.base)
    docids = sorted({d for q in qids for d, _ in cands[q]})
    dvec = dict(zip(docids, encoder.encode_documents([texts[d] for d in docids]), strict=True))
    qvec = dict(zip(qids, encoder.encode_queries([queries[q] for q in qids]), strict=True))
    base = [
        (
            q,
            QueryFeatures(
                [d for d, _ in cands[q]],
                {
                    "bm25": np.array([s for _, s in cands[q]], dtype=np.float64),
                    "dense": np.array([dvec[d] @ qvec[q] for d, _ in cands[q]], dtype=np.float64),
                },
                qrels.get(q, {}),
            ),
        )
        for q in qids
    ]
    runs = label_free_baselines(base)
    ndcg = {k: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for k, r in runs.items()}
    best = max(("rrf", "fusion-equal"), key=lambda k: ndcg[k])
    served_w = LABEL_FREE_WEIGHTS["neural+bm25+dense"]

    def measured(neural: dict[str, np.ndarray]) -> dict:
        feats = [(q, QueryFeatures(f.docids, {**f.features, "neural": neural[q]}, f.qrels)) for q, f in base]
        pure, served = runs_from(feats, {"neural": 1.0}), runs_from(feats, served_w)
        return {
            "pure": evaluate(pure, qrels, ("nDCG@10",))["nDCG@10"],
            "served": evaluate(served, qrels, ("nDCG@10",))["nDCG@10"],
            "served_vs_best_baseline": comparison(compare, runs[best], served, qrels),
        }

    result = {
        "collection": name,
        "test_queries": len(qids),
        "baselines": ndcg,
        "best_label_free_baseline": best,
        "ceiling": measured({q: f.features["dense"] for q, f in base}),
        "starts": [],
    }
    everything = sorted(texts)
    for pool_docs in args.pool_docs:
        for seed in args.seeds:
            t0 = time.perf_counter()
            model = init_ranker("prettr", base=args.base, layer=5, compress=128).eval()
            model.init_compressor_pca(sample_texts(texts, PCA_DOCS, seed))
            fitted = sample_texts(texts, pool_docs, seed)
            fit = model.fit_pool_map(fitted)
            chosen = set(fitted)
            rest = [texts[d] for d in everything if texts[d] not in chosen]
            held = random.Random(seed + 1000).sample(rest, min(HELD_OUT, len(rest)))
            row = {
                "seed": seed,
                "pool_docs": fit["documents"],
                "r2_fitted": fit["r2"],
                "r2_held_out": round(pool_r2(model, held), 4) if held else None,
                **measured(stored_scores(model, queries, cands, qids, texts)),
                "seconds": round(time.perf_counter() - t0, 1),
            }
            log.info("%s %s", name, row)
            result["starts"].append(row)
    return result


def table(results: list[dict]) -> str:
    from label_free import diff_p as cmp

    lines = [
        "| collection | start | P's R² fitted / held out | pure | served | served vs better of RRF / fusion-equal |",
        "|---|---|---|---:|---:|---|",
    ]
    for r in results:
        c, b = r["collection"], r["baselines"]
        best = r["best_label_free_baseline"]
        lines.append(
            f"| {c} | BM25 {b['bm25']:.4f}, bi-encoder {b['bi-encoder']:.4f}, {best} {b[best]:.4f} | | | | |"
        )
        x = r["ceiling"]
        lines.append(
            f"| {c} | the bi-encoder as the neural score | | {x['pure']:.4f} | {x['served']:.4f} | "
            f"{cmp(x['served_vs_best_baseline'])} |"
        )
        for x in r["starts"]:
            held = "–" if x["r2_held_out"] is None else f"{x['r2_held_out']:.4f}"
            lines.append(
                f"| {c} | {VARIANT}, seed {x['seed']}, P on {x['pool_docs']} documents | {x['r2_fitted']:.4f} / {held} "
                f"| {x['pure']:.4f} | {x['served']:.4f} | {cmp(x['served_vs_best_baseline'])} |"
            )
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    from label_free import run_probe

    return run_probe(argv, parse_args, bench_collection, table, "label_free_prettr_init")


if __name__ == "__main__":
    raise SystemExit(main())
