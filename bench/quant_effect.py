"""What int8 fields cost in ranking quality: nDCG@10 on SciFact test (BM25 top-100) from a float16 store and
from the same store requantised to int8 (one float32 scale per token), for trained checkpoints.

Per (checkpoint, float16 store): the int8 store is written from the float16 one (every document fetched
and re-added by ``StoreWriter`` with ``dtype="int8"``; the dense prior field is copied as it is), then
``aheadrank rerank-run`` re-ranks the BM25 run of the test queries from both stores, pure and with the
checkpoint's priors, and ``aheadrank.evaluation`` scores the runs. Bytes per token come from the manifests.

With ``--int4``, two 4-bit settings are measured too, **simulated**: the store has no 4-bit dtype, so each is a
float16 store holding exactly the values a 4-bit store would give back (levels −7..7 times a scale, rounded to
float16: 2^-11 relative, far below the 4-bit step), and its bytes per token are those the 4-bit store would take,
computed, not read from a manifest: ``int4-token`` (one float16 scale per token and field, absmax / 7: dim / 2 + 2
bytes per token and field) and ``int4-dim`` (one scale per dimension for the whole collection, the 99.99th
percentile of |x| over up to 200,000 tokens / 7, values beyond it clipped: dim / 2 bytes). With ``--dim-bits B
...``, per-dimension settings of B bits as well (``intB-dim``: levels −(2^(B−1) − 1)..2^(B−1) − 1, dim·B/8 bytes),
the same way: between 4 and 8 bits, how few keep the ranking. With ``--book-bits B ...``, ``intB-book``: per
dimension a codebook of 2^B levels fitted by Lloyd-Max (``store.quant.fit_codebooks``) to the same sample, each
value stored as its nearest level's code (dim·B/8 bytes; the codebooks, 2^B float32 per dimension, once per
collection). Stored dimensions are far from centred (PreTTR e128 on SciFact: |mean| is 4.6-8.5 standard deviations),
so symmetric levels around 0 spend most codes where no value lies; a codebook puts them where the values are.
With ``--store-dtypes book4 book2``, the real codebook stores (``StoreSpec.dtype``: packed codes and per-shard
codebooks fitted on up to 200,000 tokens evenly spaced over each shard), their bytes per token read from the
manifest.

    .venv/bin/python bench/quant_effect.py \\
        --case mores-2ib-s2 CKPT_DIR STORE_DIR --case prettr-l5-e128 CKPT_DIR STORE_DIR \\
        --collection ../shared/data/scifact --candidates bench/results/cpu-core-360/runs/bm25.trec.zst --work /tmp/quant
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from aheadrank.indexer.topics import read_qrels
from aheadrank.store import StoreReader, StoreWriter
from aheadrank.store.quant import decode_codebooks, encode_codebooks, fit_codebooks
from benchkit import machine_info, write_record
from rich.console import Console
from rich.table import Table

from aheadrank.evaluation import evaluate, paired_test, per_query, read_run

REPO = Path(__file__).resolve().parents[1]
MAX_LOSS = 0.01  # issue 16: the smallest store that keeps nDCG@10 within 1 % (relative) of the reference
console = Console(width=None if sys.stdout.isatty() else 160)


def requantise(src: Path, dst: Path, batch: int = 256, dtype: str = "int8") -> float:
    """The ``dtype`` copy (int8, book4, book2) of a float16 store (dense/ copied as it is); seconds taken (0 if it
    exists)."""
    if (dst / "manifest.json").exists():
        return 0.0
    t0 = time.perf_counter()
    with StoreReader(src) as reader:
        spec = dataclasses.replace(reader.spec, dtype=dtype)
        docids = reader.docids()
        with StoreWriter(dst, spec) as writer:
            for s in range(0, len(docids), batch):
                got = reader.fetch(docids[s : s + batch])
                for i, docid in enumerate(got.docids):
                    n = int(got.lengths[i])
                    writer.add(docid, {k: v[i, :n] for k, v in got.fields.items()})
    if (src / "dense").is_dir():
        shutil.copytree(src / "dense", dst / "dense")
    return time.perf_counter() - t0


INT4_LEVELS = 7  # symmetric 4-bit: -7..7 (the 16th code unused, as int8 uses -127..127)
INT4_SAMPLE_TOKENS = 200_000
INT4_QUANTILE = 0.9999
# the simulated settings: bits, one scale per token or dimension
SIM_MODE = re.compile(r"int([2-7])-(token|dim|book)")


def mode_bits(mode: str) -> tuple[int, int, bool]:
    """(bits, levels, per token) of a simulated setting ``int<bits>-token`` / ``int<bits>-dim`` (2-7 bits):
    symmetric levels -(2^(bits-1) - 1)..2^(bits-1) - 1; ``int<bits>-book``: 2^bits levels of a codebook per
    dimension (``levels`` is then that count)."""
    m = SIM_MODE.fullmatch(mode)
    if m is None:
        raise ValueError(f"not a simulated setting: {mode!r} (int<2-7>-token, int<2-7>-dim or int<2-7>-book)")
    bits = int(m.group(1))
    levels = 2**bits if m.group(2) == "book" else 2 ** (bits - 1) - 1
    return bits, levels, m.group(2) == "token"


def sim_bytes_per_token(fields: dict[str, int], mode: str) -> float:
    """The bytes per token a store of ``mode`` would take: dim·bits/8 per field, plus a float16 scale per token
    and field for per-token scales (per-dimension scales: one set per collection, not per token)."""
    bits, _, per_token = mode_bits(mode)
    return sum(d * bits / 8 + (2 if per_token else 0) for d in fields.values())


def sample_tokens(reader: StoreReader, batch: int = 256) -> dict[str, torch.Tensor]:
    """Per field, up to INT4_SAMPLE_TOKENS real tokens [tokens, dim] in float32: the first documents' in store
    order (what a calibration at index time would see first)."""
    docids, seen, parts = reader.docids(), 0, {}
    for s in range(0, len(docids), batch):
        got = reader.fetch(docids[s : s + batch])
        for i in range(len(got.docids)):
            n = int(got.lengths[i])
            for k, v in got.fields.items():
                parts.setdefault(k, []).append(torch.as_tensor(v[i, :n]).float())
            seen += n
        if seen >= INT4_SAMPLE_TOKENS:
            break
    return {k: torch.cat(v)[:INT4_SAMPLE_TOKENS] for k, v in parts.items()}


def int4_dim_scales(
    reader: StoreReader, batch: int = 256, levels: int = INT4_LEVELS
) -> dict[str, torch.Tensor]:
    """Per field, one scale per dimension: the INT4_QUANTILE of |x| over the sample (:func:`sample_tokens`) /
    ``levels``."""
    return {
        k: torch.quantile(v.abs(), INT4_QUANTILE, dim=0).clamp(min=1e-12) / levels
        for k, v in sample_tokens(reader, batch).items()
    }


def calibration(reader: StoreReader, mode: str) -> dict[str, torch.Tensor]:
    """What a store of ``mode`` keeps per collection, per field: nothing for ``int<b>-token``, a scale per dimension
    [dim] for ``int<b>-dim``, a codebook per dimension [dim, 2^b] (``store.quant.fit_codebooks``: Lloyd-Max on the
    sample) for ``int<b>-book``."""
    bits, levels, per_token = mode_bits(mode)
    if per_token:
        return {}
    if mode.endswith("-book"):
        return {k: torch.as_tensor(fit_codebooks(v.numpy(), bits)) for k, v in sample_tokens(reader).items()}
    return int4_dim_scales(reader, levels=levels)


def int4_values(x: torch.Tensor, mode: str, dim_scale: torch.Tensor | None) -> torch.Tensor:
    """x [T, dim] as a store of ``mode`` would give it back: its levels (4 bits: -7..7) times the token's
    (``int<b>-token``) or the dimension's (``int<b>-dim``, clipped) scale, the token scale rounded to float16 as it
    would be stored; for ``int<b>-book`` (``dim_scale`` is then the codebooks [dim, 2^b]) each value's nearest level
    of its dimension's codebook."""
    _, levels, per_token = mode_bits(mode)
    x = x.float()
    if mode.endswith("-book"):
        books = dim_scale.numpy()
        return torch.as_tensor(decode_codebooks(encode_codebooks(x.numpy(), books), books))
    if per_token:
        scale = (x.abs().amax(-1, keepdim=True) / levels).half().float().clamp(min=1e-12)
    else:
        scale = dim_scale[None, :]
    return (torch.round(x / scale).clamp(-levels, levels) * scale).half()


