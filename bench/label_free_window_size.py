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
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_window_size")
SIZES = (1, 2, 3)
CURRENT = 2
TIE = 5e-5


def parse_args(argv=None, doc: str | None = None, out: str = "window-size") -> argparse.Namespace:
    """A window probe's arguments (``doc`` and ``out``: another probe's description and results folder)."""
    from label_free_prf import parse_args as probe_args

    return probe_args(argv, doc or __doc__, out, runs_of=True)


@dataclass(frozen=True)
class WindowProbe:
    """One setting of the window prior varied over ``options`` (``current``: the build's), each option's window
    feature ``setting(option)``: (sentences per window, how a document's windows' cosines pool into one)."""

    name: str  # the bench's file name and JSON's "benchmark"
    key: str  # what an option is called in the JSON ("size", "pool")
    options: tuple
    current: object
    setting: Callable[[object], tuple[int, str]]
    label: Callable[[object], str]  # an option in the table ("window 2", "pool max")


SIZE_PROBE = WindowProbe(
    "label_free_window_size", "size", SIZES, CURRENT, lambda s: (s, "max"), lambda s: f"window {s}"
)
POOLS = ("max", "first+max", "top2")


def pool(sims: np.ndarray, how: str) -> float:
    """A document's window feature from its windows' cosines (in document order): ``max`` the best,
    ``first+max`` the mean of the first and the best, ``top2`` the mean of the two best (one window: itself)."""
    if how == "max":
        return float(sims.max())
    if how == "first+max":
        return float((sims[0] + sims.max()) / 2)
    if how == "top2":
        return float(np.sort(sims)[-2:].mean())
    raise ValueError(f"unknown window pooling {how!r}; known: {POOLS}")


def choose_option(served: dict, among: list[str], options: tuple, current):
    """The option with the largest mean served nDCG@10 over ``among``'s collections (``served[c][o]``: the mean over
    the rankers with option ``o``); ``current`` unless another beats it by more than :data:`TIE`."""
    mean = {o: float(np.mean([served[c][o] for c in among])) for o in options}
    best = max(options, key=lambda o: (mean[o], o == current))
    return best if mean[best] > mean[current] + TIE else current


def choose(served: dict, among: list[str], probe: WindowProbe = SIZE_PROBE):
    """:func:`choose_option` among the probe's options, its current one keeping ties."""
    return choose_option(served, among, probe.options, probe.current)


def collection_rows(args, name: str, probe: WindowProbe = SIZE_PROBE) -> dict:
    """A collection's baselines and, for each option, each variant's served run, its nDCG@10 and the gate."""
    from label_free import label_free_baselines, runs_from
    from label_free_passages import candidates, multi_window, with_neural
    from label_free_prf import served_weights

    from aheadrank.build import MULTI_WINDOW

    variants = [v for _, v in args.neural]
    runs, gates, windows = {}, {}, {}
    base_runs = None
    for option in probe.options:
        size, how = probe.setting(option)
        sized = argparse.Namespace(**{**vars(args), "sentences": size})
        c = candidates(sized, name)
        gates[option] = multi_window(c.collection, size) >= MULTI_WINDOW
        windows[option] = len(c.owner)
        base = c.base(pool=partial(pool, how=how))
        if base_runs is None:
            base_runs = label_free_baselines(base)
            qrels = c.qrels
        for folder, variant in args.neural:
            scored = with_neural(base, c.neural(args.runs_of.get(name, folder), variant))
            runs[(variant, option)] = runs_from(scored, served_weights(variant, gates[option]))
    return probe_rows(qrels, base_runs, runs, variants, probe.options, gates, windows)


def probe_rows(
    qrels, base_runs: dict, runs: dict, variants: list[str], options, gates: dict, windows: dict
) -> dict:
    """A collection's rows for :func:`main`: the baselines' and each (variant, option)'s served nDCG@10 and each
    option's mean over the variants."""
    from aheadrank.evaluation import evaluate

    ndcg = {k: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for k, r in base_runs.items()}
    served = {k: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for k, r in runs.items()}
    return {
        "qrels": qrels,
        "baselines": base_runs,
        "baseline_ndcg": ndcg,
        "runs": runs,
        "served": served,
        "mean": {o: float(np.mean([served[(v, o)] for v in variants])) for o in options},
        "gates": gates,
        "windows": windows,
    }


