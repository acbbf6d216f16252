"""Plots drawn from committed bench results, for the docs: nothing is trained or timed here.

``depth``: nDCG@10 against re-ranking depth and against the time a query spends, with the priors. From an
``bench/effectiveness.py`` run (its JSON and TREC runs, committed compressed) it rebuilds, for every depth k, what
the service returns when it re-ranks the first k BM25 candidates: each ranker's neural score (its pure run)
combined with BM25 (``bm25.trec``) and the bi-encoder (``bi-encoder.trec``) by the priors the run fitted
(``priors`` in the JSON), z-scored over those k candidates as ``aheadrank.priors.Priors.combine`` does, the tail in
BM25 order (``time_budget_ms``'s rule). At the run's full depth this gives the served run's nDCG@10 again (checked,
``full_depth_check`` in the JSON). The time axis is this depth through a line ``t(k) = query side + k · per
document`` taken from a ``bench/speed.py`` JSON (its float16 rows at the run's document length): the neural
online path on the machine that JSON records, without BM25, the fetch and the dense prior.

``speed``: every ranker's online path against its FLOP floor from a ``bench/speed.py`` JSON: ms per query and
the floor (the path's matmul FLOPs at the fastest matmul rate measured in the same run), one panel per document
length, rows grouped by the JSON's ``path`` field where it has one (reference / compiled / native).

    .venv/bin/python bench/plots.py depth        # cpu-core-360 + speed.json -> bench/results/cpu-core-360/depth.{json,png}
    .venv/bin/python bench/plots.py speed        # bench/results/speed.json -> bench/results/speed.png
    .venv/bin/python bench/plots.py speed --speed bench/results/speed-d128-34b172c.json --out /tmp/s.png
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

from benchkit import clean, eval_topics, machine_info, stage, write_json

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DEPTHS = (0, 1, 2, 3, 5, 7, 10, 15, 20, 30, 40, 50, 60, 75, 100, 150, 200, 300, 500, 1000)
PRIMARY = "nDCG@10"
METRICS = ("nDCG@10", "MRR@10")
FEATURES = (
    "bm25",
    "dense",
)  # the priors' features besides the neural score: BM25's run, the bi-encoder's run


# ---- depth ----------------------------------------------------------------------------------------------------
def run_path(path: str | Path) -> Path:
    """A run file as the effectiveness JSON names it (relative to the repository), or its committed ``.zst``."""
    p = Path(path)
    p = p if p.is_absolute() else REPO / p
    if not p.exists() and Path(f"{p}.zst").exists():
        return Path(f"{p}.zst")
    return p


def served_scores(
    bm25_order: list[str], k: int, features: dict[str, dict[str, float]], weights: dict[str, float]
) -> dict[str, float]:
    """The priors' combination over the first ``k`` candidates, each feature z-scored over those ``k`` (as the
    service does for a request of ``k`` candidates)."""
    import numpy as np

    from aheadrank.priors import zscore

    head = [d for d in bm25_order[:k] if all(d in features[f] for f in weights)]
    out = np.zeros(len(head))
    for name, w in weights.items():
        if w:
            out += w * zscore(np.array([features[name][d] for d in head]))
    return dict(zip(head, out.tolist(), strict=True))


def pure_head(neural: dict):
    """``scores_at(qid, bm25_order, k)`` of the neural score alone (independent of k)."""
    return lambda qid, order, k: neural.get(qid, {})


def served_head(neural: dict, features: dict, weights: dict[str, float]):
    """``scores_at(qid, bm25_order, k)`` of the served score over the first k candidates."""

    def scores_at(qid: str, order: list[str], k: int) -> dict[str, float]:
        feats = {"neural": neural.get(qid, {}), **{f: features[f].get(qid, {}) for f in FEATURES}}
        return served_scores(order, k, feats, weights)

    return scores_at


def depth_run(bm25: dict, scores_at, k: int) -> dict:
    """First ``k`` BM25 candidates ordered by ``scores_at(qid, k)``, the rest in BM25 order; rank-derived
    scores so that evaluation sees exactly this order."""
    from aheadrank.evaluation import by_score, ranking

    run = {}
    for qid, docs in bm25.items():
        order_bm25 = ranking(docs)
        mine = scores_at(qid, order_bm25, k)
        head = order_bm25[:k]
        order = [d for d, _ in by_score([(d, mine[d]) for d in head if d in mine])]
        order += [d for d in head if d not in mine] + order_bm25[k:]
        run[qid] = {d: float(len(order) - i) for i, d in enumerate(order)}
    return run


def speed_lines(speed: dict, doc_len: int) -> dict[str, dict]:
    """{ranker: {query_ms, per_doc_ms, ...}} from a bench/speed.py JSON's float16 rows at ``doc_len``."""
    out = {}
    for row in speed.get("rows", []):
        if row.get("stored_dtype", "float16") != "float16" or row.get("d_nominal") != doc_len:
            continue
        if row.get("path") != row_best_path(speed, row["ranker"], doc_len):
            continue  # a run timing several paths of a ranker: the fastest one
        q = row.get("query_ms_median") or 0.0
        out[row["ranker"]] = {
            "query_ms": q,
            "per_doc_ms": (row["ms_median"] - q) / row["n_docs"],
            "ms_median": row["ms_median"],
            "n_docs": row["n_docs"],
            "path": row.get("path"),
        }
    return out