def simulate_int4(src: Path, dst: Path, mode: str, batch: int = 256) -> tuple[float, float]:
    """A float16 store of the values ``mode`` (``int<b>-token`` / ``-dim`` / ``-book``) would store (dense/ copied as it
    is); (seconds taken, 0 if it exists, and the bytes per token that store would take)."""
    t0 = time.perf_counter()
    with StoreReader(src) as reader:
        per_token = sim_bytes_per_token(reader.spec.fields, mode)
        if (dst / "manifest.json").exists():
            return 0.0, per_token
        scales = calibration(reader, mode)
        docids = reader.docids()
        with StoreWriter(dst, reader.spec) as writer:
            for s in range(0, len(docids), batch):
                got = reader.fetch(docids[s : s + batch])
                for i, docid in enumerate(got.docids):
                    n = int(got.lengths[i])
                    fields = {
                        k: int4_values(torch.as_tensor(v[i, :n]), mode, scales.get(k)).numpy()
                        for k, v in got.fields.items()
                    }
                    writer.add(docid, fields)
    if (src / "dense").is_dir():
        shutil.copytree(src / "dense", dst / "dense")
    return time.perf_counter() - t0, per_token


def bytes_per_token(store: Path) -> float:
    with StoreReader(store) as reader:
        m = reader.manifest
        return m.n_bytes / max(1, m.n_tokens)


