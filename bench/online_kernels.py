"""Old vs new online kernels, side by side in one run (issue 16): every pair is timed interleaved, round
after round, on the same inputs, so a busy machine slows both alike; the ratio is what this reports.

* ``tk``: TK's kernel stage as the formula reads (``kernel_features_reference``: one [B, Tq, Td, 11] tensor,
  seven passes) vs the fused, blocked stage (``kernel_features``), inside the whole timed path
  (``query_state`` + ``score_batch`` over N candidates in chunks).
* ``stored``: MORES S2 (and PreTTR, TK) from float16 fields: widened to float32 up front (the path before
  issue 16) vs handed over as stored (the attention widens a block of documents at a time). MORES S1 with a query
  of 32 pieces or more (``--query-pieces 40``) projects D to keys and values: a block at a time (since 2026-12-06;
  before, the whole candidate set was widened once an interaction block).
* ``native``: the compiled kernels (``aheadrank/kernels/native_kernels.c``: the attention of a few query rows — MORES S2's
  cross-attention over stored keys and values and its blocks' self-attention, the query encoders, PreTTR's folded
  [CLS] rows — and TK's kernel stage) vs the PyTorch code they replace (``AHEADRANK_NATIVE=0``), from float16
  fields and, for MORES and PreTTR, int8 fields (``QuantizedField``), inside the whole timed path.
* ``blocks``: TK's cosine blocks at the default widening size (1 MB of float32, at least 8 documents) vs
  ``tk.COSINE_BLOCK_FACTOR`` times it, inside the whole timed path (the GEMM path, as in ``tkpass``' old).
* ``tkpass``: TK's cosines as one GEMM over widened blocks of the stored vectors, then the compiled kernel
  stage, vs the compiled pass that computes both from the stored vectors (``aheadrank.kernels.tk.stored_sums``), from
  float16 and int8 fields, inside the whole timed path.
* ``prettrfold``: PreTTR l = L − 1 decompressing each block and attending over ŝ vs attending over r with the
  decompression folded away (``PrettrRanker.context_folded``), from float16 and int8 fields, in the whole path.
* ``layer``: a query encoder's layers over a few rows as separate PyTorch calls vs one compiled call each
  (``aheadrank.kernels.layer.native``), in the whole timed path.
* ``source``: the compiled kernels built from another revision's ``native_kernels.c`` (``--source-rev``,
  default HEAD: what the working tree changes) vs the working tree's, inside the whole timed path; an entry point
  the old source lacks declines there (its caller runs the code it falls back to). Entry points both have must
  take the same arguments (ctypes cannot check): compare revisions on the same side of a signature change.
* ``int8``: fetch + score of N candidates from a store on disk (warm page cache): float16 store vs int8 store
  served the old way (dequantised to a float16 copy, then widened) and the new way (int8 + scales handed to
  the ranker as ``QuantizedField``, dequantised a block at a time into the compute dtype).
* ``basis``: PreTTR's folded path with G's quadratic form as a GEMM (as before the stored basis) vs the diagonal
  G of the canonical stored basis (``PrettrRanker.canonicalize_basis``: σ_j in O(e)), in the whole timed path.
* ``queryparts``: PreTTR l = L − 1's query-only tensors ([CLS]'s folded rows and scores over the query's tokens,
  the folded path's rows, u_h·β, log-sum-exps and value parts) made again for every
  chunk of candidates vs kept per query state (``PrettrRanker.query_parts``), in the whole timed path: the
  difference is one making per chunk after the first (N = 300 in chunks of 256: two chunks).
* ``queryside``: the query side alone (``query_state``: the query encoder's layers, each one compiled call) with
  the kernels of ``--source-rev`` and its layers' weights looked up through ``nn.Module`` attributes (as before
  commit 619441f) vs the working tree's kernels and the lookup through the modules' own dicts
  (``blocks._submodule``); the states' difference is the softmax's vectorised ``exp``.
* ``books``: the same from a float16 store vs the codebook stores ``book4`` and ``book2`` (decoded to float16 by
  the reader, a byte-table lookup per packed byte); the score difference is the codebooks' rounding.

Fields come from each ranker's own ``document_fields`` on random word pieces (untrained weights, seed 0);
the int8 store repeats 100 distinct documents under N docids.

    .venv/bin/python bench/online_kernels.py --threads 2                 # everything (about 10 min on 2 busy cores)
    .venv/bin/python bench/online_kernels.py --threads 2 --parts tk --rounds 5
    .venv/bin/python bench/online_kernels.py --threads 2 --parts stored --stored-rankers mores-2ib-s1 \
        --query-pieces 40 --out bench/results/kernels-s1-long-query.json
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import torch
from aheadrank.rankers import QuantizedField, blocks, prettr, tk
from aheadrank.rankers.text import pad
from aheadrank.rankers.variants import parse_variant
from aheadrank.store import StoreReader, StoreSpec, StoreWriter
from benchkit import cpu_sample, machine_info, score_head_reads_interaction, write_record
from rich.console import Console
from rich.table import Table

from aheadrank.kernels import layer as kernel_layer
from aheadrank.kernels import native
from aheadrank.kernels import tk as tk_stage
from aheadrank.rerank import stored_fields

REPO = Path(__file__).resolve().parents[1]
QUERY_PIECES = 16
FIRST_WORD_ID = 1000
console = Console(width=None if sys.stdout.isatty() else 160)


def interleaved(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, dict]:
    """Each function once per round, in turn, after one warm-up each: min and median ms per function."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {
        k: {
            "ms_min": min(v) * 1e3,
            "ms_median": statistics.median(v) * 1e3,
            "ms": [round(t * 1e3, 2) for t in v],
        }
        for k, v in times.items()
    }


