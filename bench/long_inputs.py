"""Long inputs (issue 39): documents longer than the ranker's window, queries longer than it was trained on.

``--parts passages``: SciFact test (BM25 top-``--depth``), the document side read at a ``--window`` of word pieces
(64: most SciFact abstracts are longer, median about 250 pieces), pure neural nDCG@10 of

- ``truncate``: the first ``window`` pieces (today's /rerank: longer texts are cut);
- ``first``: the first passage alone (what TEI's ``truncate: true`` reads: cut back to a word boundary);
- ``maxp`` / ``meanp``: every passage (aheadrank/passages.py, overlap ``--overlap``, default a quarter of the
  window) scored like a document, the document's score the best / the mean of its passages';
- ``full``: the checkpoint's own window (``max_doc_len``), truncated, for reference.

``--parts stored``: the candidate documents indexed at the window with ``aheadrank index --max-doc-len WINDOW
--passages`` (store/passages.py; into ``--workdir``): nDCG@10 of the stored first window (truncation), of the same
passages split and encoded online (ad hoc: what /rerank does with an unknown text) and of the stored passages
(``score_stored``, what a docid or a known text gets), each with the served aggregations; the largest difference
between a stored and an ad-hoc document score; and the cost: build time and bytes of the store with and without
its passages, and per query the time to encode it and score its candidates from the store.

``--parts queries``: the same queries read at 16 / 32 / 64 word pieces (``read_queries_up_to``; the checkpoint was
trained on its ``max_query_len``): nDCG@10 from the store, and per query the time to encode it and score its
candidates from their stored fields (median and p90, ``--threads``).

    .venv/bin/python bench/long_inputs.py --checkpoint CKPT --store STORE --index BM25 \\
        --collection ../shared/data/scifact
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from benchkit import machine_info, write_record
from rich.console import Console
from rich.table import Table

from aheadrank.passages import PassageOptions, flatten, split_passages
from aheadrank.priors import ndcg10

REPO = Path(__file__).resolve().parents[1]
# a document's score from its passages' (in document order); aheadrank/passages.py AGGREGATIONS serves some
AGGREGATIONS = {
    "first": lambda s: s[0],
    "maxp": np.max,
    "meanp": np.mean,
    "first+max": lambda s: (s[0] + s.max()) / 2,
    "top2": lambda s: np.sort(s)[-2:].mean(),
}
console = Console(width=None if sys.stdout.isatty() else 160)


def topics(args):
    from aheadrank.indexer.topics import read_beir_split

    from aheadrank.runs import bm25_candidates

    queries, qrels = read_beir_split(args.collection, "test")
    if args.max_queries:
        queries = dict(sorted(queries.items())[: args.max_queries])
    return queries, qrels, bm25_candidates(args.index, queries, args.depth)


def mean_ndcg(run: dict[str, dict[str, float]], qrels) -> float:
    return float(
        np.mean([ndcg10(np.array(list(s.values())), list(s), qrels.get(q, {})) for q, s in run.items()])
    )


def passages_part(args, ranker, queries, qrels, cands) -> dict:
    """nDCG@10 of each way of reading long documents, pure neural scores."""
    from aheadrank.indexer.collections import Collection

    wanted = {d for hits in cands.values() for d, _ in hits}
    texts = {d.docid: d.text for d in Collection(args.collection) if d.docid in wanted}
    ids = sorted(texts)
    tok = ranker._text().tokenizer
    lengths = [len(p) for p in tok([texts[d] for d in ids], add_special_tokens=False)["input_ids"]]
    full_window = ranker.config.max_doc_len
    t0 = time.perf_counter()
    encoded: dict[str, dict] = {}
    ranker.limit_doc_len(full_window)
    encoded["full"] = dict(zip(ids, ranker.encode_documents([texts[d] for d in ids]), strict=True))
    ranker.limit_doc_len(args.window)
    encoded["truncate"] = dict(zip(ids, ranker.encode_documents([texts[d] for d in ids]), strict=True))
    opts = PassageOptions(window=args.window, overlap=args.overlap, max_passages=None)
    split = split_passages(tok, [texts[d] for d in ids], opts)
    flat, owner = flatten(split)
    fields = ranker.encode_documents(flat)
    per_doc: dict[str, list] = {d: [] for d in ids}
    for f, i in zip(fields, owner, strict=True):
        per_doc[ids[i]].append(f)
    encode_s = time.perf_counter() - t0
    runs: dict[str, dict] = {m: {} for m in ("full", "truncate", *AGGREGATIONS)}
    for qid, query in queries.items():
        qs = ranker.encode_query(query)
        docids = [d for d, _ in cands.get(qid, [])]
        if not docids:
            continue
        for m in ("full", "truncate"):
            runs[m][qid] = dict(
                zip(docids, ranker.score(qs, [encoded[m][d] for d in docids]).tolist(), strict=True)
            )
        ps = [f for d in docids for f in per_doc[d]]
        owners = [k for k, d in enumerate(docids) for _ in per_doc[d]]
        s = ranker.score(qs, ps).numpy()
        per: dict[str, dict[str, float]] = {m: {} for m in AGGREGATIONS}
        for k, d in enumerate(docids):
            mine = s[[i for i, o in enumerate(owners) if o == k]]
            for m, agg in AGGREGATIONS.items():
                per[m][d] = float(agg(mine))
        for m in AGGREGATIONS:
            runs[m][qid] = per[m]
    ranker.limit_doc_len(full_window)
    return {
        "window": args.window,
        "overlap": opts.window - opts.stride,
        "full_window": full_window,
        "documents": len(ids),
        "pieces_median": statistics.median(lengths),
        "longer_than_window": sum(n > args.window for n in lengths) / len(lengths),
        "passages_per_document": len(flat) / len(ids),
        "encode_s": encode_s,
        "ndcg10": {m: mean_ndcg(r, qrels) for m, r in runs.items()},
    }


SERVED = ("maxp", "meanp", "first+max")  # aheadrank/passages.py AGGREGATIONS


def stored_part(args, ranker, queries, qrels, cands) -> dict:
    """Truncation vs ad-hoc chunking vs stored chunking (``aheadrank index --passages``), pure neural scores."""
    import json

    from aheadrank.indexer.build import BuildOptions, build_passages, build_store, release_rankers
    from aheadrank.indexer.collections import Collection
    from aheadrank.store import StoreReader, read_manifest
    from aheadrank.store.passages import PASSAGES_DIR, open_passages

    from aheadrank.passages import DEFAULT_MAX_PASSAGES, aggregate, effective_overlap
    from aheadrank.rerank import score_stored

    wanted = {d for hits in cands.values() for d, _ in hits}
    texts = {d.docid: d.text for d in Collection(args.collection) if d.docid in wanted}
    ids = sorted(texts)
    args.workdir.mkdir(parents=True, exist_ok=True)
    corpus = args.workdir / "candidates.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d, "title": "", "text": texts[d]}) + "\n" for d in ids))
    store = args.workdir / f"store-{args.window}"
    opts = BuildOptions(
        str(args.checkpoint),
        str(corpus),
        str(store),
        max_doc_len=args.window,
        overwrite=True,
        progress=False,
        dense=False,
        passages=True,
        passage_overlap=args.overlap,
    )
    t0 = time.perf_counter()
    main = build_store(opts)
    t1 = time.perf_counter()
    split = build_passages(opts)
    t2 = time.perf_counter()
    release_rankers()
    cost = {
        "documents": main.documents,
        "passage_entries": split.documents,
        "bytes_truncated": read_manifest(store).n_bytes,
        "bytes_passages": read_manifest(store / PASSAGES_DIR).n_bytes,
        "build_s_truncated": t1 - t0,
        "build_s_passages": t2 - t1,
    }

    # ad hoc: the same split, encoded online as /rerank encodes an unknown text
    ranker.limit_doc_len(args.window)
    popts = PassageOptions(args.window, effective_overlap(args.window, args.overlap), DEFAULT_MAX_PASSAGES)
    flat, owner = flatten(split_passages(ranker._text().tokenizer, [texts[d] for d in ids], popts))
    per_doc: dict[str, list] = {d: [] for d in ids}
    for f, i in zip(ranker.encode_documents(flat), owner, strict=True):
        per_doc[ids[i]].append(f)
    runs: dict[str, dict] = {"truncate": {}, **{f"{w} {m}": {} for w in ("ad hoc", "stored") for m in SERVED}}
    times: dict[str, list[float]] = {"truncate": [], "stored first+max": []}
    reader = StoreReader(store)
    passages = open_passages(store, reader)
    diff = 0.0
    try:
        for qid, query in queries.items():
            docids = [d for d, _ in cands.get(qid, [])]
            if not docids:
                continue
            qs = ranker.encode_query(query)
            t = time.perf_counter()
            scored, _ = score_stored(ranker, reader, qs, docids, {"fetch": 0.0, "score": 0.0})
            times["truncate"].append(time.perf_counter() - t)
            runs["truncate"][qid] = dict(scored)
            ps = [f for d in docids for f in per_doc[d]]
            owners = [k for k, d in enumerate(docids) for _ in per_doc[d]]
            online = ranker.score(qs, ps).tolist()
            for m in SERVED:
                runs[f"ad hoc {m}"][qid] = dict(
                    zip(docids, aggregate(online, owners, len(docids), m), strict=True)
                )
                t = time.perf_counter()
                scored, _ = score_stored(
                    ranker, reader, qs, docids, {"fetch": 0.0, "score": 0.0}, None, passages, m
                )
                if m == "first+max":
                    times["stored first+max"].append(time.perf_counter() - t)
                runs[f"stored {m}"][qid] = dict(scored)
                diff = max(diff, max(abs(s - runs[f"ad hoc {m}"][qid][d]) for d, s in scored))
    finally:
        passages.close()
        reader.close()
        ranker.limit_doc_len(ranker.config.max_doc_len)
    return {
        "window": args.window,
        "overlap": popts.window - popts.stride,
        "max_passages": DEFAULT_MAX_PASSAGES,
        "documents": len(ids),
        "passages_per_document": len(flat) / len(ids),
        "ndcg10": {m: mean_ndcg(r, qrels) for m, r in runs.items()},
        "max_abs_score_diff": diff,
        "cost": cost,
        "query_ms_median": {k: 1e3 * statistics.median(v) for k, v in times.items()},
    }


def queries_part(args, ranker, queries, qrels, cands) -> dict:
    """nDCG@10 and per-query latency (encode + score the candidates from the store) per query length."""
    from aheadrank.store import StoreReader

    from aheadrank.rerank import score_stored

    tok = ranker._text().tokenizer
    pieces = [len(p) for p in tok(list(queries.values()), add_special_tokens=False)["input_ids"]]
    reader = StoreReader(args.store)
    out = {
        "queries": len(queries),
        "pieces_median": statistics.median(pieces),
        "pieces_max": max(pieces),
        "longer_than": {str(n): sum(p > n for p in pieces) for n in args.query_lens},
        "trained_max_query_len": ranker.config.max_query_len,
        "rows": {},
    }
    try:
        for n in args.query_lens:
            got = ranker.read_queries_up_to(n)
            run, times = {}, []
            for _ in range(args.repeat):
                for qid, query in queries.items():
                    docids = [d for d, _ in cands.get(qid, [])]
                    t = time.perf_counter()
                    qs = ranker.encode_query(query)
                    scored, _ = score_stored(ranker, reader, qs, docids, {"fetch": 0.0, "score": 0.0})
                    times.append(time.perf_counter() - t)
                    run[qid] = dict(scored)
            out["rows"][str(n)] = {
                "query_len": got,
                "ndcg10": mean_ndcg(run, qrels),
                "ms_median": 1e3 * statistics.median(times),
                "ms_p90": 1e3 * float(np.percentile(times, 90)),
            }
    finally:
        reader.close()
        ranker.read_queries_up_to(ranker.config.max_query_len)
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--store", type=Path, help="its store (--parts queries)")
    ap.add_argument("--index", type=Path, required=True, help="the collection's BM25 index")
    ap.add_argument("--collection", type=Path, default=REPO.parent / "shared" / "data" / "scifact")
    ap.add_argument(
        "--parts", nargs="+", default=["passages", "queries"], choices=["passages", "stored", "queries"]
    )
    ap.add_argument("--depth", type=int, default=100)
    ap.add_argument("--max-queries", type=int, default=None, help="the first N test queries (default: all)")
    ap.add_argument("--window", type=int, default=64)
    ap.add_argument("--overlap", type=int, default=None)
    ap.add_argument("--query-lens", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--repeat", type=int, default=2, help="passes over the queries per length (latency)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "long_inputs.json")
    ap.add_argument(
        "--workdir", type=Path, default=Path("/tmp/aheadrank-long-inputs"), help="--parts stored's store"
    )
    args = ap.parse_args(argv)
    import torch
    from aheadrank.rankers import load_ranker

    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    ranker = load_ranker(args.checkpoint)
    queries, qrels, cands = topics(args)
    fields: dict = {}
    if "passages" in args.parts:
        fields["passages"] = passages_part(args, ranker, queries, qrels, cands)
        p = fields["passages"]
        t = Table(
            title=f"{args.collection.name} test, {len(queries)} queries, top-{args.depth}: documents at a "
            f"{p['window']}-piece window ({p['longer_than_window']:.0%} longer; {p['passages_per_document']:.1f} "
            f"passages each, overlap {p['overlap']})"
        )
        t.add_column("documents read as")
        t.add_column("nDCG@10", justify="right")
        for m, v in p["ndcg10"].items():
            t.add_row(m if m != "full" else f"full ({p['full_window']} pieces, truncated)", f"{v:.4f}")
        console.print(t)
    if "stored" in args.parts:
        fields["stored"] = p = stored_part(args, ranker, queries, qrels, cands)
        t = Table(
            title=f"{len(queries)} queries, top-{args.depth}, {p['window']}-piece window: stored passages "
            f"({p['passages_per_document']:.1f} a document, overlap {p['overlap']}) vs the same split ad hoc"
        )
        t.add_column("documents read as")
        t.add_column("nDCG@10", justify="right")
        for m, v in p["ndcg10"].items():
            t.add_row(m, f"{v:.4f}")
        console.print(t)
        console.print(
            f"largest |stored - ad hoc| document score: {p['max_abs_score_diff']:.2e}; cost {p['cost']}"
        )
    if "queries" in args.parts:
        if args.store is None:
            sys.exit("--parts queries needs --store")
        fields["queries"] = queries_part(args, ranker, queries, qrels, cands)
        q = fields["queries"]
        t = Table(
            title=f"query length ({len(queries)} queries, median {q['pieces_median']} pieces, max "
            f"{q['pieces_max']}; trained on {q['trained_max_query_len']})"
        )
        for col in ("read up to", "queries longer", "nDCG@10", "ms median", "ms p90"):
            t.add_column(col, justify="right")
        for n, r in q["rows"].items():
            t.add_row(
                str(r["query_len"]),
                str(q["longer_than"][n]),
                f"{r['ndcg10']:.4f}",
                f"{r['ms_median']:.1f}",
                f"{r['ms_p90']:.1f}",
            )
        console.print(t)
    record = write_record(
        args.out,
        "long_inputs",
        argv,
        machine_info(args.threads),
        t_start,
        checkpoint=args.checkpoint.name,
        collection=args.collection.name,
        depth=args.depth,
        **fields,
    )
    write_markdown(args.out.with_suffix(".md"), record, len(queries))
    return record


def write_markdown(path: Path, record: dict, queries: int) -> None:
    lines = [
        f"# Long inputs: {record['collection']} test ({queries} queries, BM25 top-{record['depth']})",
        "",
    ]
    lines += [f"Checkpoint `{record['checkpoint']}`, pure neural scores. Command: `{record['command']}`.", ""]
    if "passages" in record:
        p = record["passages"]
        lines += [
            f"Documents at a {p['window']}-piece window: {p['documents']:,} candidate documents, median "
            f"{p['pieces_median']:.0f} pieces, {p['longer_than_window']:.0%} longer than the window, "
            f"{p['passages_per_document']:.1f} passages each (overlap {p['overlap']}).",
            "",
            "| documents read as | nDCG@10 |",
            "|---|---:|",
        ]
        names = {
            "full": f"checkpoint's window ({p['full_window']} pieces), truncated",
            "truncate": f"first {p['window']} pieces (truncation, today's /rerank)",
            "first": "first passage (TEI truncate: true)",
            "maxp": "MaxP: best passage",
            "meanp": "MeanP: mean of the passages",
            "first+max": "mean of the first and the best passage",
            "top2": "mean of the two best passages",
        }
        lines += [f"| {names.get(m, m)} | {v:.4f} |" for m, v in p["ndcg10"].items()]
        lines.append("")
    if "stored" in record:
        lines += stored_markdown(record["stored"])
    if "queries" in record:
        q = record["queries"]
        lines += [
            f"Queries: median {q['pieces_median']:.0f} pieces, max {q['pieces_max']}; the checkpoint was "
            f"trained on {q['trained_max_query_len']}. Latency: encode the query and score its candidates from "
            "the store, per query.",
            "",
            "| read up to | queries longer | nDCG@10 | ms median | ms p90 |",
            "|---:|---:|---:|---:|---:|",
        ]
        for n, r in q["rows"].items():
            lines.append(
                f"| {r['query_len']} | {q['longer_than'][n]} | {r['ndcg10']:.4f} | {r['ms_median']:.1f} "
                f"| {r['ms_p90']:.1f} |"
            )
    path.write_text("\n".join(lines) + "\n")


def stored_markdown(p: dict) -> list[str]:
    c = p["cost"]
    names = {"truncate": f"first {p['window']} pieces (the store without passages: truncation)"}
    for m in SERVED:
        names[f"ad hoc {m}"] = f"passages split and encoded online (an unknown text on /rerank), {m}"
        names[f"stored {m}"] = f"stored passages (`aheadrank index --passages`: docid or known text), {m}"
    ms = p["query_ms_median"]
    return [
        f"Stored vs ad-hoc passages at a {p['window']}-piece window: {p['documents']:,} candidate documents, "
        f"{p['passages_per_document']:.1f} passages each (overlap {p['overlap']}, at most {p['max_passages']}).",
        "",
        "| documents read as | nDCG@10 |",
        "|---|---:|",
        *[f"| {names.get(m, m)} | {v:.4f} |" for m, v in p["ndcg10"].items()],
        "",
        f"Largest difference between a document's stored and ad-hoc score: {p['max_abs_score_diff']:.1e} (float16 "
        "storage; the rankings above are what it leaves).",
        "",
        "| store | entries | bytes | build s | per query: fetch + score its candidates, ms (median) |",
        "|---|---:|---:|---:|---:|",
        f"| truncated (first window) | {c['documents']:,} | {c['bytes_truncated']:,} | {c['build_s_truncated']:.1f} "
        f"| {ms['truncate']:.1f} |",
        f"| + passages/ (`--passages`) | +{c['passage_entries']:,} | +{c['bytes_passages']:,} "
        f"| +{c['build_s_passages']:.1f} | {ms['stored first+max']:.1f} |",
        "",
    ]


if __name__ == "__main__":
    main()
