"""A new label-free signal for the served score: BM25's best sentence window.

Where documents are several sentences, the label-free served score already weighs the bi-encoder's best
2-sentence window (``window``) beside its cosine with the whole document. Its lexical twin is missing: BM25 scores a
document as one bag of words, so a document whose query words sit together in two sentences scores as one that
scatters them over its abstract (Callan 1994; Dai & Callan's BM25 passage baselines). ``bm25window`` is each
document's best window (the same windows: ``indexer.pseudo_queries.sentence_passages``, title in front) under
BM25 with the collection's own statistics, as Lucene scores it: Anserini's analyzer, ``idf = ln(1 + (N - df +
0.5) / (df + 0.5))`` from the index, ``tf / (tf + k1 (1 - b + b len / avgdl))`` with the index's k1 and b and
its average document length, a query word counted as often as the query has it.

The rule, fixed in the commit that added this file before any of it was run:

- the feature joins the served score at BM25's weight, the weights normalised to sum 1 (as the window prior joined
  at the bi-encoder's), only where the window prior is on (at least half the documents two or more windows);
  elsewhere the served score is unchanged;
- for a target collection T: on if, over the other collections where it would change anything, the mean over
  the three rankers of (served with it − served without it) is > 0; off where no other collection has windows.
  T's served score is compared (paired t-test) with T's better fusion and with T's served score without it;
- the product adopts it only if the same test over all collections says on, and no collection serves worse
  (mean over the three rankers) at its held-out choice than without it (a veto that reads every collection's judgments, which the docs say).

Also shown: the label-free fusion of BM25, the bi-encoder and the two windows (1/4 each; no neural score), which
a user could assemble too.

Nothing is built or trained; the windows' texts are cut from the collection, the bi-encoder's vectors come from
``bench/label_free_passages.py``'s cache, the neural scores from committed label-free builds' pure runs.

    .venv/bin/python bench/label_free_bm25_window.py --collections scifact cranfield vaswani \\
        --neural bench/results/label-free:mores-2ib-s2 bench/results/label-free:prettr-l5-e128 \\
                 bench/results/label-free:tk-6l-base --out bench/results/label-free/bm25-window

Writes ``--out``: ``label_free_bm25_window.{json,md}`` and ``<collection>/runs/VARIANT+priors+bm25window.trec.zst``
(the held-out choice's served run).
"""

from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_bm25_window")
FOUR_WAY = {"bm25": 0.25, "dense": 0.25, "window": 0.25, "bm25window": 0.25}


def parse_args(argv=None) -> argparse.Namespace:
    from label_free_prf import parse_args as probe_args

    return probe_args(argv, __doc__, "bm25-window")


def bm25_text(
    query: Counter, terms: Counter, idf: dict[str, float], avgdl: float, k1: float, b: float
) -> float:
    """Lucene's BM25 (no ``k1 + 1`` factor) of one analysed text for an analysed query (word -> count)."""
    norm = k1 * (1 - b + b * sum(terms.values()) / avgdl)
    return sum(n * idf.get(t, 0.0) * terms[t] / (terms[t] + norm) for t, n in query.items() if terms.get(t))


def with_bm25_window(weights: dict[str, float]) -> dict[str, float]:
    """``weights`` with ``bm25window`` at BM25's weight, normalised to sum 1."""
    w = {**weights, "bm25window": weights["bm25"]}
    total = sum(w.values())
    return {k: v / total for k, v in w.items()}


def choose(gains: dict[str, float | None], among: list[str]) -> bool:
    """On where the mean gain over ``among``'s collections that have windows (gain not None) is > 0."""
    got = [gains[c] for c in among if gains[c] is not None]
    return bool(got) and float(np.mean(got)) > 0


def lexical(index: Path):
    """(analyse(text) -> Counter, idf(word), avgdl, k1, b) from the collection's Lucene index."""
    from aheadrank.indexer.bm25 import DEFAULT_B, DEFAULT_K1, configure_java, read_index_meta

    configure_java()
    from pyserini.analysis import Analyzer, get_lucene_analyzer
    from pyserini.index.lucene import LuceneIndexReader

    analyzer = Analyzer(get_lucene_analyzer())
    reader = LuceneIndexReader(str(index))
    stats = reader.stats()
    n, avgdl = stats["documents"], stats["total_terms"] / max(stats["documents"], 1)
    meta = read_index_meta(index)
    cache: dict[str, float] = {}

    def idf(word: str) -> float:
        if word not in cache:
            df, _ = reader.get_term_counts(word, analyzer=None)
            cache[word] = math.log(1 + (n - df + 0.5) / (df + 0.5))
        return cache[word]

    return (
        lambda text: Counter(analyzer.analyze(text)),
        idf,
        avgdl,
        float(meta.get("k1", DEFAULT_K1)),
        float(meta.get("b", DEFAULT_B)),
    )


