"""The base model's token-level MaxSim as a label-free signal: alone, beside the served score, instead of MORES.

The base model (all-MiniLM-L6-v2) was trained to pool its token states into one vector; its token states themselves
also match a query's words to a document's (ColBERT's late interaction, zero-shot): MaxSim(q, d) = the mean over the
query's word pieces of their best cosine with any of the document's, [CLS] and [SEP] left out, the document cut at
the bi-encoder's length. Nothing is trained and no judgment is read. Over the committed label-free runs of the
default MORES 2×IB S2 builds (the BM25 top-100 of each test query), on the test split (nDCG@10):

- ``maxsim``: MaxSim alone (against BM25, paired t-test);
- ``served``: the committed served run, its features taken back from the committed runs (BM25, the bi-encoder, pure
  MORES; the window prior what is left of the served score), so the row equals the committed one;
- ``served+maxsim``: MaxSim as one more feature at the same weight as the others' mean (the weights × n/(n+1), MaxSim
  1/(n+1));
- ``maxsim-for-mores``: MaxSim in MORES's place, at its weight;
- ``tk-6l-base+priors``: the committed served run of the TK build of the same run, and ``maxsim-for-tk``: MaxSim in
  TK's place at TK's weights (TK's neural share is 1/6);

each of ``served+maxsim`` and ``maxsim-for-mores`` against ``served``, ``maxsim-for-tk`` against the TK build's, and
every served row against the equal-weight fusion of BM25 and the bi-encoder. The weights were fixed before the run: equal, as the label-free build's.

    .venv/bin/python bench/label_free_maxsim.py --collections scifact cranfield vaswani

Writes ``--out`` (``bench/results/label-free/maxsim``): ``label_free_maxsim.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

log = logging.getLogger("bench.label_free_maxsim")

LF = ROOT / "bench" / "results" / "label-free"
# the committed runs of the default label-free MORES 2×IB S2 builds (MaxP) and the JSON holding their weights
RUNS = {
    "scifact": (LF / "maxp-scifact" / "scifact" / "runs", LF / "maxp-scifact" / "label_free.json"),
    "cranfield": (
        LF / "maxp-cranfield-vaswani" / "cranfield" / "runs",
        LF / "maxp-cranfield-vaswani" / "label_free.json",
    ),
    "vaswani": (
        LF / "maxp-cranfield-vaswani" / "vaswani" / "runs",
        LF / "maxp-cranfield-vaswani" / "label_free.json",
    ),
}
# the baselines' runs of SciFact (the same BM25 top-100 and scores) are in the first MaxP-less run's folder
BASELINE_RUNS = {"scifact": LF / "scifact" / "runs"}
VARIANT = "mores-2ib-s2"
TK = "tk-6l-base"


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=list(RUNS), choices=list(RUNS))
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free-maxsim", help="MaxSim cache")
    ap.add_argument("--out", type=Path, default=LF / "maxsim")
    return ap.parse_args(argv)


def maxsim(query: np.ndarray, doc: np.ndarray) -> float:
    """Mean over the query's rows of their best dot product with ``doc``'s rows (unit rows: cosines)."""
    return float((query @ doc.T).max(axis=1).mean())


def token_states(texts: list[str], queries: bool, batch: int = 64) -> list[np.ndarray]:
    """Each text's unit-normalised last-layer token states of the base model, [CLS] and [SEP] left out."""
    import torch
    from aheadrank.rankers.blocks import key_mask
    from aheadrank.rankers.dense import dense_encoder
    from aheadrank.rankers.text import pad, positions

    enc = dense_encoder()
    seqs = enc.tokenize_queries(texts) if queries else enc.tokenize_documents(texts)
    out: list[np.ndarray] = [np.zeros((0, 0), np.float32)] * len(seqs)
    order = np.argsort([-len(s) for s in seqs], kind="stable")
    with torch.inference_mode():
        for start in range(0, len(order), batch):
            idx = order[start : start + batch]
            ids, mask = pad([seqs[i] for i in idx], enc.device, enc.text.pad)
            x = enc.encoder.embeddings(ids, 0, positions(mask))
            h = torch.nn.functional.normalize(enc.encoder.run(x, key_mask(mask)).float(), dim=-1)
            for j, i in enumerate(idx):
                n = int(mask[j].sum())
                out[i] = h[j, 1 : n - 1].numpy()
    return out


def maxsim_run(collection: Path, queries: dict, cands: dict, cache: Path) -> dict:
    """{qid: {docid: MaxSim}} over ``cands``, cached under ``cache`` by the queries and candidates."""
    from aheadrank.indexer.collections import Collection

    key = {"queries": queries, "cands": {q: sorted(d) for q, d in cands.items()}}
    if cache.is_file():
        saved = json.loads(cache.read_text())
        if saved["key"] == key:
            return saved["run"]
    docs = sorted({d for ds in cands.values() for d in ds})
    wanted = set(docs)
    texts = {d.docid: d.text for d in Collection(collection) if d.docid in wanted}
    t0 = time.perf_counter()
    dt = dict(zip(docs, token_states([texts[d] for d in docs], False), strict=True))
    qids = sorted(cands)
    qt = dict(zip(qids, token_states([queries[q] for q in qids], True), strict=True))
    run = {q: {d: maxsim(qt[q], dt[d]) for d in cands[q]} for q in qids}
    log.info(
        "%s: MaxSim of %d documents, %d queries in %.0f s",
        collection.name,
        len(docs),
        len(qids),
        time.perf_counter() - t0,
    )
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"key": key, "run": run}))
    return run


