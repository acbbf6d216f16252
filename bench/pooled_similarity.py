"""Where PreTTR's similarity residual starts: nDCG@10 on SciFact test (BM25 top-100) of an *untrained* PreTTR
ranker's pooled similarity, against the bi-encoder it is derived from (issue 14).

Per split layer l (no compressor, e = 0, so that only the pooling is measured), three orderings of the same
candidates, all from the base all-MiniLM-L6-v2 weights:

- ``layer-l pooled``: cos(mean of the query's layer-l states, mean of the document's stored layer-l states)
  (what the residual compared before the map existed);
- ``mapped (the ranker at step 0)``: the untrained ranker's own score through the store path, α·cos(q̄,
  P(mean ŝ)), with P fitted by :meth:`PrettrRanker.fit_pool_map` on ``--fit-docs`` documents sampled as the
  training recipe samples them (the head starts at zero, so this is exactly its ranking before training);
- ``bi-encoder``: cos(q̄, the document alone through all L layers) — the target the map is fitted to (the
  base model's own bi-encoder at this document length).

    .venv/bin/python bench/pooled_similarity.py --threads 2      # -> bench/results/pooled_similarity.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from benchkit import Bm25Hits, eval_topics, machine_info, write_record
from rich.console import Console
from rich.table import Table

from aheadrank.evaluation import evaluate

REPO = Path(__file__).resolve().parents[1]
SCIFACT = REPO.parent / "shared" / "data" / "scifact"
console = Console(width=None if sys.stdout.isatty() else 160)


def ndcg10(scores: dict[str, torch.Tensor], candidates: dict[str, list[str]], qrels: dict) -> float:
    run = {
        q: {d: float(s) for d, s in zip(candidates[q], v.tolist(), strict=True)} for q, v in scores.items()
    }
    return round(evaluate(run, qrels, ["ndcg_cut_10"])["ndcg_cut_10"], 4)


@torch.no_grad()
def measure(layer: int, args, queries: dict, candidates: dict, qrels: dict, texts: dict) -> dict:
    from aheadrank.rankers import init_ranker
    from aheadrank.rankers.base import masked_mean
    from aheadrank.rankers.recipe import POOL_DOCS, sample_texts
    from aheadrank.rankers.text import pad_fields

    r = init_ranker("prettr", base=args.base, layer=layer, compress=0, max_doc_len=args.max_doc_len, sim=True)
    t0 = time.perf_counter()
    fit = r.fit_pool_map(sample_texts(texts, args.fit_docs or POOL_DOCS, args.seed), progress=args.progress)
    fit_s = time.perf_counter() - t0
    docs = sorted({d for c in candidates.values() for d in c})
    index = {d: i for i, d in enumerate(docs)}
    stored = r.encode_documents([texts[d] for d in docs])  # the store's fields (float32 here)
    layer_l = torch.stack([f["doc"].float().mean(0) for f in stored])
    toks = r.tokenize_documents([texts[d] for d in docs])
    bi = torch.cat([r.bi_encoder_embedding(toks[i : i + 64]) for i in range(0, len(toks), 64)])
    rows: dict[str, dict[str, torch.Tensor]] = {"layer_l_pooled": {}, "mapped_step0": {}, "bi_encoder": {}}
    for q, cands in candidates.items():
        qs = r.encode_query(queries[q])
        rows_of = [index[d] for d in cands]
        q_l = masked_mean(qs["q"], qs.mask)
        rows["layer_l_pooled"][q] = F.cosine_similarity(q_l, layer_l[rows_of])
        rows["bi_encoder"][q] = F.cosine_similarity(qs["q_pool"], bi[rows_of])
        fields, mask = pad_fields([stored[i] for i in rows_of], "cpu", torch.float16)  # as stored
        rows["mapped_step0"][q] = r.score_batch(qs, fields, mask)
    return {
        "layer": layer,
        "fit": {**fit, "seconds": round(fit_s, 1)},
        **{name: ndcg10(s, candidates, qrels) for name, s in rows.items()},
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--collection", type=Path, default=SCIFACT)
    ap.add_argument("--split", default="test")
    ap.add_argument("--layers", type=int, nargs="+", default=[5])
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--max-doc-len", type=int, default=128)
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument(
        "--fit-docs", type=int, default=None, help="documents P is fitted on (default: the recipe's)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--workdir", type=Path, default=REPO / "work" / "bench-effectiveness")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "pooled_similarity.json")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    ap.add_argument("--base", default=None, help=argparse.SUPPRESS)  # tests: a tiny random BERT
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    from aheadrank.indexer.collections import Collection

    queries, qrels = eval_topics(args.collection, args.split, args.max_queries)
    hits = Bm25Hits(args.collection, args.workdir, args.progress).hits(queries, args.depth)
    candidates = {q: [d for d, _ in h] for q, h in hits.items() if h}
    texts = {d.docid: d.text for d in Collection(args.collection)}
    bm25 = ndcg10({q: torch.tensor([s for _, s in hits[q]]) for q in candidates}, candidates, qrels)
    rows = [measure(layer, args, queries, candidates, qrels, texts) for layer in args.layers]
    table = Table(
        title=f"{args.collection.name} {args.split}, BM25 top-{args.depth} (BM25 {bm25}): untrained PreTTR"
    )
    for col in ("l", "layer-l pooled", "mapped (step 0)", "bi-encoder (target)", "map R²"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["layer"]), f"{r['layer_l_pooled']:.4f}", f"{r['mapped_step0']:.4f}", f"{r['bi_encoder']:.4f}",
            f"{r['fit']['r2']:.3f}",
        )  # fmt: skip
    console.print(table)
    write_record(
        args.out,
        "bench/pooled_similarity.py",
        argv,
        machine_info(torch.get_num_threads()),
        t_start,
        bm25=bm25,
        rows=rows,
        max_doc_len=args.max_doc_len,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