def collection_rows(args, name: str) -> dict:
    from aheadrank.indexer.collections import Collection
    from aheadrank.indexer.pseudo_queries import sentence_passages
    from benchkit import Bm25Hits, eval_topics
    from label_free import label_free_baselines, runs_from
    from label_free_passages import candidates, multi_window, with_neural
    from label_free_prf import served_weights

    from aheadrank.build import MULTI_WINDOW
    from aheadrank.evaluation import evaluate

    c = candidates(args, name)
    queries, _ = eval_topics(c.collection, "test", None)
    analyse, idf, avgdl, k1, b = lexical(Bm25Hits(c.collection, args.workdir, args.progress).index)
    texts = {d: (t, body) for d, t, body in Collection(c.collection).titled() if d in c.row_of}
    t0 = time.perf_counter()
    windows = {d: [analyse(w) for w in sentence_passages(*texts[d], size=args.sentences)] for d in c.row_of}
    log.info(
        "%s: %d windows analysed in %.0f s", name, sum(map(len, windows.values())), time.perf_counter() - t0
    )
    gate = multi_window(c.collection, args.sentences) >= MULTI_WINDOW
    base = c.base()
    for q, f in base:
        words = analyse(queries[q])
        qidf = {t: idf(t) for t in words}
        f.features["bm25window"] = np.array(
            [max(bm25_text(words, w, qidf, avgdl, k1, b) for w in windows[d]) for d in f.docids],
            dtype=np.float64,
        )
    runs = label_free_baselines(base)
    runs["fusion-windows"] = runs_from(base, FOUR_WAY)
    for folder, variant in args.neural:
        scored = with_neural(base, c.neural(folder, variant))
        w = served_weights(variant, gate)
        runs[f"{variant}+priors"] = runs_from(scored, w)
        runs[f"{variant}+priors+bm25window"] = runs_from(scored, with_bm25_window(w) if gate else w)
    ndcg = {k: evaluate(r, c.qrels, ("nDCG@10",))["nDCG@10"] for k, r in runs.items()}
    variants = [v for _, v in args.neural]
    gain = (
        float(np.mean([ndcg[f"{v}+priors+bm25window"] - ndcg[f"{v}+priors"] for v in variants]))
        if gate
        else None
    )
    return {"qrels": c.qrels, "runs": runs, "ndcg": ndcg, "gate": gate, "gain": gain, "avgdl": avgdl}


def main(argv=None) -> int:
    from label_free import comparison, diff_p, write_zst_run
    from label_free_prf import write_probe

    from aheadrank.evaluation import compare

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    t0 = time.perf_counter()
    variants = [v for _, v in args.neural]
    rows = {}
    for name in args.collections:
        rows[name] = collection_rows(args, name)
        log.info("%s: %s", name, {k: round(v, 4) for k, v in rows[name]["ndcg"].items()})
    gains = {c: r["gain"] for c, r in rows.items()}
    results = {}
    lines = [
        "| collection | run | nDCG@10 | vs better fusion (diff, p) | vs without bm25window (diff, p) |",
        "|---|---|---:|---|---|",
    ]
    for c, r in rows.items():
        others = [o for o in args.collections if o != c]
        on = choose(gains, others)
        best = max(("rrf", "fusion-equal"), key=lambda k: r["ndcg"][k])
        ref = r["runs"][best]
        out = {
            "window_prior": r["gate"],
            "chosen_on": others,
            "on": on,
            "gain_mean_three_rankers": None if r["gain"] is None else round(r["gain"], 4),
            "better_fusion": best,
            "ndcg10": {k: round(v, 4) for k, v in r["ndcg"].items()},
            "runs": {},
        }
        for k in ("bm25", "bi-encoder", "rrf", "fusion-equal", "fusion-windows"):
            x = comparison(compare, ref, r["runs"][k], r["qrels"]) if k != best else None
            lines.append(f"| {c} | {k} | {r['ndcg'][k]:.4f} | {diff_p(x) if x else '(better)'} | |")
        out_runs = args.out / c / "runs"
        out_runs.mkdir(parents=True, exist_ok=True)
        for v in variants:
            plain = r["runs"][f"{v}+priors"]
            chosen = r["runs"][f"{v}+priors+bm25window"] if on else plain
            out["runs"][v] = {
                "priors": round(r["ndcg"][f"{v}+priors"], 4),
                "with_bm25window": round(r["ndcg"][f"{v}+priors+bm25window"], 4),
                "held_out_choice": comparison(compare, ref, chosen, r["qrels"]) | {"on": on},
                "with_vs_without": comparison(
                    compare, plain, r["runs"][f"{v}+priors+bm25window"], r["qrels"]
                ),
            }
            o = out["runs"][v]
            lines.append(
                f"| {c} | {v}+priors | {o['priors']:.4f} | {diff_p(comparison(compare, ref, plain, r['qrels']))} | |"
            )
            lines.append(
                f"| {c} | {v}+priors+bm25window | {o['with_bm25window']:.4f} | "
                f"{diff_p(comparison(compare, ref, r['runs'][f'{v}+priors+bm25window'], r['qrels']))} | "
                f"{diff_p(o['with_vs_without'])} |"
            )
            write_zst_run(out_runs / f"{v}+priors+bm25window.trec.zst", chosen, f"{v}_priors_bm25window")
        results[c] = out
    default = choose(gains, list(args.collections))
    veto = {c: (not results[c]["on"]) or gains[c] >= 0 for c in args.collections}
    adopt = default and all(veto.values())
    lines += [
        "",
        "Mean gain of the three rankers' served score with bm25window (where the window prior is on): "
        + ", ".join(f"{c} {'n/a' if g is None else f'{g:+.4f}'}" for c, g in gains.items()),
        "",
        "Held out: "
        + ", ".join(f"{c} {'on' if r['on'] else 'off'}" for c, r in results.items())
        + f"; over all "
        f"collections: {'on' if default else 'off'}; no held-out choice serves worse: {veto}; adopted: {adopt}",
    ]
    fields = {"results": results, "default_on": default, "veto": veto, "adopted": adopt}
    write_probe(args.out, "label_free_bm25_window", lines, argv, t0, fields)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