def main(
    argv=None,
    probe: WindowProbe = SIZE_PROBE,
    doc: str | None = None,
    out: str = "window-size",
    rows_of: Callable = collection_rows,
    extra: Callable | None = None,
) -> int:
    """Run ``probe``: ``rows_of(args, name, probe)`` gives a collection's rows (as :func:`collection_rows`);
    ``extra(args, rows)``, when given, returns more (table lines, JSON fields) to write beside the choice."""
    from label_free import comparison, diff_p, write_zst_run
    from label_free_prf import write_probe

    from aheadrank.evaluation import compare

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv, doc, out)
    t0 = time.perf_counter()
    variants = [v for _, v in args.neural]
    current = probe.current
    rows = {}
    for name in args.collections:
        rows[name] = rows_of(args, name, probe)
        log.info(
            "%s: mean served by %s %s",
            name,
            probe.key,
            {s: round(m, 4) for s, m in rows[name]["mean"].items()},
        )
    means = {c: r["mean"] for c, r in rows.items()}
    results = {}
    lines = [
        f"| collection | run | nDCG@10 | vs better fusion (diff, p) | vs {probe.label(current)} (diff, p) |",
        "|---|---|---:|---|---|",
    ]
    for c, r in rows.items():
        others = [o for o in args.collections if o != c]
        chosen = choose(means, others, probe)
        ndcg = r["baseline_ndcg"]
        best = max(("rrf", "fusion-equal"), key=lambda k: ndcg[k])
        ref = r["baselines"][best]
        out_c = {
            "chosen_on": others,
            probe.key: chosen,
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
            base = r["runs"][(v, current)]
            out_c["runs"][v] = {"served": {str(s): round(r["served"][(v, s)], 4) for s in probe.options}}
            for s in probe.options:
                run = r["runs"][(v, s)]
                vs_fusion = comparison(compare, ref, run, r["qrels"])
                vs_current = comparison(compare, base, run, r["qrels"]) if s != current else None
                mark = " (held out)" if s == chosen else ""
                lines.append(
                    f"| {c} | {v}+priors, {probe.label(s)}{mark} | {r['served'][(v, s)]:.4f} | {diff_p(vs_fusion)} | "
                    f"{diff_p(vs_current) if vs_current else ''} |"
                )
            held = r["runs"][(v, chosen)]
            out_c["runs"][v]["held_out"] = comparison(compare, ref, held, r["qrels"]) | {probe.key: chosen}
            if chosen != current:
                out_c["runs"][v]["held_out_vs_current"] = comparison(compare, base, held, r["qrels"])
            tag = f"{v}_priors_{probe.label(chosen).replace(' ', '').replace('+', '_')}"
            write_zst_run(out_runs / f"{v}+priors+window-heldout.trec.zst", held, tag)
        results[c] = out_c
    default = choose(means, list(args.collections), probe)
    veto = {c: means[c][results[c][probe.key]] >= means[c][current] for c in args.collections}
    adopt = default != current and all(veto.values())
    lines += [
        "",
        f"Mean served nDCG@10 of the three rankers by {probe.key}: "
        + "; ".join(
            f"{c} " + ", ".join(f"{s}: {m:.4f}" for s, m in means[c].items()) for c in args.collections
        ),
        "",
        "Held out: "
        + ", ".join(f"{c} {results[c][probe.key]}" for c in args.collections)
        + f"; over all collections: {default}; no held-out {probe.key} serves worse than {current}: {veto}; "
        f"adopted: {default if adopt else current}",
    ]
    fields = {
        f"{probe.key}s": list(probe.options),
        "results": results,
        "default": default,
        "veto": veto,
        "adopted": adopt,
    }
    if extra is not None:
        more_lines, more_fields = extra(args, rows)
        lines += ["", *more_lines]
        fields |= more_fields
    write_probe(args.out, probe.name, lines, argv, t0, fields)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
