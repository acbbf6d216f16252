"""The label-free MORES start's similarity residual: in the value space it is stored in, or in the states' space.

A label-free MORES 2×IB S2 build serves its untrained start (``rankers.recipe.LABEL_FREE_STEPS`` = 0): a zero score
head and the similarity residual ``α·cos(q̄, d̄)`` (docs/rankers.md), with ``d̄`` the mean over the document of the
last interaction block's cross-attention values ``V·D + b`` (what S2 stores) and ``q̄`` the same value map of the
mean-pooled query carried through the blocks' own layers. That is meant to start "from the base's bi-encoder
similarity", but the value map distorts it: layer 5's value weights of all-MiniLM-L6-v2 have a condition number of
about 3,000. This probe scores the same start in the states' space, ``cos(mean of the query's states, mean of the
document's states D)``, which drops the map (the documents' states still carry segment B's token-type embedding,
so it is not the bi-encoder exactly), beside the value space the build serves. Pure and served: the build's label-free
weights (``aheadrank.build.label_free_weights``, the window prior where at least half the documents are two or more
windows), over each test query's BM25 top 100, long documents read as the build's passages (128 word pieces, a
quarter overlap, ``--aggregation``: the build's ``first+max`` by default).

The rule, fixed in the commit that added this file before any of it was run:

- for a target collection T, the states' space if the mean served nDCG@10 of MORES 2×IB S2 over the other
  collections is higher with it than with the value space by more than ``TIE`` (rounding,
  ``label_free_window_size.TIE``: 5e-5), else the value space;
  T's served and pure scores in its held-out space are compared (paired t-test) with T's better fusion (RRF k = 60
  or the equal-weight fusion), with BM25 (pure) and with the value space;
- the product serves label-free MORES starts in the states' space only if the same choice over all collections picks
  it and no collection serves worse in its held-out space than in the value space (a veto that reads every
  collection's judgments, as ``label_free_bm25_window.py``'s did). S2 stores cannot give ``mean D`` back from the
  stored values (the map is near singular), so adopting it means a stored per-document mean: the probe decides
  whether that is worth building;
- the value space here must give the committed build's pure nDCG@10 (``--check DIR``: the pure run of
  ``DIR/<collection>/runs/mores-2ib-s2.trec.zst``, within 0.002), or the probe's scores are not the build's.

Nothing is built or trained: the passages are encoded by the untrained start itself (float32, not the store's
float16), the BM25, bi-encoder and window features come from ``bench/label_free_passages.py``'s cache.

    .venv/bin/python bench/label_free_sim_space.py --collections cranfield vaswani scifact \\
        --check bench/results/label-free --out bench/results/label-free/sim-space

Writes ``--out``: ``label_free_sim_space.{json,md}`` and ``<collection>/runs/mores-2ib-s2-{values,states}{,+priors}.trec.zst``.
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
log = logging.getLogger("bench.label_free_sim_space")
SPACES = ("values", "states")
VARIANT = "mores-2ib-s2"


def parse_args(argv=None) -> argparse.Namespace:
    from aheadrank.passages import AGGREGATIONS, DEFAULT_AGGREGATION

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["cranfield", "vaswani", "scifact"])
    ap.add_argument("--aggregation", choices=AGGREGATIONS, default=DEFAULT_AGGREGATION)
    ap.add_argument(
        "--check", type=Path, default=None, metavar="DIR", help="committed label-free runs to match"
    )
    ap.add_argument("--base", default=None)
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "label-free" / "sim-space")
    ap.add_argument("--progress", action="store_true")
    args = ap.parse_args(argv)
    if len(args.collections) < 2:
        ap.error("--collections: at least two (each is chosen on the others)")
    args.sentences = 2  # the window prior's windows (aheadrank.build.WINDOW_SENTENCES)
    return args


def choose(served: dict[str, dict[str, float]], among: list[str]) -> str:
    """``states`` where its mean served nDCG@10 over ``among`` beats ``values``'s by more than ``TIE``
    (``label_free_window_size.choose_option``, the window probes' choice)."""
    from label_free_window_size import choose_option

    return choose_option(served, among, SPACES, "values")


def cosines(q: np.ndarray, d: np.ndarray) -> np.ndarray:
    """cos(q, each row of d), as ``F.cosine_similarity`` with eps 1e-6."""
    qn = max(float(np.linalg.norm(q)), 1e-6)
    dn = np.maximum(np.linalg.norm(d, axis=1), 1e-6)
    return (d @ q) / (dn * qn)


def start_ranker(base):
    """The label-free MORES 2×IB S2 start as a build makes it (``rankers.recipe``: the label-free window)."""
    from aheadrank.rankers.recipe import recipe_for

    from aheadrank.build import _variant
    from aheadrank.rerank import QUERY_PIECES

    v = _variant(VARIANT)
    options = recipe_for("cpu").init_options(label_free=True)
    ranker = v.init(base=base, seed=0, **options).float().eval()
    ranker.read_queries_up_to(QUERY_PIECES)  # as the service and the benches read queries (aheadrank.rerank)
    return ranker, v.strategy


def passage_vectors(ranker, texts: list[str], progress: bool):
    """Per passage: the mean of the document states D and the mean of the last block's values over its tokens."""
    import torch
    from aheadrank.rankers.base import masked_mean
    from aheadrank.rankers.text import pad
    from tqdm import tqdm

    seqs = ranker.tokenize_documents(texts)
    states, values = [], []
    value = ranker.ibs[-1].cross.self.value
    with torch.inference_mode():
        for s in tqdm(range(0, len(seqs), 32), disable=not progress, desc="passages", unit="batch"):
            ids, mask = pad(seqs[s : s + 32], ranker.device, ranker._text().pad)
            d = ranker.doc_states(ids, mask)
            states.append(masked_mean(d, mask).numpy())
            values.append(masked_mean(value(d), mask).numpy())
    return np.concatenate(states), np.concatenate(values)


def query_vectors(ranker, texts: list[str], through_blocks: bool = True):
    """Per query: the mean of its states through the blocks' own layers (``through_blocks``; else the query
    encoder's states, at the depth of the document states), and that mean through the value map."""
    import torch
    from aheadrank.rankers.base import masked_mean
    from aheadrank.rankers.blocks import key_mask
    from aheadrank.rankers.text import pad

    out_s, out_v = [], []
    value = ranker.ibs[-1].cross.self.value
    with torch.inference_mode():
        for t in texts:
            ids, mask = pad(ranker.tokenize_queries([t]), ranker.device, ranker._text().pad)
            x = ranker.query_states(ids, mask)
            for ib in ranker.ibs if through_blocks else ():
                x = ib.layer(x, key_mask(mask))
            m = masked_mean(x, mask)
            out_s.append(m[0].numpy())
            out_v.append(value(m)[0].numpy())
    return np.stack(out_s), np.stack(out_v)


def encoded_passages(args, collection: Path, ranker, docids: list[str]):
    """(mean states, mean values, owner) of ``docids``' passages as the build splits them (the ranker's window, a
    quarter overlap), encoded by ``ranker`` and cached in ``args.workdir``."""
    from aheadrank.indexer.collections import Collection
    from benchkit import digest

    from aheadrank.passages import PassageOptions, effective_overlap, split_passages

    name = collection.name
    window = int(ranker._text().max_doc_len)
    opts = PassageOptions(window, effective_overlap(window, None))
    cache = args.workdir / f"sim-space-{name}-{digest([docids, VARIANT, str(args.base)])}.npz"
    if cache.exists():
        z = np.load(cache)
        d_states, d_values, owner = z["states"], z["values"], z["owner"]
    else:
        want = set(docids)
        texts = {d.docid: d.text for d in Collection(collection) if d.docid in want}
        t0 = time.perf_counter()
        parts = []
        for s in range(0, len(docids), 256):
            group = docids[s : s + 256]
            parts.extend(split_passages(ranker._text().tokenizer, [texts[d] for d in group], opts))
        flat = [p for ps in parts for p in ps]
        owner = np.asarray([i for i, ps in enumerate(parts) for _ in ps])
        d_states, d_values = passage_vectors(ranker, flat, args.progress)
        log.info(
            "%s: %d documents, %d passages encoded in %.0f s",
            name,
            len(docids),
            len(flat),
            time.perf_counter() - t0,
        )
        args.workdir.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp.npz")
        np.savez(tmp, states=d_states, values=d_values, owner=owner)
        tmp.replace(cache)
    return d_states, d_values, owner


def collection_rows(args, name: str, ranker) -> dict:
    from benchkit import eval_topics
    from label_free import label_free_baselines, runs_from
    from label_free_passages import candidates, multi_window, with_neural
    from label_free_prf import served_weights

    from aheadrank.build import MULTI_WINDOW
    from aheadrank.evaluation import evaluate, read_run
    from aheadrank.passages import aggregate

    c = candidates(args, name)
    queries, _ = eval_topics(c.collection, "test", None)
    gate = multi_window(c.collection, args.sentences) >= MULTI_WINDOW
    docids = sorted(c.row_of)
    d_states, d_values, owner = encoded_passages(args, c.collection, ranker, docids)
    q_states, q_values = query_vectors(ranker, [queries[q] for q in c.qids])
    index = {d: i for i, d in enumerate(docids)}
    rows_of: list[list[int]] = [[] for _ in docids]
    for p, i in enumerate(owner.tolist()):
        rows_of[i].append(p)
    base, neural = c.base(), {s: {} for s in SPACES}
    for k, (q, f) in enumerate(base):
        rows = [r for d in f.docids for r in rows_of[index[d]]]
        own = [j for j, d in enumerate(f.docids) for _ in rows_of[index[d]]]
        for space, qv, dv in (("values", q_values, d_values), ("states", q_states, d_states)):
            per = aggregate(cosines(qv[k], dv[rows]).tolist(), own, len(f.docids), args.aggregation)
            neural[space][q] = np.asarray(per, dtype=np.float64)
    runs = label_free_baselines(base)
    w = served_weights(VARIANT, gate)
    for space in SPACES:
        scored = with_neural(base, neural[space])
        runs[f"{VARIANT}-{space}"] = runs_from(scored, {"neural": 1.0})
        runs[f"{VARIANT}-{space}+priors"] = runs_from(scored, w)
    ndcg = {k: evaluate(r, c.qrels, ("nDCG@10",))["nDCG@10"] for k, r in runs.items()}
    check = None
    if args.check is not None:
        source = args.check / name / "runs" / f"{VARIANT}.trec.zst"
        committed = evaluate(read_run(source), c.qrels, ("nDCG@10",))["nDCG@10"]
        check = {
            "run": str(source),
            "ndcg10": round(committed, 4),
            "values": round(ndcg[f"{VARIANT}-values"], 4),
        }
        if abs(committed - ndcg[f"{VARIANT}-values"]) > 0.002:
            raise SystemExit(
                f"{name}: the value space gives {ndcg[f'{VARIANT}-values']:.4f} pure, the committed build "
                f"{committed:.4f} ({source}): the probe's scores are not the build's"
            )
    served = {s: ndcg[f"{VARIANT}-{s}+priors"] for s in SPACES}
    return {"qrels": c.qrels, "runs": runs, "ndcg": ndcg, "served": served, "gate": gate, "check": check}


def held_out_probe(
    args,
    argv,
    rows: dict,
    options: tuple,
    current: str,
    bench: str,
    *,
    key: str = "option",
    baselines: tuple = ("bm25", "bi-encoder", "rrf", "fusion-equal"),
    pure_of: dict | None = None,
    fields: dict | None = None,
) -> int:
    """Choose each collection's option on the other collections' served scores (``choose_option``: ``current``
    unless another beats it by more than ``TIE``), print and write the table, the JSON (``bench``.{md,json}) and
    each collection's runs. ``rows[c]``: ``qrels``, ``runs`` and ``ndcg`` (the baselines, ``VARIANT-<option>`` pure
    where ``pure_of`` maps an option to itself, ``VARIANT-<option>+priors`` served), ``served`` ({option: nDCG@10}),
    ``gate``, ``check`` and any more fields for the JSON under ``extra``. The product takes the choice over all
    collections only if it is not ``current`` and no collection serves worse at its held-out option than at
    ``current``."""
    from label_free import comparison, diff_p, write_zst_run
    from label_free_prf import write_probe
    from label_free_window_size import choose_option

    from aheadrank.evaluation import compare

    t0 = args.started
    pure_of = pure_of or {o: o for o in options}
    served = {c: r["served"] for c, r in rows.items()}
    results = {}
    lines = [
        "| collection | run | nDCG@10 | vs better fusion (diff, p) | vs BM25 (diff, p) | "
        f"vs `{current}` (diff, p) |",
        "|---|---|---:|---|---|---|",
    ]
    for c, r in rows.items():
        others = [o for o in args.collections if o != c]
        option = choose_option(served, others, options, current)
        ndcg, runs, qrels = r["ndcg"], r["runs"], r["qrels"]
        best = max(("rrf", "fusion-equal"), key=lambda k: ndcg[k])
        out = {
            "chosen_on": others,
            key: option,
            "window_prior": r["gate"],
            "check": r["check"],
            **r.get("extra", {}),
            "better_fusion": best,
            "ndcg10": {k: round(v, 4) for k, v in ndcg.items()},
            "held_out": {},
        }
        for k in baselines:
            x = comparison(compare, runs[best], runs[k], qrels) if k != best else None
            lines.append(f"| {c} | {k} | {ndcg[k]:.4f} | {diff_p(x) if x else '(better)'} | | |")
        out_runs = args.out / c / "runs"
        out_runs.mkdir(parents=True, exist_ok=True)
        for o in options:
            for suffix in ("", "+priors"):
                name = f"{VARIANT}-{o}{suffix}"
                if suffix == "" and pure_of[o] != o:
                    continue  # serves another option's pure score
                mark = " (held out)" if o == (option if suffix else pure_of[option]) else ""
                vs_f = comparison(compare, runs[best], runs[name], qrels)
                vs_b = comparison(compare, runs["bm25"], runs[name], qrels)
                vs_c = (
                    comparison(compare, runs[f"{VARIANT}-{current}{suffix}"], runs[name], qrels)
                    if o != current
                    else None
                )
                lines.append(
                    f"| {c} | {name}{mark} | {ndcg[name]:.4f} | {diff_p(vs_f)} | {diff_p(vs_b)} | "
                    f"{diff_p(vs_c) if vs_c else ''} |"
                )
                if mark:
                    out["held_out"][suffix or "pure"] = {
                        "run": name,
                        "vs_fusion": vs_f,
                        "vs_bm25": vs_b,
                        f"vs_{current}": vs_c,
                    }
                write_zst_run(out_runs / f"{name}.trec.zst", runs[name], name.replace("+", "_"))
        results[c] = out
    default = choose_option(served, list(args.collections), options, current)
    veto = {c: served[c][results[c][key]] >= served[c][current] for c in args.collections}
    adopted = default if default != current and all(veto.values()) else current
    lines += [
        "",
        f"Served nDCG@10 ({' / '.join(options)}): "
        + "; ".join(f"{c} " + " / ".join(f"{served[c][o]:.4f}" for o in options) for c in args.collections),
        "",
        "Held out: "
        + ", ".join(f"{c} {results[c][key]}" for c in args.collections)
        + f"; over all collections: {default}; no held-out {key} serves worse than {current}: {veto}; "
        f"adopted: {adopted}",
    ]
    fields = {
        "aggregation": args.aggregation,
        **(fields or {}),
        "results": results,
        "default": default,
        "veto": veto,
        "adopted": adopted,
    }
    write_probe(args.out, bench, lines, argv, t0, fields)
    return 0


def start_probe(argv, parse, rows_of) -> tuple:
    """A residual probe's start: logging, ``args = parse(argv)`` (its start time in ``args.started``), the
    label-free start, and each collection's rows ``rows_of(args, name, ranker)``, logged as they come."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse(argv)
    args.started = time.perf_counter()
    ranker, _ = start_ranker(args.base)
    rows = {}
    for name in args.collections:
        rows[name] = rows_of(args, name, ranker)
        log.info("%s: %s", name, {k: round(v, 4) for k, v in rows[name]["ndcg"].items()})
    return args, rows


def main(argv=None) -> int:
    args, rows = start_probe(argv, parse_args, collection_rows)
    return held_out_probe(args, argv, rows, SPACES, "values", "label_free_sim_space", key="space")


if __name__ == "__main__":
    raise SystemExit(main())