def make_ranker(name: str, d: int):
    variant = parse_variant(name)
    # weights as a loaded checkpoint's (as bench/speed.py makes them): blocks.Linear packs those for oneDNN, not
    # inference tensors, which made every ranker here run its linear layers at MKL's slower rate before
    with torch.inference_mode(False):
        ranker = variant.init(seed=0, max_query_len=QUERY_PIECES, max_doc_len=d)
    if variant.strategy:
        ranker.strategy = variant.strategy
    return ranker.eval()


def inputs(ranker, n: int, d: int, seed: int = 0) -> tuple[tuple, dict[str, torch.Tensor], torch.Tensor]:
    """(query ids + mask, float16 fields [n, T, dim], mask [n, T]) from random word pieces."""
    g = torch.Generator().manual_seed(seed)
    vocab = int(ranker.config.bert["vocab_size"])
    q = torch.randint(FIRST_WORD_ID, vocab, (QUERY_PIECES,), generator=g).tolist()
    pieces = torch.randint(FIRST_WORD_ID, vocab, (n, d), generator=g).tolist()
    lengths = torch.randint(d // 2, d + 1, (n,), generator=g).tolist()  # mixed lengths: padding is real
    ids, mask = pad(
        [ranker.doc_ids(p[:k]) for p, k in zip(pieces, lengths, strict=True)], "cpu", ranker.text.pad
    )
    parts: dict[str, list[torch.Tensor]] = {}
    with torch.no_grad():  # fields are data: no autograd graph kept per batch (GBs at d = 493)
        for s in range(0, n, 32):
            for k, v in ranker.document_fields(ids[s : s + 32], mask[s : s + 32]).items():
                parts.setdefault(k, []).append(v.half())
    fields = {k: torch.cat(v) for k, v in parts.items()}
    return pad([ranker.query_ids(q)], "cpu", ranker.text.pad), fields, mask


def run_query(ranker, q, fields, mask, chunk: int) -> torch.Tensor:
    qs = ranker.query_state(*q)
    n = mask.shape[0]
    return torch.cat(
        [
            ranker.score_batch(qs, {k: v[s : s + chunk] for k, v in fields.items()}, mask[s : s + chunk])
            for s in range(0, n, chunk)
        ]
    )


@contextlib.contextmanager
def tk_kernels(stage: Callable):
    """TK scores through ``stage`` instead of the online kernel stage inside."""
    online = tk.kernel_features
    tk.kernel_features = stage
    try:
        yield
    finally:
        tk.kernel_features = online


def rel_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item()


def part_tk(args) -> list[dict]:
    rows = []
    for d in args.d:
        ranker = make_ranker("tk-2l", d)
        q, fields, mask = inputs(ranker, args.n, d)

        def formula(ranker=ranker, q=q, fields=fields, mask=mask):
            with tk_kernels(tk.kernel_features_reference):
                return run_query(ranker, q, fields, mask, args.chunk)

        def direct(ranker=ranker, q=q, fields=fields, mask=mask):
            with tk_kernels(tk.kernel_features_direct):
                return run_query(ranker, q, fields, mask, args.chunk)

        def chained(ranker=ranker, q=q, fields=fields, mask=mask):
            return run_query(ranker, q, fields, mask, args.chunk)

        want = formula()
        diffs = {"direct": rel_diff(direct(), want), "chained": rel_diff(chained(), want)}
        t = interleaved({"formula": formula, "direct": direct, "chained": chained}, args.rounds)
        formula_name = "kernel formula [B,Tq,Td,11]"
        direct_name = "blocked, one exp per kernel"
        chained_name = "blocked, chained (3 exp for 11 kernels)"
        for old, new, old_name, new_name in (
            ("formula", "direct", formula_name, direct_name),
            ("direct", "chained", direct_name, chained_name),
            ("formula", "chained", formula_name, chained_name),
        ):
            pair = {"old": t[old], "new": t[new]}
            rows.append(row("tk", "tk-2l", d, args.n, old_name, new_name, pair, diffs[new]))
    return rows


def cases(names: list[str], args):
    """(name, d, N, ranker, query, float16 fields, mask) per ranker and document length (N / 4 above d = 128), the
    score head reading the interaction (:func:`score_head_reads_interaction`)."""
    for name in names:
        for d in args.d:
            ranker = make_ranker(name, d)
            score_head_reads_interaction(ranker)
            n = args.n if d <= 128 else max(32, args.n // 4)
            yield (name, d, n, ranker, *inputs(ranker, n, d))


def part_stored(args) -> list[dict]:
    rows = []
    for name, d, n, ranker, q, fields, mask in cases(args.stored_rankers, args):

        def old(ranker=ranker, q=q, fields=fields, mask=mask):
            return run_query(ranker, q, {k: v.float() for k, v in fields.items()}, mask, args.chunk)

        def new(ranker=ranker, q=q, fields=fields, mask=mask):
            return run_query(ranker, q, fields, mask, args.chunk)

        diff = rel_diff(new(), old())
        t = interleaved({"old": old, "new": new}, args.rounds)
        rows.append(row("stored", name, d, n, "float16 widened up front", "from float16", t, diff))
    return rows


@contextlib.contextmanager
def environment(name: str, value: str):
    """``name`` set to ``value`` in the environment for the block, restored after (the kernels' switches are read
    at every call)."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def native_kernels(on: bool):
    """The compiled kernels switched on or off (``AHEADRANK_NATIVE``)."""
    return environment("AHEADRANK_NATIVE", "1" if on else "0")


def part_native(args) -> list[dict]:
    rows = []
    for name, d, n, ranker, q, half, mask in cases(args.native_rankers, args):
        stored = {"float16": half}
        if not name.startswith("tk"):
            stored["int8"] = {k: QuantizedField.quantize(v.float()) for k, v in half.items()}
        for dtype, fields in stored.items():

            def pytorch(ranker=ranker, q=q, fields=fields, mask=mask):
                with native_kernels(False):
                    return run_query(ranker, q, fields, mask, args.chunk)

            def compiled(ranker=ranker, q=q, fields=fields, mask=mask):
                with native_kernels(True):
                    return run_query(ranker, q, fields, mask, args.chunk)

            diff = rel_diff(compiled(), pytorch())
            t = interleaved({"old": pytorch, "new": compiled}, args.rounds)
            rows.append(row("native", name, d, n, f"PyTorch, {dtype}", f"compiled, {dtype}", t, diff))
    return rows


def tk_gemm_path():
    """TK's cosines by one GEMM over widened blocks of the stored vectors, then the kernel stage: the path before
    the compiled pass from the stored vectors (``aheadrank.kernels.tk.stored_sums`` declining, as where it does not apply)."""
    return mock.patch.object(tk_stage, "stored_sums", lambda *args, **kwargs: None)


def old_vs_new(part: str, names: list[str], old_path, old: str, new: str, args) -> list[dict]:
    """Rows of one part: per ranker, document length and stored dtype (float16, int8), the whole timed path with
    ``old_path()`` (a context manager that restores the old code) against the current code, interleaved."""
    rows = []
    for name, d, n, ranker, q, half, mask in cases(names, args):
        int8 = {k: QuantizedField.quantize(v.float()) for k, v in half.items()}
        for dtype, fields in {"float16": half, "int8": int8}.items():

            def before(ranker=ranker, q=q, fields=fields, mask=mask):
                with old_path():
                    return run_query(ranker, q, fields, mask, args.chunk)

            def now(ranker=ranker, q=q, fields=fields, mask=mask):
                return run_query(ranker, q, fields, mask, args.chunk)

            diff = rel_diff(now(), before())
            t = interleaved({"old": before, "new": now}, args.rounds)
            rows.append(row(part, name, d, n, f"{old}, {dtype}", f"{new}, {dtype}", t, diff))
    return rows


def part_tkpass(args) -> list[dict]:
    return old_vs_new("tkpass", args.tkpass_rankers, tk_gemm_path, "GEMM + kernel stage", "one pass", args)


def prettr_decompressing():
    """PreTTR decompressing each block (no fold)."""
    return mock.patch.object(prettr.PrettrRanker, "folds", lambda self, n: False)


def prettr_gram_gemm():
    """PreTTR's folded path computing G's quadratic form by its GEMM even where G is diagonal (the path before the
    stored basis made it so: ``DecompressionFold.diagonal`` None)."""
    real = prettr.PrettrRanker.decompression_fold

    def with_gemm(self, like):
        return dataclasses.replace(real(self, like), diagonal=None, quad=None)

    return mock.patch.object(prettr.PrettrRanker, "decompression_fold", with_gemm)


def part_basis(args) -> list[dict]:
    names = args.basis_rankers
    return old_vs_new("basis", names, prettr_gram_gemm, "G by its GEMM", "diagonal G (stored basis)", args)


def part_prettrfold(args) -> list[dict]:
    names = args.prettrfold_rankers
    return old_vs_new("prettrfold", names, prettr_decompressing, "decompressed", "folded", args)


def layer_apart():
    """Each layer over a few rows as its separate PyTorch calls, not one compiled call."""
    return mock.patch.object(kernel_layer, "native", lambda weights, x, mask: None)


def part_layer(args) -> list[dict]:
    return old_vs_new("layer", args.layer_rankers, layer_apart, "calls per layer", "one call", args)


def query_parts_per_chunk():
    """PreTTR's query-only tensors made for every chunk of candidates (nothing kept in the query state)."""
    made = prettr.PrettrRanker.query_parts
    return mock.patch.object(
        prettr.PrettrRanker, "query_parts", lambda self, q, q_mask, cache: made(self, q, q_mask, None)
    )


def part_queryparts(args) -> list[dict]:
    names = args.queryparts_rankers
    return old_vs_new("queryparts", names, query_parts_per_chunk, "per chunk", "per query", args)


class _Declining:
    """Another build of the kernels, whose missing entry points answer -1 (declined) as a build without them."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name: str):
        fn = getattr(self._lib, name, None)
        return fn if fn is not None else (lambda *args: -1)


def kernels_at(rev: str, folder: Path):
    """A context manager under which the rankers call the kernels compiled from ``rev``'s native_kernels.c."""
    for path in ("aheadrank/kernels/native_kernels.c", "rankers/native_kernels.c"):  # before the move
        found = subprocess.run(
            ["git", "-C", str(REPO), "show", f"{rev}:{path}"], capture_output=True, text=True
        )
        if found.returncode == 0:
            break
    found.check_returncode()
    text = found.stdout
    source = folder / "native_kernels.c"
    source.write_text(text)
    lib = _Declining(native.load_source(source, require_all=False))
    return lambda: mock.patch.object(native, "library", lambda: lib)


def part_source(args) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        old = kernels_at(args.source_rev, Path(tmp))
        return old_vs_new("source", args.source_rankers, old, f"C at {args.source_rev}", "C now", args)


def module_attribute_lookups():
    """``TransformerLayer.kernel_weights`` preceded by the layer's weights looked up through ``nn.Module`` attributes, as
    it did before the lookups went through the modules' own dicts (the same arguments: the cached ones)."""
    current = blocks.TransformerLayer.kernel_weights

    def looked_up(layer):
        att, inner = layer.attention, layer.intermediate.dense
        linears = (att.self.query, att.self.key, att.self.value, att.output.dense, inner, layer.output.dense)
        norms = (att.output.LayerNorm, layer.output.LayerNorm)
        if any(p is None for m in (*linears, *norms) for p in (m.weight, m.bias)):
            return None
        return current(layer)

    return mock.patch.object(blocks.TransformerLayer, "kernel_weights", looked_up)


def part_queryside(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        old_kernels = kernels_at(args.source_rev, Path(tmp))
        for name in args.queryside_rankers:
            ranker = make_ranker(name, 128)
            q, _, _ = inputs(ranker, 1, 16)

            def before(ranker=ranker, q=q):
                with old_kernels(), module_attribute_lookups():
                    return ranker.query_state(*q)

            def now(ranker=ranker, q=q):
                return ranker.query_state(*q)

            a, b = now(), before()
            diff = max(rel_diff(a[k], b[k]) for k in a.tensors if a[k].is_floating_point())
            t = interleaved({"old": before, "new": now}, args.rounds * 20)
            old = f"C at {args.source_rev}, attribute lookups"
            rows.append(row("queryside", name, 0, 0, old, "C now, dict lookups", t, diff))
    return rows


def part_blocks(args) -> list[dict]:
    rows = []
    chosen = tk.COSINE_BLOCK_FACTOR
    for name, d, n, ranker, q, fields, mask in cases(["tk-2l"], args):
        runs = {}
        for factor in sorted({1, chosen, 2 * chosen}):

            def run(ranker=ranker, q=q, fields=fields, mask=mask, factor=factor):
                with mock.patch.object(tk, "COSINE_BLOCK_FACTOR", factor), tk_gemm_path():
                    return run_query(ranker, q, fields, mask, args.chunk)

            runs[factor] = run
        t = interleaved(runs, args.rounds)
        for factor in runs:
            if factor != 1:
                diff = rel_diff(runs[factor](), runs[1]())
                pair = {"old": t[1], "new": t[factor]}
                rows.append(row("blocks", name, d, n, "1x block", f"{factor}x block", pair, diff))
    return rows


def part_int8(args) -> list[dict]:
    """Every int8 case over ``--int8-n`` candidates (``args.n`` restored after)."""
    return stored_parts(args, args.int8_rankers, int8_case)


def part_books(args) -> list[dict]:
    """Every codebook case over ``--int8-n`` candidates (``args.n`` restored after)."""
    return stored_parts(args, args.book_rankers, books_case)


def stored_parts(args, names: list[str], case: Callable) -> list[dict]:
    rows, n = [], args.n
    args.n = args.int8_n
    try:
        for name in names:
            rows += case(name, args)
    finally:
        args.n = n
    return rows


@contextlib.contextmanager
def stores_of(ranker, args, dtypes: tuple[str, ...], d: int):
    """Readers of stores of each dtype holding the same N documents (100 distinct ones repeated), and a
    function that fetches + scores all N from one of them."""
    q, fields, mask = inputs(ranker, 100, d)
    lengths = mask.sum(1).tolist()
    docids = [f"d{i}" for i in range(args.n)]

    def fetch_score(reader: StoreReader, dequantize: bool = True) -> torch.Tensor:
        qs = ranker.query_state(*q)
        out = []
        for s in range(0, len(docids), args.chunk):
            batch = reader.fetch_torch(docids[s : s + args.chunk], dequantize=dequantize)
            out.append(ranker.score_batch(qs, stored_fields(batch), batch.mask))
        return torch.cat(out)

    if args.tmp:
        Path(args.tmp).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        readers = {}
        try:
            for dtype in dtypes:
                spec = StoreSpec(ranker.field_dims(), "bench", ranker.kind, max_doc_len=d + 2, dtype=dtype)
                with StoreWriter(Path(tmp) / dtype, spec) as writer:
                    for i, docid in enumerate(docids):
                        j = i % 100
                        writer.add(docid, {k: v[j, : lengths[j]].numpy() for k, v in fields.items()})
                readers[dtype] = StoreReader(Path(tmp) / dtype)
            yield readers, fetch_score
        finally:
            for r in readers.values():
                r.close()


def int8_case(name: str, args, d: int = 128) -> list[dict]:
    """One ranker: a float16 and an int8 store of the same N documents; fetch + score all N three ways."""
    with stores_of(make_ranker(name, d), args, ("float16", "int8"), d) as (readers, fetch_score):
        fns = {
            "float16": lambda: fetch_score(readers["float16"], True),
            "int8 old": lambda: fetch_score(readers["int8"], True),
            "int8 new": lambda: fetch_score(readers["int8"], False),
        }
        s16, old, new = (fn() for fn in fns.values())
        t = interleaved(fns, args.rounds)
    no_copy = "int8 store, no dequantised copy"
    return [
        row("int8", name, d, args.n, "float16 store", no_copy, pair(t, "float16", "int8 new"), rel_diff(new, s16)),
        row("int8", name, d, args.n, "int8 store, float16 copy", no_copy, pair(t, "int8 old", "int8 new"),
            rel_diff(new, old)),
    ]  # fmt: skip


def books_case(name: str, args, d: int = 128) -> list[dict]:
    """One ranker: float16, book4 and book2 stores of the same N documents; fetch + score all N from each (the
    codebook stores decode to float16 as they are fetched)."""
    dtypes = ("float16", "book4", "book2")
    with stores_of(make_ranker(name, d), args, dtypes, d) as (readers, fetch_score):
        fns = {dtype: (lambda r=readers[dtype]: fetch_score(r)) for dtype in dtypes}
        scores = {dtype: fn() for dtype, fn in fns.items()}
        t = interleaved(fns, args.rounds)
    return [
        row("books", name, d, args.n, "float16 store", f"{dtype} store", pair(t, "float16", dtype),
            rel_diff(scores[dtype], scores["float16"]))
        for dtype in dtypes[1:]
    ]  # fmt: skip


def pair(t: dict, old: str, new: str) -> dict:
    return {"old": t[old], "new": t[new]}


def row(part: str, ranker: str, d: int, n: int, old: str, new: str, t: dict, diff: float) -> dict:
    return {
        "part": part,
        "ranker": ranker,
        "d": d,
        "n_docs": n,
        "old": old,
        "new": new,
        "old_ms_min": t["old"]["ms_min"],
        "new_ms_min": t["new"]["ms_min"],
        "old_ms_median": t["old"]["ms_median"],
        "new_ms_median": t["new"]["ms_median"],
        "speedup_min": t["old"]["ms_min"] / t["new"]["ms_min"],
        "speedup_median": t["old"]["ms_median"] / t["new"]["ms_median"],
        "max_rel_score_diff": diff,
        "times_ms": {"old": t["old"]["ms"], "new": t["new"]["ms"]},
    }


# every part, in the order they run
PARTS = {
    "tk": part_tk,
    "stored": part_stored,
    "native": part_native,
    "blocks": part_blocks,
    "tkpass": part_tkpass,
    "prettrfold": part_prettrfold,
    "layer": part_layer,
    "queryparts": part_queryparts,
    "source": part_source,
    "queryside": part_queryside,
    "int8": part_int8,
    "books": part_books,
    "basis": part_basis,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    p.add_argument(
        "--n", type=int, default=300, help="candidates (stored part at d > 128: n / 4; int8: 1000)"
    )
    p.add_argument("--int8-n", type=int, default=1000, help="candidates fetched and scored in the int8 part")
    p.add_argument("--d", type=int, nargs="+", default=[128, 493], help="document word pieces")
    p.add_argument("--chunk", type=int, default=128, help="candidates per score_batch call")
    p.add_argument(
        "--query-pieces",
        type=int,
        default=QUERY_PIECES,
        help="word pieces of the query (MORES S1 projects D instead of folding from 32 on: 12 heads × 32 ≥ 384)",
    )
    p.add_argument("--rounds", type=int, default=7, help="interleaved timed rounds per pair")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument(
        "--stored-rankers",
        nargs="+",
        default=["mores-2ib-s2", "mores-1ib-s2", "prettr-l5-e128", "prettr-l5-e0", "tk-2l"],
    )
    p.add_argument(
        "--native-rankers",
        nargs="+",
        default=["mores-1ib-s2", "mores-2ib-s2", "prettr-l5-e0", "prettr-l5-e128", "tk-2l"],
    )
    p.add_argument("--tkpass-rankers", nargs="+", default=["tk-1l", "tk-2l"])
    p.add_argument(
        "--layer-rankers", nargs="+", default=["tk-2l", "tk-6l-base", "prettr-l5-e0", "mores-1ib-s2"]
    )
    p.add_argument("--prettrfold-rankers", nargs="+", default=["prettr-l5-e128"])
    p.add_argument("--basis-rankers", nargs="+", default=["prettr-l5-e128"])
    p.add_argument("--queryparts-rankers", nargs="+", default=["prettr-l5-e128", "prettr-l5-e0"])
    p.add_argument(
        "--queryside-rankers", nargs="+", default=["prettr-l5-e128", "mores-1ib-s2", "mores-2ib-s2", "tk-2l"]
    )
    p.add_argument(
        "--source-rankers",
        nargs="+",
        default=["mores-1ib-s2", "mores-2ib-s2", "prettr-l5-e0", "prettr-l5-e128", "tk-2l"],
    )
    p.add_argument(
        "--source-rev", default="HEAD", help="the revision whose native_kernels.c the source part compares"
    )
    p.add_argument("--int8-rankers", nargs="+", default=["mores-2ib-s2", "prettr-l5-e128", "tk-2l"])
    p.add_argument(
        "--book-rankers",
        nargs="+",
        default=["prettr-l5-e128", "prettr-l5-e0", "mores-2ib-s1", "mores-2ib-s2"],
    )
    p.add_argument("--tmp", default=None, help="folder for the int8 and books parts' temporary stores")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "kernels.json")
    args = p.parse_args(argv)
    args.threads = args.threads or os.cpu_count() or 1
    return args


def main(argv: list[str] | None = None) -> int:
    global QUERY_PIECES
    args = parse_args(argv)
    QUERY_PIECES = args.query_pieces  # read by make_ranker and inputs
    torch.set_num_threads(args.threads)
    info = machine_info(args.threads)
    console.print(f"[bold]{info['cpu']}[/], {args.threads} threads, torch {info['torch']}")
    t_start, busy_start = time.perf_counter(), cpu_sample()
    rows: list[dict] = []
    with torch.inference_mode():
        for name, part in PARTS.items():
            if name in args.parts:
                rows += part(args)
    busy_end = cpu_sample()
    table = Table(title="old vs new, interleaved (ms: min / median over the rounds)")
    for col in (
        "part",
        "ranker",
        "d",
        "N",
        "old",
        "new",
        "old ms",
        "new ms",
        "× (min)",
        "× (median)",
        "max rel Δscore",
    ):
        table.add_column(col, justify="left" if col in ("part", "ranker", "old", "new") else "right")
    for r in rows:
        table.add_row(
            r["part"],
            r["ranker"],
            str(r["d"]),
            str(r["n_docs"]),
            r["old"],
            r["new"],
            f"{r['old_ms_min']:.1f} / {r['old_ms_median']:.1f}",
            f"{r['new_ms_min']:.1f} / {r['new_ms_median']:.1f}",
            f"{r['speedup_min']:.2f}",
            f"{r['speedup_median']:.2f}",
            f"{r['max_rel_score_diff']:.1e}",
        )
    console.print(table)
    dt = busy_end[0] - busy_start[0]
    others = ((busy_end[1] - busy_start[1]) - (busy_end[2] - busy_start[2])) / os.sysconf("SC_CLK_TCK") / dt
    info["load_average_end"] = list(os.getloadavg())
    note = (
        "speedup = old / new time; int8 rows: old = the float16 store (first) or the int8 store's"
        " dequantised-copy path (second); within 1.2x of float16 means speedup >= 1/1.2"
    )
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    result = write_record(
        args.out,
        "bench/online_kernels.py",
        argv,
        info,
        t_start,
        other_processes_cores_mean=round(others, 2),
        settings=settings,
        note=note,
        rows=rows,
    )
    console.print(f"wrote {args.out} ({result['wall_s']} s, other processes {others:.1f} cores)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