def row_best_path(speed: dict, ranker: str, doc_len: int) -> str | None:
    """Where a speed JSON times several paths of one ranker, the fastest one (what the service would keep)."""
    rows = [
        r
        for r in speed.get("rows", [])
        if r["ranker"] == ranker
        and r.get("d_nominal") == doc_len
        and r.get("stored_dtype", "float16") == "float16"
    ]
    return min(rows, key=lambda r: r["ms_median"]).get("path") if rows else None


def depth_curves(eff: dict, speed: dict | None, depths: list[int]) -> dict:
    from aheadrank.evaluation import evaluate, read_run

    s = eff["settings"]
    collection = Path(s["collection"])
    _, qrels = eval_topics(collection, s["split"], s.get("max_queries"))
    bm25 = read_run(run_path(eff["bm25"]["run_file"]))
    features = {"bm25": bm25, "dense": read_run(run_path(eff["baselines"]["bi-encoder"]["run_file"]))}
    depths = sorted({k for k in depths if k <= s["depth"]} | {s["depth"]})
    doc_len = s.get("max_doc_len") or 128
    lines = speed_lines(speed, doc_len) if speed else {}

    def evaluate_at(scores_at) -> list[dict]:
        return [{"depth": k, **evaluate(depth_run(bm25, scores_at, k), qrels, METRICS)} for k in depths]

    bm25_metrics = evaluate(bm25, qrels, METRICS)
    rankers = {}
    for name, row in eff["rankers"].items():
        if not row.get("pure", True) or (name.endswith("-s1") and name[:-1] + "2" in eff["rankers"]):
            continue  # served rows are rebuilt from the pure run; S1 = S2 up to float16 near-ties
        neural = read_run(run_path(row["run_file"]))
        served_row = eff["rankers"].get(f"{name}+priors")
        weights = None
        if served_row and served_row.get("priors"):
            weights = served_row["priors"].get("neural+bm25+dense")
        curves = {"pure": evaluate_at(pure_head(neural))}
        check = None
        if weights:
            curves["served"] = evaluate_at(served_head(neural, features, weights))
            full = curves["served"][-1][PRIMARY]
            check = {
                "rebuilt": full,
                "served_run": served_row["metrics"][PRIMARY],
                "diff": full - served_row["metrics"][PRIMARY],
            }
            stage(
                f"{name}: served nDCG@10 at depth {s['depth']} rebuilt {full:.4f}, the run's {check['served_run']:.4f}"
            )
        timing = lines.get(name)
        for curve in curves.values():
            for point in curve:
                point["ms"] = timing["query_ms"] + timing["per_doc_ms"] * point["depth"] if timing else None
        rankers[name] = {"weights": weights, "timing": timing, "curves": curves, "full_depth_check": check}
    return {"bm25": bm25_metrics, "fusion": eff["baselines"].get("bm25+bi-encoder", {}).get("metrics"),
            "depths": depths, "queries": len(qrels), "doc_len": doc_len, "rankers": rankers}  # fmt: skip


