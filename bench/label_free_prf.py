"""A new label-free signal for the served score: pseudo-relevance feedback on the bi-encoder's query (Rocchio).

The served score of a label-free build fuses the neural score, BM25, the bi-encoder's cosine with the whole
document (``dense``) and, where documents are several sentence windows, with the best window (``window``). Both
bi-encoder features read one query vector ``q``. Dense Rocchio feedback (Li et al., "Pseudo relevance feedback
with deep language models and dense retrievers", 2021/2022) moves it towards the documents the first pass ranks
best: ``q' = normalise(q + beta * mean of the top-k documents' unit vectors)``, then ``dense`` and ``window`` are
the cosines with ``q'``. Here the first pass is the equal-weight z-score fusion of BM25 and the bi-encoder over
BM25's top 100 (label-free, the same for every ranker, computed at serve time from features the service already
has), so the feedback costs one matrix-vector product over vectors already fetched.

The rule, fixed in the commit that added this file before any of it was run (no collection's test judgments had
been read with feedback):

- grid: no feedback, and ``(k, beta)`` in {1, 3, 5} x {0.5, 1.0}; everything else as the build serves (the kind's
  label-free weights, the window prior where at least half the documents are two or more windows);
- for a target collection T: the grid point with the largest mean, over the other collections and the three
  rankers, of served nDCG@10 minus that collection's better of RRF and the equal-weight fusion; ties go to no
  feedback. T's served score at that point is compared (paired t-test) with T's better fusion and with T's
  served score without feedback; T's judgments choose nothing;
- the default for a user's collection: the same rule over all three collections. It is adopted by
  ``aheadrank build`` only if it is not "no feedback" and, on each collection, the point chosen without it
  serves at least as well (mean over the three rankers) as no feedback; that veto reads every collection's
  judgments, which the docs then say.

Also shown, because a user could do it too: the bi-encoder and the equal-weight fusion with the same feedback
(``bi-encoder+prf``, ``fusion-equal+prf``) at each collection's chosen point.

Nothing is built or trained. The documents' and windows' vectors are the bi-encoder's, embedded here in float32
(cached by ``bench/label_free_passages.py``'s ``embeddings``; the service reads them as float16 from the store);
the neural scores are read from committed label-free builds' pure runs (``--neural DIR:VARIANT``).

    .venv/bin/python bench/label_free_prf.py --collections scifact cranfield vaswani \\
        --neural bench/results/label-free:mores-2ib-s2 bench/results/label-free:prettr-l5-e128 \\
                 bench/results/label-free:tk-6l-base --out bench/results/label-free/prf

Writes ``--out``: ``label_free_prf.{json,md}`` and ``<collection>/runs/{VARIANT+priors+prf,fusion-equal+prf}.trec.zst``
(at the point chosen without that collection).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
log = logging.getLogger("bench.label_free_prf")
DEPTH = 100
NONE = (0, 0.0)
GRID = (NONE, *((k, b) for k in (1, 3, 5) for b in (0.5, 1.0)))


def point_name(p: tuple[int, float]) -> str:
    return "none" if p == NONE else f"k{p[0]}-b{p[1]:g}"


def parse_args(
    argv=None, doc: str | None = None, out: str = "prf", runs_of: bool = False
) -> argparse.Namespace:
    """The arguments of a probe that chooses each collection's setting on the others (this bench's, and
    ``label_free_bm25_window.py``'s with its ``doc`` and ``out`` folder under bench/results/label-free);
    ``runs_of``: with ``--runs-of COLLECTION=DIR`` (a collection's pure runs read from another folder)."""
    from benchkit import add_split_option
    from label_free_passages import neural_list

    ap = argparse.ArgumentParser(
        description=doc or __doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--collections", nargs="+", default=["scifact", "cranfield", "vaswani"])
    ap.add_argument("--neural", nargs="+", required=True, metavar="DIR:VARIANT")
    ap.add_argument("--sentences", type=int, default=2, help="sentences per window (the build's)")
    ap.add_argument("--base", default=None)
    ap.add_argument("--workdir", type=Path, default=ROOT / "work" / "label-free")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "label-free" / out)
    ap.add_argument("--progress", action="store_true")
    add_split_option(ap)
    if runs_of:
        ap.add_argument(
            "--runs-of",
            nargs="+",
            default=[],
            metavar="COLLECTION=DIR",
            help="read COLLECTION's pure runs from DIR/COLLECTION/runs instead of --neural's folders",
        )
    args = ap.parse_args(argv)
    if runs_of:
        pairs = [r.partition("=") for r in args.runs_of]
        if any(not c or not sep or not d for c, sep, d in pairs):
            ap.error("--runs-of: expected COLLECTION=DIR")
        args.runs_of = {c: Path(d) for c, _, d in pairs}
    if len(args.collections) < 2:
        ap.error("--collections: at least two (each is chosen on the others)")
    args.neural = neural_list(ap, args.neural)
    return args


def unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(n > 0, n, 1.0)


def rocchio(qvec: np.ndarray, first: np.ndarray, docvecs: np.ndarray, k: int, beta: float) -> np.ndarray:
    """``normalise(q + beta * mean of the unit vectors of the k best documents by ``first``)``; ``q`` itself
    (normalised) where ``k`` is 0."""
    q = unit(np.asarray(qvec, dtype=np.float64))
    if k <= 0:
        return q
    top = np.argsort(-np.asarray(first), kind="stable")[:k]
    return unit(q + beta * unit(np.asarray(docvecs, dtype=np.float64)[top]).mean(axis=0))


def query_features(qvec, bm25, docvecs, window_vecs, owner_rows, point) -> dict[str, np.ndarray]:
    """The bi-encoder features of one query's candidates with feedback ``point``: ``dense`` (whole document) and
    ``window`` (the best of each document's windows), beside ``bm25``."""
    from aheadrank.baselines import EQUAL_FUSION
    from aheadrank.priors import zscore

    d = unit(np.asarray(docvecs, dtype=np.float64))
    first = EQUAL_FUSION["bm25"] * zscore(np.asarray(bm25)) + EQUAL_FUSION["dense"] * zscore(d @ unit(qvec))
    q = rocchio(qvec, first, d, *point)
    sims = unit(np.asarray(window_vecs, dtype=np.float64)) @ q
    return {
        "bm25": np.asarray(bm25, dtype=np.float64),
        "dense": d @ q,
        "window": np.array([sims[rows].max() for rows in owner_rows], dtype=np.float64),
    }


@dataclass(frozen=True)
class Grid:
    """What a leave-one-collection-out probe chooses among: ``points`` (``none``, the served score as built, among
    them), how a point is named, what the setting is called in the table and the suffix of its runs."""

    points: tuple
    none: tuple
    name: Callable[[tuple], str]
    what: str
    suffix: str


def choose(margins: dict[str, dict[tuple, float]], among: list[str], grid: Grid | None = None) -> tuple:
    """The grid point with the largest mean margin over ``among``; ties go to ``none`` (no feedback), then to the
    earlier point."""
    g = grid or FEEDBACK
    return max(
        g.points,
        key=lambda p: (float(np.mean([margins[c][p] for c in among])), p == g.none, -g.points.index(p)),
    )


FEEDBACK = Grid(GRID, NONE, point_name, "feedback", "prf")


def collection_features(args, name: str, grid: tuple = GRID) -> dict:
    """Everything a collection's rows need: qrels, candidates, the features at each grid point, the neural
    scores of each variant and the window gate."""
    from label_free_passages import candidates, multi_window

    from aheadrank.build import MULTI_WINDOW

    c = candidates(args, name)
    collection, qrels, cands, qids = c.collection, c.qrels, c.cands, c.qids
    docs, passages, row_of, rows_of, qv = c.docs, c.passages, c.row_of, c.rows_of, c.qv
    at = {}
    for point in grid:
        per_q = []
        for q in qids:
            ds = [d for d, _ in cands[q]]
            rows = [rows_of[row_of[d]] for d in ds]
            flat = sorted({r for rs in rows for r in rs})
            local = {r: i for i, r in enumerate(flat)}
            per_q.append(
                query_features(
                    qv[q],
                    np.array([s for _, s in cands[q]], dtype=np.float64),
                    np.stack([docs[d] for d in ds]),
                    passages[flat],
                    [[local[r] for r in rs] for rs in rows],
                    point,
                )
            )
        at[point] = per_q
    neural = {}
    for folder, variant in args.neural:
        neural[variant] = c.neural(folder, variant)
    multi = multi_window(collection, args.sentences)
    return {
        "qrels": qrels,
        "qids": qids,
        "docids": {q: [d for d, _ in cands[q]] for q in qids},
        "at": at,
        "neural": neural,
        "multi_window": multi,
        "gate": multi >= MULTI_WINDOW,
        "docs": docs,
    }


def served_weights(variant: str, gate: bool) -> dict[str, float]:
    from aheadrank.build import _variant, label_free_weights

    w = label_free_weights(_variant(variant).kind, window=gate)
    return w["neural+bm25+dense+window" if gate else "neural+bm25+dense"]


def collection_runs(c: dict, variants: list[str]) -> dict:
    """{point: {run name: run}} for the baselines with feedback and each variant's served score."""
    from label_free import label_free_baselines, runs_from

    from aheadrank.priors import QueryFeatures

    out = {}
    for point, per_q in c["at"].items():
        base = [
            (q, QueryFeatures(c["docids"][q], f, c["qrels"].get(q, {})))
            for q, f in zip(c["qids"], per_q, strict=True)
        ]
        runs = label_free_baselines(base)
        for v in variants:
            with_neural = [
                (q, QueryFeatures(f.docids, {**f.features, "neural": c["neural"][v][q]}, f.qrels))
                for q, f in base
            ]
            runs[f"{v}+priors"] = runs_from(with_neural, served_weights(v, c["gate"]))
        out[point] = runs
    return out


def feature_runs(args, name: str, points: tuple, combine: Callable) -> tuple[dict, dict]:
    """A collection's ``(features, {point: {run name: run}})`` for :func:`loo_probe` where a point
    changes how the served score combines its features: ``combine(per_q, weights, point)`` gives a run from
    ``per_q`` ((qid, docids, {feature: scores}) per query) and the fixed ``weights``; the equal-weight fusion is
    combined the same way, BM25, the bi-encoder and RRF stay as they are."""
    from label_free import label_free_baselines

    from aheadrank.baselines import EQUAL_FUSION
    from aheadrank.priors import QueryFeatures

    c = collection_features(args, name, grid=(NONE,))
    rows = list(zip(c["qids"], c["at"][NONE], strict=True))
    plain = label_free_baselines(
        [(q, QueryFeatures(c["docids"][q], f, c["qrels"].get(q, {}))) for q, f in rows]
    )
    fusion_q = [(q, c["docids"][q], f) for q, f in rows]
    variants = [v for _, v in args.neural]
    per_q = {v: [(q, c["docids"][q], {**f, "neural": c["neural"][v][q]}) for q, f in rows] for v in variants}
    out = {}
    for p in points:
        runs = {**plain, "fusion-equal": combine(fusion_q, EQUAL_FUSION, p)}
        for v in variants:
            runs[f"{v}+priors"] = combine(per_q[v], served_weights(v, c["gate"]), p)
        out[p] = runs
    return c, out


def write_probe(out: Path, name: str, lines: list[str], argv, t0: float, fields: dict) -> None:
    """Print a probe's table and write ``out/NAME.{md,json}`` (the argv, the machine, ``fields``, the wall time)."""
    from benchkit import machine_info, write_json

    md = "\n".join(lines) + "\n"
    print(md)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(md)
    command = ["python", f"bench/{name}.py", *(argv if argv is not None else sys.argv[1:])]
    write_json(
        out / f"{name}.json",
        {"benchmark": name, "command": command, "machine": machine_info(2), **fields}
        | {"wall_s": round(time.perf_counter() - t0, 1)},
    )


def loo_probe(args, argv, grid: Grid, runs_of: Callable, bench: str, fields: dict) -> int:
    """Run a leave-one-collection-out probe: ``runs_of(name)`` gives a collection's ``(features, {point: {run
    name: run}})`` (``features`` as :func:`collection_features`), each collection's point is chosen on the others,
    and the table, the JSON and each collection's runs at its point are written."""
    from label_free import comparison, diff_p, write_zst_run

    from aheadrank.evaluation import compare, evaluate

    t0 = time.perf_counter()
    variants = [v for _, v in args.neural]
    none, name_of = grid.none, grid.name
    per, runs, ndcg, best = {}, {}, {}, {}
    for name in args.collections:
        per[name], runs[name] = runs_of(name)
        qrels = per[name]["qrels"]
        ndcg[name] = {
            p: {k: evaluate(r, qrels, ("nDCG@10",))["nDCG@10"] for k, r in rs.items()}
            for p, rs in runs[name].items()
        }
        best[name] = max(("rrf", "fusion-equal"), key=lambda k: ndcg[name][none][k])
        logging.getLogger(f"bench.{bench}").info(
            "%s: %s",
            name,
            {name_of(p): round(ndcg[name][p][f"{variants[0]}+priors"], 4) for p in grid.points},
        )
    margins = {
        c: {
            p: float(np.mean([ndcg[c][p][f"{v}+priors"] for v in variants])) - ndcg[c][none][best[c]]
            for p in grid.points
        }
        for c in args.collections
    }
    results, lines = {}, []
    lines.append(
        f"| collection | run | no {grid.what} | chosen point | with {grid.what} | vs better fusion (diff, p) | "
        f"vs no {grid.what} (diff, p) |"
    )
    lines.append("|---|---|---:|---|---:|---|---|")
    for c in args.collections:
        others = [o for o in args.collections if o != c]
        point = choose(margins, others, grid)
        qrels = per[c]["qrels"]
        ref = runs[c][none][best[c]]
        row = {
            "test_queries": len(per[c]["qids"]),
            "multi_window": round(per[c]["multi_window"], 4),
            "window_prior": per[c]["gate"],
            "better_fusion": best[c],
            "chosen_on": others,
            "point": name_of(point),
            "ndcg10_by_point": {
                name_of(p): {k: round(v, 4) for k, v in ndcg[c][p].items()} for p in grid.points
            },
            "margin_by_point": {name_of(p): round(m, 4) for p, m in margins[c].items()},
            "runs": {},
        }
        out_runs = args.out / c / "runs"
        out_runs.mkdir(parents=True, exist_ok=True)
        for k in ("bi-encoder", "fusion-equal", *(f"{v}+priors" for v in variants)):
            after = runs[c][point][k]
            row["runs"][k] = {
                "none": round(ndcg[c][none][k], 4),
                grid.suffix: round(ndcg[c][point][k], 4),
                "vs_better_fusion": comparison(compare, ref, after, qrels),
                "vs_none": comparison(compare, runs[c][none][k], after, qrels),
            }
            r = row["runs"][k]
            lines.append(
                f"| {c} | {k} | {r['none']:.4f} | {row['point']} | {r[grid.suffix]:.4f} | "
                f"{diff_p(r['vs_better_fusion'])} | {diff_p(r['vs_none'])} |"
            )
            if k != "bi-encoder":
                tag = f"{k}+{grid.suffix}"
                write_zst_run(out_runs / f"{tag}.trec.zst", after, tag.replace("+", "_"))
        for k in ("bm25", "rrf", "fusion-equal"):
            row.setdefault("baselines", {})[k] = round(ndcg[c][none][k], 4)
        results[c] = row
    default = choose(margins, list(args.collections), grid)
    veto = {
        c: margins[c][choose(margins, [o for o in args.collections if o != c], grid)] >= margins[c][none]
        for c in args.collections
    }
    adopt = default != none and all(veto.values())
    lines.append("")
    lines.append(
        "Mean served margin over the better fusion (three rankers), by grid point: "
        + "; ".join(
            f"{c}: " + ", ".join(f"{name_of(p)} {margins[c][p]:+.4f}" for p in grid.points)
            for c in args.collections
        )
    )
    lines.append("")
    lines.append(
        f"Default over all collections: {name_of(default)}; held out, each collection's chosen point serves at "
        f"least as well as no {grid.what}: {veto}; adopted: {adopt}"
    )
    write_probe(
        args.out,
        bench,
        lines,
        argv,
        t0,
        {
            "grid": [name_of(p) for p in grid.points],
            **fields,
            "results": results,
            "default": name_of(default),
            "veto": veto,
            "adopted": adopt,
        },
    )
    return 0


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    args = parse_args(argv)
    variants = [v for _, v in args.neural]

    def runs_of(name: str):
        features = collection_features(args, name)
        return features, collection_runs(features, variants)

    fields = {"first_pass": "aheadrank.baselines.EQUAL_FUSION over BM25's top 100"}
    return loo_probe(args, argv, FEEDBACK, runs_of, "label_free_prf", fields)


if __name__ == "__main__":
    raise SystemExit(main())
