"""Reranking deeper than BM25's top 100: the served score over its top 200, chosen leave-one-collection-out.

``bench/label_free_depth.py`` found the served score falls at every depth below 100 (on all three collections), so
the next question is whether it rises above 100. The committed label-free runs hold the neural scores of BM25's top
100 only, so depth 200 needs the builds themselves: ``bench/label_free.py --depth 200`` and, from the same builds
(the depth is not a setting of the build), ``bench/label_free.py --depth 100`` into another folder. This script
reads both folders (``label_free.json`` and ``<collection>/runs/``) and applies ``bench/label_free_prf.py``'s rule
to the rankers both measured. The rule, fixed in the commit that added this file, before either run:

- for a target collection T: depth 200 if, over the other collections, the mean of (served nDCG@10 at 200 minus
  that collection's better of RRF and the equal-weight fusion at 100), averaged over the rankers, is larger than
  the same at 100; ties go to 100. T's served score at its depth is compared (paired t-test) with T's better fusion
  at 100 and with T's served score at 100;
- the service's default depth changes only if the all-collections choice is 200 and no collection serves worse
  (mean over the rankers) at its held-out depth than at 100 (a veto that reads every collection's judgments).

The baselines at 200 (RRF and the equal-weight fusion over the same 200 candidates) are shown beside, because a
user could rerank deeper too.

    .venv/bin/python bench/label_free.py --collections scifact cranfield vaswani --rankers mores-2ib-s2 \\
        --depth 200 --out bench/results/label-free/deeper/depth200 --no-progress
    .venv/bin/python bench/label_free.py --collections scifact cranfield vaswani --rankers mores-2ib-s2 \\
        --depth 100 --out bench/results/label-free/deeper/depth100 --no-progress
    .venv/bin/python bench/label_free_deeper.py bench/results/label-free/deeper/depth200 \\
        bench/results/label-free/deeper/depth100 --out bench/results/label-free/deeper

Writes ``--out``: ``label_free_deeper.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_deeper")
SHALLOW, DEEP = 100, 200


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("deep", type=Path, help=f"bench/label_free.py --depth {DEEP}'s --out")
    ap.add_argument(
        "shallow", type=Path, help=f"bench/label_free.py --depth {SHALLOW}'s --out (the same builds)"
    )
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "label-free" / "deeper")
    return ap.parse_args(argv)


def read_bench(folder: Path, depth: int) -> dict[str, dict]:
    """{collection: its result} of a ``bench/label_free.py`` run at ``depth``; another depth is an error."""
    path = folder / "label_free.json"
    if not path.is_file():
        raise SystemExit(
            f"{folder}: no label_free.json (run bench/label_free.py --depth {depth} --out {folder})"
        )
    results = json.loads(path.read_text())["results"]
    out = {}
    for r in results:
        if r.get("depth", SHALLOW) != depth:
            raise SystemExit(
                f"{path}: {r['collection']} was reranked to depth {r.get('depth', SHALLOW)}, not {depth}"
            )
        out[r["collection"]] = r
    return out


def served(result: dict, variant: str) -> float:
    return result["variants"][variant]["runs"][f"{variant}+priors"]["ndcg10"]


def choose(margins: dict[str, dict[int, float]], among: list[str]) -> int:
    """The depth with the larger mean margin over ``among``; a tie goes to the shallower
    (:func:`label_free_prf.choose` over the two depths)."""
    from label_free_prf import Grid
    from label_free_prf import choose as choose_point

    depths = Grid((SHALLOW, DEEP), SHALLOW, str, "deeper reranking", "deeper")
    return choose_point(margins, among, depths)


def margins_of(deep: dict, shallow: dict) -> tuple[list[str], list[str], dict[str, dict[int, float]], dict]:
    """(collections, rankers, {collection: {depth: mean served minus the better fusion at 100}}, {collection: that
    fusion's name}) over what both runs measured."""
    collections = [c for c in shallow if c in deep]
    if len(collections) < 2:
        raise SystemExit(
            "need at least two collections measured at both depths (each is chosen on the others)"
        )
    rankers = sorted(
        set.intersection(*(set(deep[c]["variants"]) & set(shallow[c]["variants"]) for c in collections))
    )
    if not rankers:
        raise SystemExit("no ranker was measured at both depths")
    best = {c: max(("rrf", "fusion-equal"), key=shallow[c]["baselines"].get) for c in collections}
    margins = {
        c: {
            d: float(np.mean([served(r[c], v) for v in rankers])) - shallow[c]["baselines"][best[c]]
            for d, r in ((SHALLOW, shallow), (DEEP, deep))
        }
        for c in collections
    }
    return collections, rankers, margins, best


def main(argv=None) -> int:
    import time

    from benchkit import eval_topics
    from label_free import comparison, diff_p
    from label_free_prf import write_probe

    from aheadrank.evaluation import compare, read_run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    t0 = time.perf_counter()
    args = parse_args(argv)
    deep, shallow = read_bench(args.deep, DEEP), read_bench(args.shallow, SHALLOW)
    collections, rankers, margins, best = margins_of(deep, shallow)
    lines = [
        f"| collection | run | top {SHALLOW} | top {DEEP} | chosen depth | served vs better fusion at {SHALLOW} "
        f"(diff, p) | vs top {SHALLOW} (diff, p) |",
        "|---|---|---:|---:|---|---|---|",
    ]
    results = {}
    for c in collections:
        others = [o for o in collections if o != c]
        depth = choose(margins, others)
        _, qrels = eval_topics(args.data / c, "test", None)

        def run(folder: Path, name: str, c=c):
            return read_run(folder / c / "runs" / f"{name}.trec.zst")

        ref = run(args.shallow, best[c])
        row = {"chosen_on": others, "depth": depth, "better_fusion": best[c], "runs": {}}
        for name in ("rrf", "fusion-equal", *(f"{v}+priors" for v in rankers)):
            at = {SHALLOW: run(args.shallow, name), DEEP: run(args.deep, name)}
            score = {
                d: (
                    r[c]["baselines"][name] if name in r[c]["baselines"] else served(r[c], name.split("+")[0])
                )
                for d, r in ((SHALLOW, shallow), (DEEP, deep))
            }
            chosen = at[depth]
            row["runs"][name] = {
                str(SHALLOW): round(score[SHALLOW], 4),
                str(DEEP): round(score[DEEP], 4),
                "vs_better_fusion": comparison(compare, ref, chosen, qrels),
                "vs_shallow": comparison(compare, at[SHALLOW], chosen, qrels),
            }
            r = row["runs"][name]
            lines.append(
                f"| {c} | {name} | {r[str(SHALLOW)]:.4f} | {r[str(DEEP)]:.4f} | {depth} | "
                f"{diff_p(r['vs_better_fusion'])} | {diff_p(r['vs_shallow'])} |"
            )
        results[c] = row
    default = choose(margins, collections)
    veto = {c: margins[c][results[c]["depth"]] >= margins[c][SHALLOW] for c in collections}
    adopt = default == DEEP and all(veto.values())
    lines += [
        "",
        "Mean served margin over the better fusion at 100 (rankers: "
        + ", ".join(rankers)
        + "): "
        + "; ".join(
            f"{c}: top {SHALLOW} {m[SHALLOW]:+.4f}, top {DEEP} {m[DEEP]:+.4f}" for c, m in margins.items()
        ),
        "",
        f"Default over all collections: top {default}; held out, each collection's chosen depth serves at least "
        f"as well as top {SHALLOW}: {veto}; adopted: {adopt}",
    ]
    fields = {
        "rankers": rankers,
        "results": results,
        "margins": {c: {str(d): round(x, 4) for d, x in m.items()} for c, m in margins.items()},
        "default": default,
        "veto": veto,
        "adopted": adopt,
    }
    write_probe(args.out, "label_free_deeper", lines, argv, t0, fields)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