def plot_depth(path: Path, result: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5))
    for i, (name, row) in enumerate(result["rankers"].items()):
        color = plt.cm.tab10(i % 10)
        served, pure = row["curves"].get("served"), row["curves"]["pure"]
        xs = [max(p["depth"], 0.5) for p in pure]  # depth 0 (BM25 alone) drawn at 0.5 on the log axis
        if served:
            left.plot(xs, [p[PRIMARY] for p in served], "o-", ms=3, color=color, label=f"{name} + priors")
        left.plot(xs, [p[PRIMARY] for p in pure], ":", color=color, label=f"{name} (neural alone)")
        if served and served[0]["ms"] is not None:
            pts = [p for p in served if p["depth"] > 0]
            right.plot([p["ms"] for p in pts], [p[PRIMARY] for p in pts], "o-", ms=3, color=color, label=name)
    for ax in (left, right):
        ax.axhline(result["bm25"][PRIMARY], color="black", ls="--", lw=1, label="BM25")
        if result.get("fusion"):
            ax.axhline(
                result["fusion"][PRIMARY], color="grey", ls="-.", lw=1, label="BM25 + bi-encoder fusion"
            )
        ax.set_xscale("log")
        ax.set_ylabel(f"{PRIMARY}, SciFact test ({result['queries']} queries)")
        ax.grid(True, which="both", alpha=0.3)
    left.set_xlabel("depth k: BM25's first k re-ranked, the rest in BM25 order (k = 0 at 0.5)")
    right.set_xlabel("ms a query for the neural path at depth k")
    left.set_title("solid: served (with priors); dotted: the neural score alone", fontsize=9)
    right.set_title(f"served (with priors); time: {result['speed_source']}", fontsize=8)
    left.legend(fontsize=7, loc="lower left", ncol=2)
    right.legend(fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- speed ----------------------------------------------------------------------------------------------------
def plot_speed(path: Path, speed: dict, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in speed["rows"] if r.get("stored_dtype", "float16") == "float16" and r.get("floor_ms")]
    lengths = sorted({r["d_nominal"] for r in rows})
    fig, axes = plt.subplots(1, len(lengths), figsize=(6.5 * len(lengths), 0.42 * len(rows) / len(lengths) + 2),
                             squeeze=False)  # fmt: skip
    paths = sorted({r.get("path") or "" for r in rows})
    markers = dict(zip(paths, "o^sDv", strict=False))
    for ax, d in zip(axes[0], lengths, strict=True):
        mine = [r for r in rows if r["d_nominal"] == d]
        labels = list(dict.fromkeys(r["ranker"] for r in mine))
        for r in mine:
            y = labels.index(r["ranker"]) + (paths.index(r.get("path") or "") - (len(paths) - 1) / 2) * 0.25
            ax.plot([r["floor_ms"], r["ms_median"]], [y, y], color="grey", lw=1)
            ax.plot(r["floor_ms"], y, "|", color="black", ms=10)
            ax.plot(r["ms_median"], y, markers[r.get("path") or ""], color=plt.cm.tab10(paths.index(r.get("path") or "")),
                    label=r.get("path") or "measured")  # fmt: skip
            ax.annotate(
                f"{r['x_floor']:.2f}×",
                (r["ms_median"], y),
                xytext=(5, -3),
                textcoords="offset points",
                fontsize=7,
            )
        ax.set_yticks(range(len(labels)), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xscale("log")
        ax.set_xlabel("ms a query (| = its FLOP floor; label: × floor)")
        pieces = mine[0]["d_pieces"]
        ax.set_title(f"{mine[0]['n_docs']} candidates of {pieces} pieces", fontsize=9)
        ax.grid(True, which="both", axis="x", alpha=0.3)
        handles, names = ax.get_legend_handles_labels()
        uniq = dict(zip(names, handles, strict=True))
        ax.legend(uniq.values(), uniq.keys(), fontsize=7, loc="lower right")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def speed_title(speed: dict, source: Path) -> str:
    m = speed.get("machine", {})
    gflops = speed.get("matmul", {}).get("start", {}).get("gflops")
    commit = (m.get("git_commit") or "?")[:7]
    floor = f", floor at {gflops:.0f} GFLOP/s" if gflops else ""
    return f"bench/speed.py at {commit} ({rel(source)}): {m.get('cpu', '?')}, {m.get('threads', '?')} threads{floor}"


def rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


# ---- main -----------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what", required=True)
    d = sub.add_parser("depth", help="nDCG@10 against re-ranking depth and time, with the priors")
    d.add_argument("--effectiveness", type=Path, default=RESULTS / "cpu-core-360" / "effectiveness.json")
    d.add_argument(
        "--speed", type=Path, default=RESULTS / "speed.json", help="bench/speed.py JSON for the time axis"
    )
    d.add_argument("--depths", type=int, nargs="+", default=list(DEPTHS))
    d.add_argument("--out", type=Path, default=None, help="JSON (default: depth.json beside --effectiveness)")
    d.add_argument("--png", type=Path, default=None, help="PNG (default: --out with .png)")
    s = sub.add_parser("speed", help="every ranker's online path against its FLOP floor")
    s.add_argument("--speed", type=Path, default=RESULTS / "speed.json")
    s.add_argument("--out", type=Path, default=None, help="PNG (default: --speed with .png)")
    args = ap.parse_args(argv)
    if args.what == "depth":
        args.out = args.out or args.effectiveness.with_name("depth.json")
        args.png = args.png or args.out.with_suffix(".png")
    else:
        args.out = args.out or args.speed.with_suffix(".png")
    return args


def main(argv: list[str] | None = None) -> int:
    t0 = time.perf_counter()
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    command = shlex.join([".venv/bin/python", "bench/plots.py", *argv])
    if args.what == "speed":
        speed = json.loads(args.speed.read_text())
        plot_speed(args.out, speed, speed_title(speed, args.speed))
        print(f"wrote {rel(args.out)}")
        return 0
    eff = json.loads(args.effectiveness.read_text())
    speed = json.loads(args.speed.read_text()) if args.speed and args.speed.is_file() else None
    result = depth_curves(eff, speed, args.depths)
    eff_commit = (eff.get("machine", {}).get("git_commit") or "?")[:7]
    result["speed_source"] = (
        f"query side + k · per document, {rel(args.speed)} (d = {result['doc_len']})"
        if speed
        else "no speed JSON"
    )
    record = {
        "benchmark": "bench/plots.py depth",
        "command": command,
        "machine": machine_info(0),
        "effectiveness": {
            "file": rel(args.effectiveness),
            "command": eff.get("command"),
            "git_commit": eff_commit,
        },
        "speed": {
            "file": rel(args.speed),
            "command": speed.get("command"),
            "git_commit": (speed.get("machine", {}).get("git_commit") or "?")[:7],
        }
        if speed
        else None,  # fmt: skip
        **result,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    write_json(args.out, clean(record))
    title = (
        f"{rel(args.effectiveness)} (bench/effectiveness.py at {eff_commit}): BM25 top-{eff['settings']['depth']} "
        f"re-ranked to depth k with the fitted priors; time from {rel(args.speed) if speed else '—'}"
    )
    plot_depth(args.png, result, title)
    print_depth(result)
    print(f"wrote {rel(args.out)} and {rel(args.png)}")
    return 0


def print_depth(result: dict) -> None:
    shown = [k for k in result["depths"] if k in (0, 5, 10, 20, 30, 50, 100, 300, 1000)]
    print(f"{PRIMARY} at depth k ({'/'.join(map(str, shown))}); BM25 {result['bm25'][PRIMARY]:.4f}")
    for name, row in result["rankers"].items():
        for kind, curve in row["curves"].items():
            vals = {p["depth"]: p for p in curve}
            cells = " ".join(f"{vals[k][PRIMARY]:.3f}" for k in shown)
            ms = vals[shown[-1]].get("ms")
            print(f"  {name:16s} {kind:6s} {cells}" + (f"   ({ms:.0f} ms at {shown[-1]})" if ms else ""))
        if row["full_depth_check"] and not math.isclose(row["full_depth_check"]["diff"], 0.0, abs_tol=1e-3):
            print(
                f"  {name}: rebuilt served score differs from the run's by {row['full_depth_check']['diff']:+.4f}"
            )


if __name__ == "__main__":
    raise SystemExit(main())
