"""Training steps on the CPU in float32 against bfloat16 autocast, side by side in one run.

The CPU recipe asks for bfloat16 autocast (``rankers.recipe.RECIPES["cpu"].cpu_amp``), which pays where the CPU
multiplies bfloat16 in hardware (AVX512-BF16, AMX). Where it does not (AVX2 alone), ``rankers.training`` trains in
float32 instead (:func:`rankers.training.cpu_bf16_native`); this bench measures what that saves. Each precision
trains a fresh ranker of ``--variant`` (the same seed) for ``--steps`` steps of the recipe's groups (8 queries x 8
documents at its document length) on the bundled SciFact sample's judged training queries, no validation; the
order alternates (float32, bfloat16, bfloat16, float32, ...) so that a machine's drift falls on both. bfloat16 is
forced here even where it is not native.

Around the runs the build's speed probe (``aheadrank.buildtime.speed_probe``: the bi-encoder on 128 of the
collection's documents against the reference rates) is taken before and after; a step's seconds over the probes'
mean scale is the step at the reference machine's speed, what ``aheadrank.buildtime`` estimates a build's training
from (``STEP_S`` in bfloat16, ``STEP_S_FLOAT32`` in float32).

    .venv/bin/python bench/train_precision.py --variant mores-2ib-s2 --steps 4 --repeats 2 \\
        --out bench/results/train-precision

Writes ``--out``/``train_precision.{json,md}``: seconds per step of each run, the medians, their ratio (both
precisions run) and each at the reference speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
PRECISIONS = ("float32", "bfloat16")


def parse_args(argv=None) -> argparse.Namespace:
    from benchkit import SAMPLE

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="mores-2ib-s2")
    ap.add_argument("--collection", type=Path, default=SAMPLE, help="a BEIR folder with a judged train split")
    ap.add_argument("--base", default=None, help="base model folder (default: the packaged one)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=2, help="runs of each precision")
    ap.add_argument(
        "--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS), help="the precisions to time"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "train-precision")
    return ap.parse_args(argv)


def training_data(collection: Path):
    """The collection's judged training queries, each query's candidates every document (no BM25 needed)."""
    from aheadrank.indexer.collections import Collection
    from aheadrank.indexer.topics import read_beir_split
    from aheadrank.rankers.training import TrainingData

    texts = {d.docid: d.text for d in Collection(collection)}
    queries, qrels = read_beir_split(collection, "train")
    qrels = {q: {d: r for d, r in j.items() if d in texts} for q, j in qrels.items()}
    qrels = {q: j for q, j in qrels.items() if any(r > 0 for r in j.values())}
    docids = sorted(texts)
    cands = {q: docids for q in qrels}
    data = TrainingData(texts, {q: queries[q] for q in qrels}, qrels, cands)
    # the recipe's listwise KL needs a teacher: the judgments themselves (its cost is the same as any teacher's)
    data.teacher = {q: {d: float(qrels[q].get(d, 0)) for d in docids} for q in qrels}
    return data


def one_run(args, data, bf16: bool) -> dict:
    import aheadrank.rankers.training as training
    import torch
    from aheadrank.rankers.recipe import recipe_for, resolve_training
    from aheadrank.rankers.variants import DEFAULTS, parse_variant

    variant = parse_variant(DEFAULTS.get(args.variant, args.variant))
    rec = recipe_for("cpu")
    torch.manual_seed(0)
    model = variant.init(base=args.base, seed=0, **rec.init_options())
    given = {"steps": args.steps, "eval_every": args.steps, "val_queries": 0}
    cfg = resolve_training(rec, model.kind, given, ranker=dataclasses.asdict(model.config)).train
    cfg = dataclasses.replace(cfg, cpu_amp=bf16, validate_initial=False)
    native = training.cpu_bf16_native
    training.cpu_bf16_native = lambda: True  # bfloat16 forced where asked, native or not
    try:
        with tempfile.TemporaryDirectory(prefix="aheadrank-precision-") as tmp:
            t0 = time.perf_counter()
            result = training.train(model, data, Path(tmp) / "ckpt", cfg, resume=False, progress=False)
            seconds = time.perf_counter() - t0
    finally:
        training.cpu_bf16_native = native
    losses = [h["loss"] for h in result.history if "loss" in h]
    return {
        "precision": "bfloat16" if bf16 else "float32",
        "seconds": round(seconds, 3),
        "s_per_step": round(seconds / args.steps, 4),
        "last_loss": losses[-1] if losses else None,
    }


def probe_scale(args, texts: list[str]) -> float:
    """The build's speed probe on ``texts``: this machine's bi-encoder time over the reference's for them."""
    from aheadrank.indexer.build import get_ranker

    from aheadrank.buildtime import speed_probe

    return speed_probe(texts, get_ranker(str(args.base or ""), None, "cpu", None, "dense"))["scale"]


def table(record: dict) -> str:
    lines = [
        f"## Training steps on the CPU: {' against '.join(record['precisions'])} ({record['variant']}, "
        f"{record['steps']} steps a run, CPU {record['cpu_capability']}, bfloat16 in hardware: "
        f"{record['bf16_native']})",
        "",
        "| precision | runs | s / step (median) | each run (s / step) | at the reference speed (s / step) |",
        "|---|---:|---:|---|---:|",
    ]
    for p in record["precisions"]:
        each = [r["s_per_step"] for r in record["runs"] if r["precision"] == p]
        lines.append(
            f"| {p} | {len(each)} | {record['median'][p]:.3f} | {', '.join(f'{x:.3f}' for x in each)} "
            f"| {record['reference_s_per_step'][p]:.2f} |"
        )
    probes = ", ".join(f"{x:.2f}" for x in record["probe_scales"])
    lines += ["", f"Speed probe (this machine over the reference, before and after the runs): {probes}"]
    if record.get("ratio"):
        lines += ["", f"bfloat16 / float32: **{record['ratio']:.2f}x** the time a step"]
    return "\n".join(lines)


def main(argv=None) -> int:
    import aheadrank.rankers.training as training
    import torch
    from benchkit import machine_info, write_json

    from aheadrank.buildtime import ProbeSample

    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    data = training_data(args.collection)
    sample = ProbeSample()  # the build's own sample of the collection
    for docid in sorted(data.texts):
        sample.add(data.texts[docid])
    texts = sample.texts
    t0 = time.perf_counter()
    scales = [probe_scale(args, texts)]
    chosen = [p for p in PRECISIONS if p in args.precisions]
    order = (chosen + chosen[::-1]) * args.repeats
    runs = [one_run(args, data, p == "bfloat16") for p in order[: len(chosen) * args.repeats]]
    scales.append(probe_scale(args, texts))
    median = {p: statistics.median(r["s_per_step"] for r in runs if r["precision"] == p) for p in chosen}
    scale = statistics.fmean(scales)
    record = {
        "benchmark": "train_precision",
        "command": ["python", "bench/train_precision.py", *(argv if argv is not None else sys.argv[1:])],
        "variant": args.variant,
        "steps": args.steps,
        "precisions": chosen,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "bf16_native": training.cpu_bf16_native(),
        "runs": runs,
        "median": median,
        "ratio": median["bfloat16"] / median["float32"] if len(chosen) == 2 else None,
        "probe_scales": scales,
        "reference_s_per_step": {p: median[p] / scale for p in chosen},
        "machine": machine_info(args.threads),
    }
    md = table(record)
    print(md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "train_precision.md").write_text(md + "\n")
    write_json(args.out / "train_precision.json", {**record, "wall_s": round(time.perf_counter() - t0, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
