"""How far the ``[estimate]`` lines of ``aheadrank build`` (aheadrank/buildtime.py) were from the stages' real
times, for finished builds: their ``build.json`` records the plan, the collection's size and every stage's seconds.

For each build and stage: the estimate at the reference rates, the same scaled by the collection stage's speed
probe (what the build prints once the collection is read, since the probe; a record from before it has none), the
estimate scaled by the dense stage's time against its own (printed after the dense stage, for the stages after it)
and the measured seconds, with measured / estimate; for a build whose store stage finished, the store's bytes as
the build estimates them (``aheadrank.buildtime.store_bytes``) beside those it wrote. Nothing is run: the estimate
is recomputed from the record. A stage taken from another build (``--reuse``) keeps that build's time.

    .venv/bin/python bench/build_estimate.py work/label-free/*/* bench/results/label-free/build-time/*.build.json \\
        --out bench/results/label-free/build-estimate

Writes ``--out``/``build_estimate.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "builds", nargs="+", type=Path, help="build folders (with build.json) or build.json files"
    )
    ap.add_argument("--out", type=Path, required=True)
    return ap.parse_args(argv)


def record_of(path: Path) -> tuple[str, dict] | None:
    """(a name, the build record) of a build folder or a ``*.build.json``; None for a folder without one."""
    file = path / "build.json" if path.is_dir() else path
    if not file.is_file():
        return None
    rec = json.loads(file.read_text())
    name = path.name if path.is_dir() else path.name.removesuffix(".build.json")
    if path.is_dir() and path.parent.name:
        name = f"{path.parent.name}/{name}"
    return name, rec


def compare(rec: dict) -> dict:
    """Per stage: estimated (reference), estimated after the dense stage, measured; None where not measured."""
    from aheadrank.build import STAGES, BuildPlan, dense_timed, workload
    from aheadrank.buildtime import reference_seconds

    known = {f.name for f in fields(BuildPlan)}
    stages = rec["stages"]
    plan = BuildPlan(**{k: v for k, v in rec["plan"].items() if k in known})
    if "steps" in stages.get("train", {}):  # the steps it ran (a default of its day may differ from today's)
        plan.steps = stages["train"]["steps"]
    work = workload(plan, stages["collection"])
    ref = reference_seconds(work)
    dense = stages.get("dense", {}).get("seconds")
    timed = dense is not None and dense_timed(stages["dense"])  # a field found complete took no time
    scale = max(float(dense), 1.0) / max(ref["dense"], 1.0) if timed else None
    probe = (stages["collection"].get("probe") or {}).get("scale")
    after_dense = STAGES[STAGES.index("dense") + 1 :]
    out = {}
    for s in STAGES[1:]:
        measured = stages.get(s, {}).get("seconds")
        row = {
            "estimate_s": round(ref[s], 1),
            "measured_s": measured,
            "reused": "reused" in stages.get(s, {}),
        }
        if probe is not None:
            row["estimate_probe_s"] = round(ref[s] * probe, 1)
        if scale is not None and s in after_dense:
            row["estimate_after_dense_s"] = round(ref[s] * scale, 1)
        out[s] = row
    return {"scale": scale, "probe_scale": probe, "stages": out, "documents": stages["collection"]["documents"],
            "mean_words": stages["collection"]["mean_words"], "ranker": plan.ranker,
            "steps": stages.get("train", {}).get("steps"), "store": store_size(plan, work, stages)}  # fmt: skip


def store_size(plan, work, stages: dict) -> dict | None:
    """The store's bytes as the build estimates them (``aheadrank.buildtime.store_bytes``; also without its
    allowance for unequal lengths) beside the bytes it wrote; None for a build without a finished store stage."""
    from aheadrank.build import piece_bytes
    from aheadrank.buildtime import STORE_BYTES_SLACK, store_bytes

    written = stages.get("store", {}).get("store_bytes")
    if not written:
        return None
    estimate = store_bytes(work, piece_bytes(plan))
    return {
        "dtype": plan.dtype,
        "passages": bool(stages["store"].get("passages")),
        "estimate_bytes": round(estimate),
        "estimate_without_slack_bytes": round(estimate / STORE_BYTES_SLACK),
        "written_bytes": written,
    }


def ratio(measured, estimate) -> str:
    if measured is None or not estimate:
        return ""
    return f"{measured / estimate:.2f}"


def table(results: dict) -> str:
    lines = [
        "| build | documents | stage | estimate (s) | probe-scaled (s) | after dense (s) | measured (s) | "
        "measured / estimate | measured / probe-scaled | measured / after dense |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cell(x) -> str:
        return "" if x is None else f"{x:.0f}"

    for name, r in results.items():
        probed = r.get("probe_scale") is not None
        tot = {"estimate_s": 0.0, "estimate_probe_s": 0.0, "estimate_after_dense_s": 0.0, "measured_s": 0.0}
        for s, row in r["stages"].items():
            m, e, a = row["measured_s"], row["estimate_s"], row.get("estimate_after_dense_s")
            p = row.get("estimate_probe_s")
            if m is not None and not row["reused"]:
                tot["estimate_s"] += e
                tot["measured_s"] += m
                tot["estimate_probe_s"] += p or 0.0
                # the stages before the dense one keep the first line's estimate: the probe's where there is one
                tot["estimate_after_dense_s"] += a if a is not None else (p if probed else e)
            note = " (reused)" if row["reused"] else ""
            lines.append(
                f"| {name} | {r['documents']:,} | {s}{note} | {e:.0f} | {cell(p)} | {cell(a)} | {cell(m)} | "
                f"{ratio(m, e)} | {ratio(m, p)} | {ratio(m, a)} |"
            )
        tp = tot["estimate_probe_s"] if probed else None
        lines.append(
            f"| {name} | | **all run here** | {tot['estimate_s']:.0f} | {cell(tp)} | "
            f"{tot['estimate_after_dense_s']:.0f} | {tot['measured_s']:.0f} | "
            f"{ratio(tot['measured_s'], tot['estimate_s'])} | {ratio(tot['measured_s'], tp)} | "
            f"{ratio(tot['measured_s'], tot['estimate_after_dense_s'])} |"
        )
    sized = {name: r["store"] for name, r in results.items() if r.get("store")}
    if sized:
        lines += [
            "",
            "| build | dtype | passages | store estimate | without the 1.1 allowance | written | written / estimate | "
            "written / without |",
            "|---|---|---|---:|---:|---:|---:|---:|",
        ]
        for name, d in sized.items():
            e, raw, w = d["estimate_bytes"], d["estimate_without_slack_bytes"], d["written_bytes"]
            lines.append(
                f"| {name} | {d['dtype']} | {'yes' if d['passages'] else 'no'} | {e / 1e9:.2f} GB | "
                f"{raw / 1e9:.2f} GB | {w / 1e9:.2f} GB | {w / e:.2f} | {w / raw:.2f} |"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchkit import machine, write_record

    args = parse_args(argv)
    t0 = time.perf_counter()
    results = {}
    for path in args.builds:
        got = record_of(path)
        if got is None:
            continue
        name, rec = got
        if "collection" not in rec.get("stages", {}):
            continue
        results[name] = compare(rec)
    if not results:
        print("no finished build among the paths given", file=sys.stderr)
        return 2
    md = table(results)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "build_estimate.md").write_text(
        "# aheadrank build: estimated and measured stage times\n\n" + md + "\n"
    )
    write_record(
        args.out / "build_estimate.json", "build_estimate.py", argv, machine("cpu"), t0, results=results
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
