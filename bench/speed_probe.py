"""How well the speed probe of ``aheadrank build`` (``aheadrank.buildtime.speed_probe``: the bi-encoder timed on two
batches of 64 of the collection's documents, against the reference rates for them) foretells the dense field's time,
the stage it imitates: for each collection, the probe run ``--repeats`` times, the dense field embedded (what the
build's dense stage does first, ``aheadrank.indexer.build.ensure_dense_field``), the probe run again. Both are
scales of the same reference (``aheadrank.buildtime.DENSE_S``), so their ratio says how far the first
``[estimate]`` line's scale was from the one the dense stage then showed, whatever the machine's speed that day;
the probes after the field say how much the machine's speed moved while it ran. The CPU time other processes took
is recorded beside (``others_cores``).

    .venv/bin/python bench/speed_probe.py --collections cranfield vaswani scifact \\
        --out bench/results/speed-probe

Writes ``--out``/``speed_probe.{json,md}``; the dense fields go to ``--work`` (removed before each).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument(
        "--collections",
        nargs="+",
        default=["cranfield", "vaswani", "scifact"],
        help="names under --data, or paths",
    )
    ap.add_argument("--repeats", type=int, default=2, help="probes before the field and again after it")
    ap.add_argument("--base", default="", help="the bi-encoder's base ('' for the packaged all-MiniLM-L6-v2)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--work", type=Path, default=ROOT / "work" / "speed-probe")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats is at least 1")
    return args


def collection_path(args, name: str) -> Path:
    given = Path(name)
    return given if given.exists() else args.data / name


def bench_collection(args, name: str) -> dict:
    from aheadrank.indexer.build import ensure_dense_field, get_ranker
    from aheadrank.indexer.collections import Collection
    from benchkit import cpu_sample, others_cores

    from aheadrank.buildtime import DENSE_S, ProbeSample, speed_probe

    path = collection_path(args, name)
    sample = ProbeSample()
    docs = words = 0
    for doc in Collection(path):
        sample.add(doc.text)
        docs += 1
        words += len(doc.text.split())
    encoder = get_ranker(args.base, None, args.device, None, "dense")
    before = [speed_probe(sample.texts, encoder) for _ in range(args.repeats)]
    field = args.work / Path(name).name / "dense"
    shutil.rmtree(field, ignore_errors=True)
    start = cpu_sample()
    t0 = time.perf_counter()
    ensure_dense_field(path, field, args.base, args.device, progress=False)
    seconds = time.perf_counter() - t0
    busy = others_cores(start, cpu_sample())
    after = [speed_probe(sample.texts, encoder) for _ in range(args.repeats)]
    shutil.rmtree(field, ignore_errors=True)
    ref = DENSE_S[0] * docs + DENSE_S[1] * words
    field_scale = seconds / ref
    probe_scale = statistics.mean(p["scale"] for p in before)
    return {
        "collection": Path(name).name,
        "documents": docs,
        "mean_words": round(words / docs, 1),
        "probes_before": before,
        "probes_after": after,
        "field_seconds": round(seconds, 3),
        "field_reference_seconds": round(ref, 3),
        "field_scale": round(field_scale, 6),
        "field_over_probe": round(field_scale / probe_scale, 6),
        "others_cores": round(busy, 2),
    }


def table(results: list[dict]) -> str:
    lines = [
        "| collection | documents | mean words | probe scale before | dense field (s) | its scale | "
        "field / probe | probe scale after | other processes' cores |",
        "|---|---:|---:|---|---:|---:|---:|---|---:|",
    ]
    for r in results:
        before = ", ".join(f"{p['scale']:.2f}" for p in r["probes_before"])
        after = ", ".join(f"{p['scale']:.2f}" for p in r["probes_after"])
        lines.append(
            f"| {r['collection']} | {r['documents']:,} | {r['mean_words']:.0f} | {before} | "
            f"{r['field_seconds']:.0f} | {r['field_scale']:.2f} | {r['field_over_probe']:.2f} | {after} | "
            f"{r['others_cores']:.2f} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    from benchkit import machine, write_record

    args = parse_args(argv)
    t0 = time.perf_counter()
    results = []
    for name in args.collections:
        results.append(bench_collection(args, name))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    md = table(results)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "speed_probe.md").write_text(
        "# aheadrank build: the speed probe against the dense field it foretells\n\n"
        "Scales are seconds over the reference rates' (aheadrank/buildtime.py `DENSE_S`); "
        "`field / probe` is the dense field's scale over the mean of the probes before it.\n\n" + md + "\n"
    )
    write_record(
        args.out / "speed_probe.json", "speed_probe.py", argv, machine(args.device), t0, results=results
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