def zscored(run: dict) -> dict:
    from aheadrank.priors import zscore

    out = {}
    for q, scores in run.items():
        docs = list(scores)
        out[q] = dict(zip(docs, zscore(np.array([scores[d] for d in docs])).tolist(), strict=True))
    return out


def combine(parts: dict, weights: dict) -> dict:
    """Σ w·part over each query's candidates (``parts``: {name: {qid: {docid: z}}})."""
    first = next(iter(parts.values()))
    return {
        q: {d: sum(w * parts[k][q][d] for k, w in weights.items() if w) for d in docs}
        for q, docs in first.items()
    }


def bench_collection(args, name: str) -> dict:
    import label_free as lf
    from benchkit import eval_topics

    from aheadrank.evaluation import compare, evaluate, read_run

    runs_dir, summary = RUNS[name]
    base_dir = BASELINE_RUNS.get(name, runs_dir)
    variants = next(r for r in json.loads(summary.read_text())["results"] if r["collection"] == name)[
        "variants"
    ]
    weights, tk_weights = variants[VARIANT]["weights"], variants[TK]["weights"]
    queries, qrels = eval_topics(args.data / name, "test", None)
    served = read_run(runs_dir / f"{VARIANT}+priors.trec.zst")
    qids = sorted(served)
    cands = {q: list(served[q]) for q in qids}
    z = {
        "neural": zscored(read_run(runs_dir / f"{VARIANT}.trec.zst")),
        "bm25": zscored(read_run(base_dir / "bm25.trec.zst")),
        "dense": zscored(read_run(base_dir / "bi-encoder.trec.zst")),
    }
    for k, part in z.items():
        if any(set(part.get(q, {})) != set(cands[q]) for q in qids):
            raise SystemExit(f"{name}: the {k} run does not hold the served run's candidates")
    if "window" in weights:  # what is left of the served score, over the window prior's weight
        rest = combine(z, {k: w for k, w in weights.items() if k != "window"})
        z["window"] = {
            q: {d: (served[q][d] - rest[q][d]) / weights["window"] for d in cands[q]} for q in qids
        }
    z["maxsim"] = zscored(maxsim_run(args.data / name, queries, cands, args.workdir / f"{name}.json"))
    n = len(weights)
    rows = {
        "bm25": {"bm25": 1.0},
        "bi-encoder": {"dense": 1.0},
        "mores-2ib-s2 (pure)": {"neural": 1.0},
        "maxsim": {"maxsim": 1.0},
        "served": dict(weights),
        "served+maxsim": {**{k: w * n / (n + 1) for k, w in weights.items()}, "maxsim": 1 / (n + 1)},
        "maxsim-for-mores": {
            **{k: w for k, w in weights.items() if k != "neural"},
            "maxsim": weights["neural"],
        },
        "maxsim-for-tk": {
            **{k: w for k, w in tk_weights.items() if k != "neural"},
            "maxsim": tk_weights["neural"],
        },
        "fusion-equal": {"bm25": 0.5, "dense": 0.5},
    }
    runs = {k: combine(z, w) for k, w in rows.items()}
    runs["tk-6l-base+priors"] = read_run(runs_dir / f"{TK}+priors.trec.zst")
    out = {"collection": name, "test_queries": len(qids), "weights": rows, "runs": {}}
    committed = evaluate(served, qrels, ("nDCG@10",))["nDCG@10"]
    for k, run in runs.items():
        row = {"ndcg10": evaluate(run, qrels, ("nDCG@10",))["nDCG@10"]}
        if k.startswith("served+") or k == "maxsim-for-mores":
            row["vs_served"] = lf.comparison(compare, runs["served"], run, qrels)
        if k == "maxsim-for-tk":
            row["vs_tk"] = lf.comparison(compare, runs["tk-6l-base+priors"], run, qrels)
        if k.startswith(("served", "maxsim-for", "tk-")):
            row["vs_fusion"] = lf.comparison(compare, runs["fusion-equal"], run, qrels)
        if k in ("maxsim", "mores-2ib-s2 (pure)"):
            row["vs_bm25"] = lf.comparison(compare, runs["bm25"], run, qrels)
        out["runs"][k] = row
    out["served_committed_ndcg10"] = committed
    if abs(out["runs"]["served"]["ndcg10"] - committed) > 1e-9:
        raise SystemExit(
            f"{name}: the served score taken apart gives {out['runs']['served']['ndcg10']}, not {committed}"
        )
    log.info("%s: %s", name, {k: round(r["ndcg10"], 4) for k, r in out["runs"].items()})
    return out


def table(results: list[dict]) -> str:
    import label_free as lf

    names = list(results[0]["runs"])
    lines = [
        "| run | " + " | ".join(f"{r['collection']} ({r['test_queries']} queries)" for r in results) + " |"
    ]
    lines.append("|---|" + "---|" * len(results))
    for k in names:
        cells = []
        for r in results:
            row = r["runs"][k]
            said = "; ".join(
                f"{lf.diff_p(row[c])} vs {c[3:].replace('_', ' ')}"
                for c in ("vs_bm25", "vs_served", "vs_tk", "vs_fusion")
                if c in row
            )
            cells.append(f"{row['ndcg10']:.4f}" + (f" ({said})" if said else ""))
        lines.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    import label_free as lf

    return lf.run_probe(argv, parse_args, bench_collection, table, "label_free_maxsim")


if __name__ == "__main__":
    raise SystemExit(main())
