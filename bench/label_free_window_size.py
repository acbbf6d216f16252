"""The window prior's size, chosen on other collections: windows of 1, 2 or 3 sentences.

The label-free served score weighs the bi-encoder's best window of a document (``window``: 2 consecutive sentences,
title in front; ``aheadrank.build.WINDOW_SENTENCES``). The 2 was fixed before anything was measured and never
varied. A single sentence matches a query that paraphrases one sentence (SciFact's claims; Cranfield's questions
about one result of a paper) more closely; three give the bi-encoder more context. This probe measures the three
sizes side by side on the current label-free defaults' pure runs.

The rule, fixed in the commit that added this file before any of it was run:

- at each size ``s`` in ``SIZES`` a collection's served score is the build's: the window prior at ``s`` joins the
  served score (``aheadrank.build.label_free_weights(kind, window=True)``) where at least half of the collection's
  documents are two or more windows of ``s`` sentences (``aheadrank.build.multi_window``), else the served score
  without it (so a collection with no sentence breaks, Vaswani, is the same at every size);
- for a target collection T the size is chosen on the other collections: the size with the largest mean, over the
  other collections and the three rankers, of served nDCG@10; a size other than the current 2 only if its mean is
  larger than 2's by more than ``TIE`` (rounding), else 2. T's served score at its held-out size is compared
  (paired t-test) with T's better fusion (RRF k = 60 or the equal-weight fusion) and with T's served score at 2;
- the product changes ``WINDOW_SENTENCES`` only if the same choice over all collections picks another size and no
  collection serves worse (mean over the three rankers) at its held-out size than at 2: a veto that reads every
  collection's judgments, as ``label_free_bm25_window.py``'s did; the docs say so.

Nothing is built or trained; the windows are cut from the collection and embedded by the bi-encoder (cached by
``bench/label_free_passages.py``'s ``embeddings`` per size), the neural scores come from committed label-free
builds' pure runs.

    .venv/bin/python bench/label_free_window_size.py --collections cranfield scifact vaswani \\
        --neural bench/results/label-free:mores-2ib-s2 bench/results/label-free:prettr-l5-e128 \\
                 bench/results/label-free:tk-6l-base --out bench/results/label-free/window-size

``--runs-of COLLECTION=DIR`` reads a collection's pure runs from another folder: SciFact's with MaxP passages, free of
the ``first+max`` choice made on its judgments (``--runs-of scifact=bench/results/label-free/maxp-scifact``).

Writes ``--out``: ``label_free_window_size.{json,md}`` and ``<collection>/runs/VARIANT+priors+window-heldout.trec.zst``
(the served run at the held-out size).
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
log = logging.getLogger("bench.label_free_window_size")
SIZES = (1, 2, 3)
CURRENT = 2
TIE = 5e-5


def parse_args(argv=None) -> argparse.Namespace:
    from label_free_prf import parse_args as probe_args

    return probe_args(argv, __doc__, "window-size", runs_of=True)


def choose(served: dict[str, dict[int, float]], among: list[str]) -> int:
    """The size with the largest mean served nDCG@10 over ``among``'s collections (``served[c][s]``: the mean over
    the rankers at size ``s``); :data:`CURRENT` unless another beats it by more than :data:`TIE`."""
    mean = {s: float(np.mean([served[c][s] for c in among])) for s in SIZES}
    best = max(SIZES, key=lambda s: (mean[s], s == CURRENT))
    return best if mean[best] > mean[CURRENT] + TIE else CURRENT


def collection_rows(args, name: str) -> dict:
    """A collection's baselines and, at each size, each variant's served run, its nDCG@10 and the gate."""
    from label_free import label_free_baselines, runs_from
    from label_free_passages import candidates, multi_window, neural_scores
    from label_free_prf import served_weights

    from aheadrank.build import MULTI_WINDOW
    from aheadrank.evaluation import evaluate, read_run
    from aheadrank.priors import QueryFeatures

    variants = [v for _, v in args.neural]
    runs, gates, windows = {}, {}, {}
    base_runs = None
    for size in SIZES:
        sized = argparse.Namespace(**{**vars(args), "sentences": size})
        c = candidates(sized, name)
        gates[size] = multi_window(c.collection, size) >= MULTI_WINDOW
        windows[size] = len(c.owner)
        feats = []
        for q in c.qids:
            ds = [d for d, _ in c.cands[q]]
            sims = c.passages @ c.qv[q]
            feats.append(
                (
                    q,
                    {
                        "bm25": np.array([s for _, s in c.cands[q]], dtype=np.float64),
                        "dense": np.array([c.docs[d] @ c.qv[q] for d in ds], dtype=np.float64),
                        "window": np.array([sims[c.rows_of[c.row_of[d]]].max() for d in ds]),
                    },
                    ds,
                )
            )
        if base_runs is None:
            plain = [
                (q, QueryFeatures(ds, {k: f[k] for k in ("bm25", "dense")}, c.qrels.get(q, {})))
                for q, f, ds in feats
            ]
            base_runs = label_free_baselines(plain)
            qrels = c.qrels
        for folder, variant in args.neural:
            folder = args.runs_of.get(name, folder)
            source = folder / name / "runs" / f"{variant}.trec.zst"
            if not source.exists():
                raise SystemExit(f"--neural {folder}:{variant}: no {source}")
            neural = neural_scores(read_run(source), c.cands, c.qids, source)
            with_neural = [
                (q, QueryFeatures(ds, {**f, "neural": neural[q]}, c.qrels.get(q, {}))) for q, f, ds in feats
            ]
            runs[(variant, size)] = runs_from(with_neural, served_weights(variant, gates[size]))
    ndcg = {k: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for k, r in {**base_runs}.items()}
    served = {k: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for k, r in runs.items()}
    mean = {s: float(np.mean([served[(v, s)] for v in variants])) for s in SIZES}
    return {
        "qrels": qrels,
        "baselines": base_runs,
        "baseline_ndcg": ndcg,
        "runs": runs,
        "served": served,
        "mean": mean,
        "gates": gates,
        "windows": windows,
    }


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
        log.info("%s: mean served by size %s", name, {s: round(m, 4) for s, m in rows[name]["mean"].items()})
    means = {c: r["mean"] for c, r in rows.items()}
    results = {}
    lines = [
        "| collection | run | nDCG@10 | vs better fusion (diff, p) | vs 2 sentences (diff, p) |",
        "|---|---|---:|---|---|",
    ]
    for c, r in rows.items():
        others = [o for o in args.collections if o != c]
        size = choose(means, others)
        ndcg = r["baseline_ndcg"]
        best = max(("rrf", "fusion-equal"), key=lambda k: ndcg[k])
        ref = r["baselines"][best]
        out = {
            "chosen_on": others,
            "size": size,
            "window_prior": {str(s): g for s, g in r["gates"].items()},
            "windows_of_candidates": {str(s): n for s, n in r["windows"].items()},
            "mean_served_three_rankers": {str(s): round(m, 4) for s, m in r["mean"].items()},
            "better_fusion": best,
            "baselines": {k: round(v, 4) for k, v in ndcg.items()},
            "runs": {},
        }
        for k in ("bm25", "bi-encoder", "rrf", "fusion-equal"):
            x = comparison(compare, ref, r["baselines"][k], r["qrels"]) if k != best else None
            lines.append(f"| {c} | {k} | {ndcg[k]:.4f} | {diff_p(x) if x else '(better)'} | |")
        out_runs = args.out / c / "runs"
        out_runs.mkdir(parents=True, exist_ok=True)
        for v in variants:
            current = r["runs"][(v, CURRENT)]
            out["runs"][v] = {"served": {str(s): round(r["served"][(v, s)], 4) for s in SIZES}}
            for s in SIZES:
                run = r["runs"][(v, s)]
                vs_fusion = comparison(compare, ref, run, r["qrels"])
                vs_current = comparison(compare, current, run, r["qrels"]) if s != CURRENT else None
                mark = " (held out)" if s == size else ""
                lines.append(
                    f"| {c} | {v}+priors, window {s}{mark} | {r['served'][(v, s)]:.4f} | {diff_p(vs_fusion)} | "
                    f"{diff_p(vs_current) if vs_current else ''} |"
                )
            held = r["runs"][(v, size)]
            out["runs"][v]["held_out"] = comparison(compare, ref, held, r["qrels"]) | {"size": size}
            if size != CURRENT:
                out["runs"][v]["held_out_vs_current"] = comparison(compare, current, held, r["qrels"])
            write_zst_run(out_runs / f"{v}+priors+window-heldout.trec.zst", held, f"{v}_priors_window{size}")
        results[c] = out
    default = choose(means, list(args.collections))
    veto = {c: means[c][results[c]["size"]] >= means[c][CURRENT] for c in args.collections}
    adopt = default != CURRENT and all(veto.values())
    lines += [
        "",
        "Mean served nDCG@10 of the three rankers by window size: "
        + "; ".join(
            f"{c} " + ", ".join(f"{s}: {m:.4f}" for s, m in means[c].items()) for c in args.collections
        ),
        "",
        "Held out: "
        + ", ".join(f"{c} {results[c]['size']}" for c in args.collections)
        + f"; over all collections: {default}; no held-out size serves worse than {CURRENT}: {veto}; "
        f"adopted: {default if adopt else CURRENT}",
    ]
    fields = {"sizes": list(SIZES), "results": results, "default": default, "veto": veto, "adopted": adopt}
    write_probe(args.out, "label_free_window_size", lines, argv, t0, fields)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