def rerank(ckpt: Path, store: Path, args, out: Path, pure: bool) -> float:
    if not out.exists():
        cmd = [
            sys.executable,
            "-m",
            "aheadrank.cli",
            "rerank-run",
            "--checkpoint",
            str(ckpt),
            "--store",
            str(store),
        ]
        cmd += ["--queries", str(args.collection), "--split", "test", "--candidates", str(args.candidates)]
        cmd += ["--depth", str(args.depth), "--out", str(out), "--pure" if pure else "--with-priors"]
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
        subprocess.run(cmd, check=True, env=env, cwd=REPO)
    qrels = read_qrels(args.collection, "test")
    return float(evaluate(read_run(out), qrels, ["ndcg_cut_10"])["ndcg_cut_10"])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", nargs=3, action="append", metavar=("NAME", "CKPT", "STORE"), required=True)
    p.add_argument("--collection", type=Path, required=True, help="BEIR folder (queries, qrels/test.tsv)")
    p.add_argument("--candidates", type=Path, required=True, help="the BM25 run of the test queries")
    p.add_argument("--depth", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--work", type=Path, required=True, help="int8 stores and runs go here")
    p.add_argument("--int4", action="store_true", help="also the two simulated 4-bit settings (module doc)")
    p.add_argument(
        "--dim-bits",
        type=int,
        nargs="+",
        default=[],
        choices=range(2, 8),  # 8 bits is the int8 store itself
        help="also simulated per-dimension settings of these bits (2-7)",
    )
    p.add_argument(
        "--book-bits",
        type=int,
        nargs="+",
        default=[],
        choices=range(2, 8),
        help="also simulated per-dimension codebooks of 2^bits levels (Lloyd-Max on a sample; 2-7 bits)",
    )
    p.add_argument(
        "--store-dtypes",
        nargs="+",
        default=[],
        choices=["book4", "book2"],
        help="also real stores of these codebook dtypes (written by StoreWriter from the float16 store)",
    )
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "quant_effect.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.perf_counter()
    rows = []
    for name, ckpt, store in args.case:
        ckpt, store = Path(ckpt), Path(store)
        int8 = args.work / f"{name}-int8"
        seconds = requantise(store, int8)
        settings = [("float16", store, None), ("int8", int8, None)]
        written = {"int8": seconds}
        for dtype in args.store_dtypes:
            path = args.work / f"{name}-{dtype}"
            written[dtype] = requantise(store, path, dtype=dtype)
            settings.append((dtype, path, None))
        modes = (["int4-token", "int4-dim"] if args.int4 else []) + [f"int{b}-dim" for b in args.dim_bits]
        modes += [f"int{b}-book" for b in args.book_bits]
        if modes:
            for mode in dict.fromkeys(modes):
                path = args.work / f"{name}-{mode}-sim"
                settings.append((mode, path, simulate_int4(store, path, mode)))
        for dtype, path, sim in settings:
            row = {"case": name, "dtype": dtype, "store": str(path)}
            if sim is None:
                row["bytes_per_token"] = bytes_per_token(path)
            else:  # a 4-bit store's size, computed: this float16 store only holds its values
                row["bytes_per_token"], row["simulated"], row["simulate_s"] = sim[1], True, round(sim[0], 1)
            for pure in (True, False):
                label = "pure" if pure else "priors"
                run = args.work / f"{name}-{dtype}-{label}.trec"
                row[f"ndcg10_{label}"] = rerank(ckpt, path, args, run, pure)
                row[f"run_{label}"] = str(run)
            if dtype in written:
                row["requantise_s"] = round(written[dtype], 1)
            rows.append(row)
            console.print(row)
    by = {(r["case"], r["dtype"]): r for r in rows}
    qrels = read_qrels(args.collection, "test")
    # per query against the case's float16 store: the paired t-test, and how many queries moved
    for r in rows:
        ref = by[(r["case"], "float16")]
        for label in ("pure", "priors"):
            a, b = (
                per_query(read_run(x[f"run_{label}"]), qrels, ["ndcg_cut_10"])["ndcg_cut_10"]
                for x in (ref, r)
            )
            r[f"p_vs_float16_{label}"] = None if r is ref else paired_test(a, b, "ndcg_cut_10").p
            r[f"queries_down_{label}"] = sum(b[q] < a[q] for q in a)
            r[f"queries_up_{label}"] = sum(b[q] > a[q] for q in a)
    first = rows[0]  # the first case's float16 store: the reference of a smaller setting's total loss
    for r in rows:
        ref = by[(r["case"], "float16")]
        for label in ("pure", "priors"):
            r[f"rel_loss_{label}"] = 1 - r[f"ndcg10_{label}"] / ref[f"ndcg10_{label}"]
            r[f"rel_loss_vs_first_{label}"] = 1 - r[f"ndcg10_{label}"] / first[f"ndcg10_{label}"]
    within = [r for r in rows if r["rel_loss_vs_first_pure"] <= MAX_LOSS]
    smallest = min(within, key=lambda r: r["bytes_per_token"])
    table = Table(title=f"SciFact test, BM25 top-{args.depth}: nDCG@10 float16 vs int8 store")
    for col in (
        "case",
        "dtype",
        "B/token",
        "pure",
        "loss",
        "p",
        "down / up",
        f"vs {first['case']}",
        "with priors",
        "loss",
    ):
        table.add_column(col, justify="left" if col in ("case", "dtype") else "right")
    for r in rows:
        table.add_row(
            r["case"],
            r["dtype"],
            f"{r['bytes_per_token']:.0f}",
            f"{r['ndcg10_pure']:.4f}",
            f"{100 * r['rel_loss_pure']:+.2f}%",
            "" if r["p_vs_float16_pure"] is None else f"{r['p_vs_float16_pure']:.2g}",
            f"{r['queries_down_pure']} / {r['queries_up_pure']}",
            f"{100 * r['rel_loss_vs_first_pure']:+.2f}%",
            f"{r['ndcg10_priors']:.4f}",
            f"{100 * r['rel_loss_priors']:+.2f}%",
        )
    console.print(table)
    console.print(
        f"smallest store within {100 * MAX_LOSS:.0f}% of {first['case']} float16 (pure): {smallest['case']} "
        f"{smallest['dtype']}, {smallest['bytes_per_token']:.0f} B/token"
    )
    note = (
        "rel_loss = 1 - nDCG@10(int8) / nDCG@10(float16) of the same checkpoint and candidates; "
        "rel_loss_vs_first = the same against the first case's float16 store; p_vs_float16: two-sided paired t-test "
        "of the per-query nDCG@10 against the case's float16 store; queries_down / up: queries whose nDCG@10 fell / rose"
    )
    write_record(
        args.out,
        "bench/quant_effect.py",
        argv,
        machine_info(args.threads),
        t_start,
        rows=rows,
        note=note,
        smallest_within={
            "max_rel_loss": MAX_LOSS,
            "case": smallest["case"],
            "dtype": smallest["dtype"],
            "bytes_per_token": smallest["bytes_per_token"],
        },
    )
    console.print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
