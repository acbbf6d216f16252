"""Speed of every ranker's online path against the ``bert`` cross-encoder, document fields already in memory.

One query of exactly 16 word pieces against N candidate documents of d word pieces each (random token ids
from the vocabulary, special tokens and ``[unused*]`` excluded; the same documents for every ranker). Per
ranker, untimed: the document fields are computed once (``document_fields`` semantics, in chunks), rounded
to float16 and kept in memory as padded tensors + mask, exactly as the store hands them over. Timed, under
``torch.inference_mode``: ``query_state`` + ``score_batch`` over all N documents in chunks, median (and min)
of ``--repeats`` runs after a warm-up. Before timing, a sanity check: scores from the float16 fields rank
the first ``--check-n`` documents as the float32 fields do (Kendall τ printed, not fatal).

Each row also carries an analytic count of the matmul FLOPs of what the timed path computes (2·m·n·k per
matmul; TK's RBF kernels add exp() calls, counted separately), and the FLOP floor = FLOPs / the machine's
measured float32 matmul GFLOP/s, so each row shows how close it runs to the compute floor.

d = 512: ``bert`` and ``prettr`` run ``[CLS] q [SEP] d [SEP]`` in at most 512 positions, so every ranker
gets 512 − 16 − 3 = 493 word pieces at that setting (``d_pieces`` in the JSON).

    .venv/bin/python bench/speed.py                      # the full run (N = 1000, d = 128 and 512)
    .venv/bin/python bench/speed.py --quick              # smoke run (N = 48, few repeats)
    .venv/bin/python bench/speed.py --d 128 --rankers 'mores-*' bert --repeats 7
    python bench/speed.py --device cuda --no-int8 --no-profile   # on a GPU: the same paths, every tensor there

With ``--device cuda`` the rankers, the query and the candidates' float16 fields live on the GPU (as a store
held in GPU memory would hand them over; host-to-device copies are not timed), timings synchronise the
device, and the floor is the GPU's own float32 matmul rate (TF32 off, PyTorch's default).
"""

from __future__ import annotations

import argparse
import contextlib
import fnmatch
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from aheadrank.rankers import QuantizedField, Ranker, blocks, init_ranker, prettr
from aheadrank.rankers.base import SCORE_BATCH
from aheadrank.rankers.blocks import key_mask
from aheadrank.rankers.text import pad, positions
from aheadrank.rankers.variants import CATALOGUE as VARIANTS
from aheadrank.rankers.variants import Variant, parse_variant
from benchkit import cpu_sample, machine_info, score_head_reads_interaction
from rich.console import Console
from rich.table import Table
from scipy.stats import kendalltau
from torch import Tensor

from aheadrank.errors import CheckpointError
from aheadrank.kernels import native
from aheadrank.kernels.compiled import compile_ranker

REPO = Path(__file__).resolve().parents[1]
QUERY_PIECES = 16
FIRST_WORD_ID = 1000  # below: [PAD], [unusedN], [UNK], [CLS], [SEP], [MASK] in the BERT vocabulary
# How a row is timed depends on its analytic FLOPs per pass (not on a measured rate, so every run treats
# the same row the same way). Chunk sizes are tried on all N documents by rows of at most FAST_GFLOP. "All N at once"
# was the slowest choice for every row in the first full runs (N = 1000: float32 copies of the fields fell out of
# cache), so it is tried only when N <= ALL_AT_ONCE_MAX; --chunk N forces it. Since the paths score the stored
# fields in place, a chunk's fixed cost (its weights read again, its query-only parts, ~25 small ops) is what
# chunking adds: N = 300 in one pass against 256 + 44, interleaved in one process (bench/chunks.py at 7ad67b2, bench/results/chunks.json):
# PreTTR l5/e128 0.90x the time at d = 128 and 0.94x at 493, l5/e0 0.94x / 0.96x, MORES 1xIB S2 0.97x / 0.95x.
CHUNK_CANDIDATES = (32, 64, 128, 256)
ALL_AT_ONCE_MAX = 512
FAST_GFLOP = 200.0
SLOW_CHUNKS = (16, 32)  # other rows: tried on the first 32 documents
CHUNK_TRIALS = 3  # timed runs per chunk size for the fast rows (the best of them counts)
SLOW_GFLOP = 2000.0  # bert and rows above this get --slow-repeats runs ...
VERY_SLOW_GFLOP = 6000.0  # ... and rows above this (bert at d = 512) --very-slow-repeats
CONTENDED = 0.5  # other processes' cores during a timed run above which the run is repeated (--retries)
console = Console(width=None if sys.stdout.isatty() else 160)


# ---- the rows ---------------------------------------------------------------------------------------------
# rows are the registry's variants (rankers/variants.py), but for EARL Tied: the same online math and cost
# as the untied MORES row
CATALOGUE = tuple(parse_variant(name) for name in VARIANTS if name != "mores-2ib-tied")
# PreTTR l = 4 re-runs a whole layer over all 16 + d positions per document (a quarter of bert), so only
# e = 128 is in the default set; --rankers 'prettr-*' adds e = 0 and e = 256.
DEFAULT_ROWS = tuple(r.name for r in CATALOGUE if r.name not in ("prettr-l4-e0", "prettr-l4-e256"))

# (d, row, minimum speed-up over bert at the same d)
SPEEDUP_TARGETS = (
    (128, "mores-1ib-s2", 35.0),
    (128, "mores-2ib-s2", 20.0),
    (128, "prettr-l5-e128", 20.0),
    (128, "tk-2l", 50.0),
    (512, "mores-2ib-s2", 50.0),
)
# --paths: what each path sets AHEADRANK_NATIVE to (the compiled path traces and runs with every kernel off)
PATH_NATIVE = {"reference": "none", "compiled": "none", "native": "all"}
PATH_NATIVE.update({f"native-no-{f}": f"-{f}" for f in native.FAMILIES})
PATHS = (*PATH_NATIVE, "families")
# every online path within 2x of its FLOP floor, but TK within 4x: its 11 RBF kernels are element-wise work
# that the matmul floor does not count
FLOOR_TARGET = 2.0
TK_FLOOR_TARGET = 4.0


def floor_target(row: dict) -> float:
    return TK_FLOOR_TARGET if row["kind"] == "tk" else FLOOR_TARGET


# ---- analytic FLOPs (matmuls only, 2·m·k·n each) ------------------------------------------------------------
def lin(m: int, k: int, n: int) -> int:
    return 2 * m * k * n


def attend(tq: int, tk: int, n: int) -> int:
    """softmax(QKᵀ)V for tq query rows over tk keys, all heads together: QKᵀ and PV, 2·tq·tk·n each."""
    return 4 * tq * tk * n


def layer_flops(t: int, n: int, f: int) -> int:
    """A full BERT layer over t tokens: Q, K, V, O projections, attention, FFN n→f→n."""
    return 4 * lin(t, n, n) + attend(t, t, n) + lin(t, n, f) + lin(t, f, n)


def one_row_query(n: int) -> int:
    """[CLS]'s query and, per head, the key map folded into it (u_h = W_khᵀ·q_h): ``Attention.one_row_context``."""
    return 2 * lin(1, n, n)


def one_row_rest(t: int, n: int, f: int, heads: int) -> int:
    """The rest of a [CLS]-only layer over t tokens: per head the scores u_h·x_j and the weighted sum Σ_j p_j·x_j
    (2·heads·t·n each), the value map after the sum, O, FFN for one row. No token is projected to a key or value."""
    return 4 * heads * t * n + 2 * lin(1, n, n) + lin(1, n, f) + lin(1, f, n)


def cls_layer_flops(t: int, n: int, f: int, heads: int) -> int:
    """A BERT layer computing only the [CLS] row, as ``Attention.one_row_context`` does it."""
    return one_row_query(n) + one_row_rest(t, n, f, heads)


def count_flops(ranker: Ranker, tq: int, td: int, n_docs: int, n_chunks: int) -> dict:
    """FLOPs of one timed query: ``query_state`` once, per-chunk work, per-document ``score_batch`` work."""
    c = ranker.config
    n, f, L = c.hidden, int(c.bert["intermediate_size"]), c.n_layers
    heads = int(c.bert["num_attention_heads"])
    query = per_chunk = per_doc = exps = 0
    head = lin(1, n, 1)
    if ranker.kind == "bert":
        t = tq + td
        per_doc = (L - 1) * layer_flops(t, n, f) + cls_layer_flops(t, n, f, heads) + head
    elif ranker.kind == "mores":
        K = c.ibs
        query = (L - K) * layer_flops(tq, n, f) + lin(tq, n, n)  # query module + IB 1's cross-attention Q
        # S1 online: D's key and value maps folded into the queries where h·Tq < n (Attention.context_of)
        folded = ranker.strategy == "s1" and heads * tq < n
        if folded:  # IB 1's key map folded into its (query-only) rows, once per score_batch
            per_chunk += lin(tq, n, n)
        for k in range(K):
            if k > 0:
                per_doc += lin(tq, n, n)  # cross-attention Q of IB k (depends on the document)
            if folded:
                if k > 0:
                    per_doc += lin(tq, n, n)  # IB k's key map folded into its rows
                per_doc += 2 * lin(heads * tq, n, td) + lin(tq, n, n)  # per head and row: scores, sums; V map
            else:
                if ranker.strategy == "s1":
                    per_doc += 2 * lin(td, n, n)  # D -> K, V online
                per_doc += attend(tq, td, n)
            per_doc += lin(tq, n, n)  # cross-attention output projection
            last_cls = k == K - 1 and c.pooling == "cls"
            per_doc += cls_layer_flops(tq, n, f, heads) if last_cls else layer_flops(tq, n, f)
        if c.sim:
            # A(q̄): the query alone through the IBs' layers, its value map; per document mean_d V as one more row
            # of the last cross-attention (its weighted sum) and of its output projection
            query += K * layer_flops(tq, n, f) + lin(1, n, n)
            per_doc += 2 * td * n + lin(1, n, n)
        per_doc += head
    elif ranker.kind == "prettr":
        split, e = c.layer, c.compress
        query = split * layer_flops(tq, n, f)
        folded = split == L - 1 and e and e <= prettr.FOLD_DECOMPRESSION * n
        width = e + 1  # the folded attention's keys and values [r/σ, 1/σ]
        per_doc = lin(td, e, n) if e and not folded else 0  # decompression
        if split == L - 1:
            # [CLS] is the query's: its folded query, and its scores and sums over the query's own tokens, once
            # per batch (PrettrRanker.upper_from_stored: the same for every document)
            per_chunk = one_row_query(n) + 4 * heads * tq * n
        if folded:  # PrettrRanker.context_folded: no decompression, attention over [r/σ, 1/σ]
            # G's quadratic form per token (diagonal in a canonical basis: 2·e, else a GEMM), scores and sums over
            # the e + 1 values; per head the sums mapped to its value vector (the value map folded into the map
            # back: e + 1 → dh per head, e + 1 → n in all), then O and the FFN for [CLS]
            diagonal = prettr.gram_is_diagonal(ranker.decompression_gram())
            per_doc += (
                (2 * td * e if diagonal else lin(td, e, e))
                + 4 * heads * td * width
                + lin(1, width, n)
                + one_row_rest(0, n, f, heads)
                - lin(1, n, n)  # one_row_rest's value map, folded away
            )
        elif split == L - 1:
            per_doc += one_row_rest(td, n, f, heads)
        else:
            t = tq + td
            per_doc += (L - 1 - split) * layer_flops(t, n, f) + cls_layer_flops(t, n, f, heads)
        if c.sim:  # q̄: the query alone through layers l+1..L; per document the mean of ŝ (one more row of the
            # weighted sum: over [r/σ, 1/σ] and through W̃ where folded) and the pool map P
            query += (L - split) * layer_flops(tq, n, f)
            per_doc += (2 * td * width + lin(1, width, n) if folded else 2 * td * n) + lin(1, n, n)
        per_doc += head
    elif ranker.kind == "tk":
        f_tk = c.tk_ffn or n
        query = c.tk_layers * layer_flops(tq, n, f_tk)
        kernels = 11
        per_doc = lin(tq, n, td) + 2 * lin(1, kernels, 1) + lin(1, 2, 1)  # cosine matrix + dense layers
        exps = tq * td * kernels  # the RBF kernels: one exp() per (query term, doc term, kernel)
    else:
        raise ValueError(ranker.kind)
    total = query + n_chunks * per_chunk + n_docs * per_doc
    return {
        "total": total,
        "query_side": query,
        "per_chunk": per_chunk,
        "per_doc": per_doc,
        "exp_per_query": n_docs * exps,
    }


# ---- the machine ------------------------------------------------------------------------------------------
DEVICE = torch.device("cpu")  # --device: where the rankers, the query and the candidates' fields live


def sync() -> None:
    """Wait for the device's queued work (timings of CUDA paths end when the work does, not when it is queued)."""
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def best_time(fn: Callable[[], object], repeats: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_matmul(repeats: int = 10) -> dict:
    """Best float32 GFLOP/s over shapes like the workload's (FFN in/out, attention projections), of torch.matmul
    (the default BLAS) and of the rankers' linear layers (``blocks.Linear``: oneDNN over a packed weight, where
    available); the floor uses the best of all, the fastest float32 matmul this machine was seen to run."""
    shapes = [(2048, 384, 1536), (2048, 1536, 384), (18432, 384, 384)]
    per_shape, per_shape_linear = {}, {}
    g = torch.Generator().manual_seed(0)
    for m, k, n in shapes:
        a, b = torch.randn(m, k, generator=g).to(DEVICE), torch.randn(k, n, generator=g).to(DEVICE)
        per_shape[f"{m}x{k}x{n}"] = lin(m, k, n) / best_time(lambda a=a, b=b: a @ b, repeats) / 1e9
        layer = blocks.Linear(k, n, bias=False).to(DEVICE)
        with torch.inference_mode():  # as the timed paths call it
            per_shape_linear[f"{m}x{k}x{n}"] = (
                lin(m, k, n) / best_time(lambda a=a, f=layer: f(a), repeats) / 1e9
            )
    # exp() on arguments in [-80, 0] (arguments below -87.3 give subnormal or zero results and run ~30x slower)
    args = (torch.rand(1000 * 16 * 128 * 11, generator=g) * -80.0).to(DEVICE)
    out = torch.empty_like(args)
    exp_rate = args.numel() / best_time(lambda: torch.exp(args, out=out), repeats) / 1e9
    return {
        "gflops": max(*per_shape.values(), *per_shape_linear.values()),
        "per_shape": per_shape,
        "per_shape_linear": per_shape_linear,
        "linear_backend": "oneDNN, packed weight"
        if blocks.ONEDNN_LINEAR and DEVICE.type == "cpu"
        else "torch.nn.functional.linear",
        "exp_g_per_s": exp_rate,
    }


READ_MB = 1024  # measure_read_bandwidth's buffer: more than this VM's share of L3, so the rate is memory's


def measure_read_bandwidth(mb: int = READ_MB, repeats: int = 5) -> float:
    """Best GB/s of reading a float32 buffer of ``mb`` MB once (a sum over it) on the run's threads: the rate at
    which the candidates' stored fields can at best come from memory, for the memory floor (finish_rows)."""
    x = torch.ones(mb * (1 << 20) // 4, device=DEVICE)
    return x.numel() * 4 / best_time(lambda: x.sum(), repeats, warmup=1) / 1e9


def bytes_read(fields: dict, mask: Tensor) -> int:
    """The bytes of the candidates' stored fields over their real tokens: what any implementation of the path
    must read per query (float16: 2 bytes a value; int8: 1 byte a value and a float32 scale per token)."""
    real = int(mask.sum())
    per_token = 0
    for f in fields.values():
        dim = f.shape[-1]
        per_token += dim + 4 if isinstance(f, QuantizedField) else dim * f.dtype.itemsize
    return real * per_token


# ---- documents and fields ---------------------------------------------------------------------------------
def doc_batch(ranker: Ranker, pieces: Tensor) -> tuple[Tensor, Tensor]:
    """Word pieces [N, d] -> this ranker's document ids with its special tokens, padded, + mask."""
    return pad([ranker.doc_ids(p) for p in pieces.tolist()], ranker.device, ranker.text.pad)


def chunked(
    fn: Callable[[slice], dict[str, Tensor]], n: int, bs: int, dtype: torch.dtype
) -> dict[str, Tensor]:
    """Call ``fn`` on slices of ``bs`` of n documents and concatenate each returned field in ``dtype``."""
    parts: dict[str, list[Tensor]] = {}
    for s in range(0, n, bs):
        for k, v in fn(slice(s, s + bs)).items():
            parts.setdefault(k, []).append(v.to(dtype))
    return {k: torch.cat(v) for k, v in parts.items()}


def clone_state(module: torch.nn.Module) -> dict[str, Tensor]:
    return {k: v.clone() for k, v in module.state_dict().items()}


def check_same_weights(cache_entry: dict, module: torch.nn.Module, what: str) -> None:
    """Cached document states are only reused by a ranker whose document-side weights are identical."""
    for name, value in module.state_dict().items():
        if not torch.equal(cache_entry["weights"][name], value):
            raise RuntimeError(f"cached {what} states were built with other weights ({name})")


class FieldBuilder:
    """Document fields per ranker (untimed). The expensive document-side encoders are shared where the
    weights are the same: MORES's document module (copy A of the base) is the same for every K, pooling and
    strategy, so its states D are computed once per d and each variant derives its own fields from D exactly
    as ``document_fields`` does; PreTTR's layer-l states likewise, once for all l and e. The sanity check
    compares the first documents' fields with ``document_fields`` itself."""

    def __init__(self, pieces: Tensor, batch: int, layers_needed: list[int]):
        self.pieces = pieces
        self.batch = batch
        self.layers_needed = sorted(set(layers_needed))
        self.cache: dict[str, dict] = {}

    def drop(self, kind: str) -> None:
        self.cache.pop(kind, None)
        gc.collect()

    def build(
        self, ranker: Ranker, docs: slice = slice(None), dtype: torch.dtype = torch.float16
    ) -> tuple[dict[str, Tensor], Tensor]:
        """The fields of documents ``docs`` in ``dtype`` (float16: as the store hands them over) + mask."""
        ids, mask = doc_batch(ranker, self.pieces[docs])
        n, bs = ids.shape[0], self.batch
        if ranker.kind == "mores":
            entry = self.cache.get("mores")
            if entry is None:
                everything = doc_batch(ranker, self.pieces)
                states = chunked(
                    lambda s: {"D": ranker.doc_states(*(t[s] for t in everything))},
                    len(self.pieces),
                    bs,
                    torch.float32,
                )
                entry = self.cache["mores"] = {"D": states["D"], "weights": clone_state(ranker.doc_encoder)}
            check_same_weights(entry, ranker.doc_encoder, "MORES document")
            D = entry["D"][docs]
            if ranker.strategy == "s1":
                return {"doc": D.to(dtype)}, mask

            def kv_fields(s: slice) -> dict[str, Tensor]:
                out = {}
                for k, (key, value) in enumerate(ranker.doc_kv(D[s]), start=1):
                    out[f"k{k}"], out[f"v{k}"] = key, value
                return out

            return chunked(kv_fields, n, bs, dtype), mask
        if ranker.kind == "prettr":
            entry = self.cache.get("prettr")
            if entry is None:
                entry = self.cache["prettr"] = self.prettr_states(ranker, *doc_batch(ranker, self.pieces))
            check_same_weights(entry, ranker.encoder, "PreTTR lower-layer")
            states = entry[ranker.config.layer][docs]
            return chunked(lambda s: {"doc": ranker.compress(states[s])}, n, bs, dtype), mask
        return chunked(lambda s: ranker.document_fields(ids[s], mask[s]), n, bs, dtype), mask

    def prettr_states(self, ranker, ids: Tensor, mask: Tensor) -> dict:
        """The document alone through layers 1..l for every l needed (``PrettrRanker.lower`` for several l)."""
        enc = ranker.encoder
        out: dict = {"weights": clone_state(enc)}
        for s in range(0, ids.shape[0], self.batch):
            i, m = ids[s : s + self.batch], mask[s : s + self.batch]
            x = enc.embeddings(i, 1, positions(m, ranker.doc_offset))
            done = 0
            for layer in self.layers_needed:
                x = enc.run(x, key_mask(m), done, layer)
                done = layer
                out.setdefault(layer, []).append(x)
        for layer in self.layers_needed:
            out[layer] = torch.cat(out[layer])
        return out


# ---- timing -------------------------------------------------------------------------------------------
def query_side(ranker: Ranker) -> Callable:
    """``query_state``, or its CUDA graphs where ``--cuda-graphs`` turned them on (``Ranker.use_cuda_graphs``)."""
    return ranker.query_graphs or ranker.query_state


def run_query(
    ranker: Ranker, q: tuple[Tensor, Tensor], fields: dict[str, Tensor], mask: Tensor, chunk: int, n: int
):
    """The timed path: the query side once, then the per-candidate interaction over n documents in chunks."""
    qs = query_side(ranker)(*q)
    out = [
        ranker.score_batch(qs, {k: v[s : s + chunk] for k, v in fields.items()}, mask[s : s + chunk])
        for s in range(0, n, chunk)
    ]
    return torch.cat(out)


def timed(fn: Callable[[], object]) -> float:
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t0


def others_cores(start: tuple[float, int, int], end: tuple[float, int, int]) -> float:
    """CPU cores other processes kept busy between two samples (0 where /proc is unavailable)."""
    dt = end[0] - start[0]
    ticks = (end[1] - start[1]) - (end[2] - start[2])
    return max(0.0, ticks / os.sysconf("SC_CLK_TCK") / dt) if dt > 0 else 0.0


def wait_quiet(limit_s: float, threshold: float = 0.3) -> float:
    """Wait (at most ``limit_s``) until other processes use under ``threshold`` cores; returns the wait."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit_s:
        a = cpu_sample()
        time.sleep(0.5)
        if others_cores(a, cpu_sample()) < threshold:
            break
    return time.perf_counter() - t0


def choose_chunk(ranker, q, fields, mask, n_docs: int, gflop: float, fixed: int | None) -> tuple[int, dict]:
    """The fastest chunk size: fast rows try each candidate (and all N at once if N <= ALL_AT_ONCE_MAX) over all N documents; rows
    of more than FAST_GFLOP try SLOW_CHUNKS on the first 32 documents. Includes the warm-up."""
    if fixed:
        run_query(ranker, q, fields, mask, fixed, min(n_docs, fixed))  # warm-up
        return fixed, {}
    if gflop <= FAST_GFLOP:
        # on a GPU the whole batch at once is tried too: there a chunk's cost is mostly launches, not cache misses
        at_once = n_docs <= ALL_AT_ONCE_MAX or DEVICE.type == "cuda"
        cands = sorted({c for c in CHUNK_CANDIDATES if c < n_docs} | ({n_docs} if at_once else set()))
        n = n_docs
    else:
        n = min(n_docs, max(SLOW_CHUNKS))
        cands = [c for c in SLOW_CHUNKS if c <= n] or [n]
    run_query(ranker, q, fields, mask, cands[0], min(n, cands[0]) if gflop > FAST_GFLOP else n)  # warm-up
    # fast rows: each candidate timed CHUNK_TRIALS times, interleaved, its best kept (one run each picked chunks by
    # noise: PreTTR l5/e128 timed 20.3 ms at 256 in its trial and 15.0 at 128 in the row's own runs)
    trials = CHUNK_TRIALS if gflop <= FAST_GFLOP else 1
    tried = {c: float("inf") for c in cands}
    for _ in range(trials):
        for c in cands:
            tried[c] = min(tried[c], timed(lambda c=c: run_query(ranker, q, fields, mask, c, n)) / n * n_docs)
    return min(tried, key=tried.get), {str(c): round(t * 1e3, 2) for c, t in tried.items()}


def rank_check(ranker, q, fields16, builder: FieldBuilder, n_check: int, n_direct: int = 8) -> dict:
    """Scores from the float16 fields (as stored) vs from float32 fields: the same ranking of the first
    ``n_check`` documents? Also checks the float32 fields against ``document_fields`` itself on a few."""
    n = min(n_check, builder.pieces.shape[0])
    f32, mask = builder.build(ranker, slice(0, n), torch.float32)
    k = min(n, n_direct)
    direct = ranker.document_fields(*doc_batch(ranker, builder.pieces[:k]))
    field_err = max(
        ((f32[name][:k] - direct[name]).abs().max() / direct[name].abs().max().clamp(min=1e-12)).item()
        for name in direct
    )
    qs = ranker.query_state(*q)
    s32 = ranker.score_batch(qs, f32, mask).float()
    s16 = ranker.score_batch(qs, {name: v[:n] for name, v in fields16.items()}, mask).float()
    s32, s16 = s32.cpu(), s16.cpu()
    tau = float(kendalltau(s32.numpy(), s16.numpy()).statistic) if n > 1 else 1.0
    return {
        "n": n,
        "same_ranking": bool(torch.equal(s32.argsort(descending=True), s16.argsort(descending=True))),
        "kendall_tau": tau,
        "max_abs_score_diff": (s32 - s16).abs().max().item(),
        "score_spread": (s32.max() - s32.min()).item(),
        "fields_vs_document_fields_rel_err": field_err,
    }


@contextlib.contextmanager
def quiet_stderr():
    """Silence the profiler's C++ start/stop lines (written to file descriptor 2)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def top_ops(ranker, q, fields, mask, chunk: int, n: int, k: int = 8) -> dict:
    """Where the time goes: torch.profiler self-CPU time per op over one pass of n documents."""
    from torch.profiler import ProfilerActivity, profile

    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        run_query(ranker, q, fields, mask, chunk, n)
    events = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    total = sum(e.self_cpu_time_total for e in events)
    events.sort(key=lambda e: e.self_cpu_time_total, reverse=True)
    return {
        "docs": n,
        "chunk": chunk,
        "total_ms": total / 1e3,
        "ops": [
            {
                "op": e.key,
                "self_ms": round(e.self_cpu_time_total / 1e3, 2),
                "share": round(e.self_cpu_time_total / total, 3),
                "calls": e.count,
            }
            for e in events[:k]
        ],
    }


def bench_row(
    row: Variant, d_pieces: int, builder: FieldBuilder, q_pieces: list[int], args, int8: bool = False
) -> dict:
    t_setup = time.perf_counter()
    # weights as a loaded checkpoint's: blocks.Linear packs those, not inference tensors
    with torch.inference_mode(False):
        ranker = row.init(seed=args.seed, max_query_len=QUERY_PIECES, max_doc_len=d_pieces)
    if row.strategy:
        ranker.strategy = row.strategy
    score_head_reads_interaction(ranker)  # (a CPU generator: before the move to the device)
    ranker.to(DEVICE)
    if args.cuda_graphs:
        ranker.use_cuda_graphs()
    q = pad([ranker.query_ids(q_pieces)], DEVICE, ranker.text.pad)
    fields, mask = builder.build(ranker)
    if int8:  # int8 + one float32 scale per token, handed over as the store does (no dequantised copy)
        fields = {k: QuantizedField.quantize(v) for k, v in fields.items()}
    setup_s = time.perf_counter() - t_setup
    n_docs, td = mask.shape
    tq = q[0].shape[1]
    check = rank_check(ranker, q, fields, builder, args.check_n)

    gflop = count_flops(ranker, tq, td, n_docs, 1)["total"] / 1e9
    fixed = args.bert_chunk if row.kind == "bert" and args.bert_chunk else args.chunk
    chunk, tried = choose_chunk(ranker, q, fields, mask, n_docs, gflop, fixed)
    repeats = args.repeats
    if row.kind == "bert" or gflop > SLOW_GFLOP:
        repeats = args.very_slow_repeats if gflop > VERY_SLOW_GFLOP else args.slow_repeats
    waited = wait_quiet(args.wait_quiet) if args.wait_quiet else 0.0
    times, others, discarded = [], [], []
    retries = args.retries
    while len(times) < repeats:
        t0 = cpu_sample()
        t = timed(lambda: run_query(ranker, q, fields, mask, chunk, n_docs))
        busy = others_cores(t0, cpu_sample())
        # another process took a core: time this run again (/proc counts 10 ms ticks: judge runs >= 0.25 s)
        if busy > CONTENDED and t >= 0.25 and retries > 0:
            retries -= 1
            discarded.append({"ms": round(t * 1e3, 3), "other_processes_cores": round(busy, 2)})
            waited += wait_quiet(args.wait_quiet) if args.wait_quiet else 0.0
            continue
        times.append(t)
        others.append(busy)
    # the query side alone (query_state: the same for any N), to split the path's time into the fixed part
    # and the per-candidate part (finish_rows: x_floor_docs)
    query_times = [timed(lambda: query_side(ranker)(*q)) for _ in range(max(10, repeats))]
    n_chunks = -(-n_docs // chunk)
    flops = count_flops(ranker, tq, td, n_docs, n_chunks)
    dims = ranker.field_dims()
    result = {
        "ranker": row.name + ("+int8" if int8 else ""),
        "stored_dtype": "int8" if int8 else "float16",
        "kind": row.kind,
        "strategy": ranker.strategy if row.kind == "mores" else None,
        "options": {k: v for k, v in ranker.describe().items() if k not in ("kind", "strategy", "fields")},
        "d_pieces": d_pieces,
        "query_tokens": tq,
        "doc_tokens": td,
        "n_docs": n_docs,
        "chunk": chunk,
        "chunk_trials_ms": tried,
        "repeats": repeats,
        "times_ms": [round(t * 1e3, 3) for t in times],
        "ms_median": statistics.median(times) * 1e3,
        "ms_min": min(times) * 1e3,
        "query_ms_median": statistics.median(query_times) * 1e3,
        "fields": ranker.field_dims(),
        # int8: one byte a value plus a float32 scale per token and field; float16: two bytes a value
        "bytes_per_doc": td * (sum(dims.values()) + 4 * len(dims)) if int8 else 2 * td * sum(dims.values()),
        "bytes_read_per_query": bytes_read(fields, mask),
        "flops": flops,
        "fp16_check": check,
        "query_graph_replays": ranker.query_graphs.replays if ranker.query_graphs else None,
        "setup_s": round(setup_s, 1),
        "other_processes_cores": round(statistics.mean(others), 2),
        "other_processes_cores_per_run": [round(o, 2) for o in others],
        "discarded_contended_runs": discarded,
        "waited_for_quiet_s": round(waited, 1),
    }
    if args.profile:
        n_prof = n_docs if result["ms_median"] < 3000 else min(n_docs, 64)
        result["profile"] = top_ops(ranker, q, fields, mask, min(chunk, n_prof), n_prof)
    return result


def finish_rows(
    rows: list[dict],
    gflops: float,
    exp_rate: float,
    matmul_gflops: float | None = None,
    read_gbps: float | None = None,
) -> None:
    """Speed-ups over bert at the same d, achieved GFLOP/s, FLOP floor and the ratio to it (and, for
    comparison with runs before the floor counted the rankers' oneDNN linear layers, the ratio to the floor at
    torch.matmul's rate alone: ``x_floor_torch_matmul``). With ``read_gbps``, also the memory floor (the
    candidates' stored bytes at the measured read rate) and the ratio to the larger of the two floors
    (``x_roofline``): a path whose memory floor is the larger cannot reach its FLOP floor however it computes."""
    bert = {r["d_pieces"]: r for r in rows if r["kind"] == "bert"}
    for r in rows:
        ref = bert.get(r["d_pieces"])
        r["speedup_vs_bert"] = ref["ms_median"] / r["ms_median"] if ref else None
        r["speedup_vs_bert_min"] = ref["ms_min"] / r["ms_min"] if ref else None
        total = r["flops"]["total"]
        r["gflop_per_query"] = total / 1e9
        r["achieved_gflops"] = total / (r["ms_median"] / 1e3) / 1e9
        r["floor_ms"] = total / (gflops * 1e9) * 1e3
        r["x_floor"] = r["ms_median"] / r["floor_ms"]
        if matmul_gflops:
            r["x_floor_torch_matmul"] = r["ms_median"] / (total / (matmul_gflops * 1e9) * 1e3)
        # split: the query side (fixed per request) and the rest (candidates), each against its own floor
        query_flops = r["flops"]["query_side"]
        r["query_floor_ms"] = query_flops / (gflops * 1e9) * 1e3
        r["docs_ms"] = r["ms_median"] - r["query_ms_median"]
        r["docs_floor_ms"] = r["floor_ms"] - r["query_floor_ms"]
        r["x_floor_query"] = r["query_ms_median"] / r["query_floor_ms"] if query_flops else None
        r["x_floor_docs"] = r["docs_ms"] / r["docs_floor_ms"]
        if read_gbps and "bytes_read_per_query" in r:
            r["memory_floor_ms"] = r["bytes_read_per_query"] / (read_gbps * 1e9) * 1e3
            r["x_roofline"] = r["ms_median"] / max(r["floor_ms"], r["memory_floor_ms"])
        if r["flops"]["exp_per_query"]:
            r["floor_ms_incl_exp"] = r["floor_ms"] + r["flops"]["exp_per_query"] / (exp_rate * 1e9) * 1e3
            r["x_floor_incl_exp"] = r["ms_median"] / r["floor_ms_incl_exp"]


def evaluate_targets(rows: list[dict], d_map: dict[int, int]) -> list[dict]:
    out = []
    for d, name, need in SPEEDUP_TARGETS:
        row = next((r for r in rows if r["ranker"] == name and r["d_pieces"] == d_map.get(d)), None)
        got = row["speedup_vs_bert"] if row else None
        out.append(
            {
                "target": f"d={d}: {name} >= {need:g}x bert",
                "d": d,
                "ranker": name,
                "need": need,
                "measured": got,
                "met": None if got is None else got >= need,
            }
        )
    for r in rows:
        need = floor_target(r)
        out.append(
            {
                "target": f"d={r['d_pieces']}: {r['ranker']} within {need:g}x of its FLOP floor",
                "d": r["d_pieces"],
                "ranker": r["ranker"],
                "need": need,
                "measured": r["x_floor"],
                "met": r["x_floor"] <= need,
            }
        )
    return out


def print_table(rows: list[dict], gflops: float) -> None:
    table = Table(title=f"online path, one query, N docs (matmul floor at {gflops:.0f} GFLOP/s)")
    for col in (
        "ranker",
        "d",
        "chunk",
        "ms med",
        "ms min",
        "× bert",
        "KB/doc",
        "GFLOP",
        "GFLOP/s",
        "floor ms",
        "× floor",
        "mem ms",
        "query ms",
        "× floor q / docs",
        "fp16 τ",
    ):
        table.add_column(col, justify="left" if col == "ranker" else "right")
    for r in rows:
        sp = r["speedup_vs_bert"]
        table.add_row(
            r["ranker"],
            str(r["d_pieces"]),
            str(r["chunk"]),
            f"{r['ms_median']:.1f}",
            f"{r['ms_min']:.1f}",
            "—" if sp is None else f"{sp:.1f}",
            f"{r['bytes_per_doc'] / 1024:.0f}",
            f"{r['gflop_per_query']:.2f}",
            f"{r['achieved_gflops']:.1f}",
            f"{r['floor_ms']:.1f}",
            f"{r['x_floor']:.1f}",
            f"{r['memory_floor_ms']:.1f}" if "memory_floor_ms" in r else "—",
            f"{r['query_ms_median']:.1f}",
            ("—" if r["x_floor_query"] is None else f"{r['x_floor_query']:.1f}")
            + f" / {r['x_floor_docs']:.1f}",
            f"{r['fp16_check']['kendall_tau']:.3f}",
        )
    console.print(table)


def markdown(result: dict) -> str:
    """The table of a run as markdown: one line per row, the d = 128 and d = 512 columns side by side."""
    rows, m = result["rows"], result["machine"]
    ds = sorted({r["d_pieces"] for r in rows})
    cols = ("ms", "× bert", "× floor", "× floor at matmul", "memory floor ms", "× roofline", "KB/doc")
    head = ["ranker", "stored", *(f"{c} d={d}" for d in ds for c in cols)]
    lines = [
        f"`{result['command']}` — {m['cpu']}, {m['threads']} threads, torch {m['torch']}, git {m.get('git_commit', '?')}; "
        f"N = {result['settings']['n_docs']} candidates, 16-piece query; floor = analytic matmul FLOPs at "
        f"{result['matmul']['gflops_used_for_floor']:.0f} GFLOP/s (the fastest float32 matmul measured in the same"
        " run: the rankers' oneDNN linear layers where available); '× floor at matmul': against torch.matmul's"
        " rate alone, as runs before the oneDNN layers counted it; 'memory floor': the candidates' stored bytes"
        " (real tokens) at the read rate measured in the run"
        + (f" ({result['memory']['read_gbps']:.1f} GB/s)" if "memory" in result else "")
        + "; '× roofline': against the larger of the two floors.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for name in dict.fromkeys(r["ranker"] for r in rows):
        by_d = {r["d_pieces"]: r for r in rows if r["ranker"] == name}
        first = next(iter(by_d.values()))
        cells = [name, first.get("stored_dtype", "float16")]
        for d in ds:
            r = by_d.get(d)
            sp = r and r["speedup_vs_bert"]
            at_matmul = r and r.get("x_floor_torch_matmul")
            cells += (
                ["–"] * len(cols)
                if r is None
                else [
                    f"{r['ms_median']:.1f}",
                    f"{sp:.1f}" if sp else "–",
                    f"{r['x_floor']:.1f}",
                    f"{at_matmul:.1f}" if at_matmul else "–",
                    f"{r['memory_floor_ms']:.1f}" if "memory_floor_ms" in r else "–",
                    f"{r['x_roofline']:.1f}" if "x_roofline" in r else "–",
                    f"{r['bytes_per_doc'] / 1024:.0f}",
                ]
            )
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--n", type=int, default=None, help="candidate documents per query (default 1000; --quick 48)"
    )
    p.add_argument("--d", type=int, nargs="+", default=[128, 512], help="document word pieces (512 -> 493)")
    p.add_argument(
        "--rankers",
        nargs="+",
        default=None,
        help=f"row names or globs (default {' '.join(DEFAULT_ROWS)}); 'all': {len(CATALOGUE)} rows",
    )
    p.add_argument("--repeats", type=int, default=None, help="timed runs per row after warm-up (default 5)")
    p.add_argument(
        "--slow-repeats",
        "--bert-repeats",
        type=int,
        default=None,
        help=f"timed runs for bert and rows estimated over {SLOW_GFLOP:g} GFLOP per pass (default 3)",
    )
    p.add_argument(
        "--very-slow-repeats",
        type=int,
        default=None,
        help=f"timed runs for rows estimated over {VERY_SLOW_GFLOP:g} GFLOP per pass: bert at d = 512 (default 2)",
    )
    p.add_argument(
        "--chunk", type=int, default=None, help="documents per score_batch call (default: fastest)"
    )
    p.add_argument("--bert-chunk", type=int, default=None, help="chunk for bert only (default: fastest)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: all cores)")
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="the query side replayed from CUDA graphs (Ranker.use_cuda_graphs; a GPU only)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu, cuda or cuda:N: where the rankers and the candidates' fields live",
    )
    p.add_argument(
        "--check-n", type=int, default=100, help="documents in the float16-vs-float32 ranking check"
    )
    p.add_argument("--encode-batch", type=int, default=32, help="documents per document-side batch (untimed)")
    p.add_argument("--no-profile", dest="profile", action="store_false", help="skip the per-row op profile")
    p.add_argument(
        "--wait-quiet",
        type=float,
        default=5.0,
        help="before timing each row, wait up to this many seconds for other processes to go idle (0: never)",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=3,
        help=f"per row, how many timed runs during which other processes used > {CONTENDED:g} cores are"
        " discarded and run again",
    )
    p.add_argument(
        "--int8",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="beside each row but bert, the same ranker from int8 fields + per-token scales (NAME+int8)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--paths",
        nargs="+",
        default=None,
        choices=PATHS,
        help="instead of the table: these paths side by side per ranker and d, alternating repetitions in this one"
        " process (reference: every native kernel off; compiled: the same through torch.compile; native: every"
        " kernel on; native-no-FAMILY: one family off; 'families': native-no-* for every family)",
    )
    p.add_argument(
        "--bert-n", type=int, default=32, help="--paths: candidates for bert (its rows are per candidate)"
    )
    p.add_argument(
        "--compile-dynamic",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="--paths: torch.compile with dynamic shapes (one graph for every batch and length)",
    )
    p.add_argument("--quick", action="store_true", help="smoke run: N = 48, 2 repeats, 1 for bert")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON (default bench/results/speed.json; --quick: speed-quick.json)",
    )
    args = p.parse_args(argv)
    if args.paths and "families" in args.paths:
        args.paths = [x for x in args.paths if x != "families"]
        args.paths += [f"native-no-{f}" for f in native.FAMILIES if f"native-no-{f}" not in args.paths]
    q = args.quick
    args.n = args.n or (48 if q else 1000)
    args.repeats = args.repeats or (2 if q else 5)
    args.slow_repeats = args.slow_repeats or (1 if q else 3)
    args.very_slow_repeats = args.very_slow_repeats or (1 if q else 2)
    args.check_n = min(args.check_n, args.n)
    args.threads = args.threads or os.cpu_count() or 1
    default_out = "speed-paths.json" if args.paths else "speed.json"
    args.out = args.out or REPO / "bench" / "results" / ("speed-quick.json" if q else default_out)
    pats = args.rankers or list(DEFAULT_ROWS)
    if pats == ["all"]:
        pats = ["*"]
    args.rows = [r for r in CATALOGUE if any(fnmatch.fnmatchcase(r.name, p) for p in pats)]
    for pat in pats:  # any other variant named exactly (e.g. tk-6l-base), after the catalogue's rows
        if not any(c in pat for c in "*?[") and pat not in {r.name for r in args.rows}:
            try:
                args.rows.append(parse_variant(pat))
            except CheckpointError as exc:
                p.error(str(exc))
    if not args.rows:
        p.error(f"no row matches {pats}; rows: {', '.join(r.name for r in CATALOGUE)}")
    return args


# ---- --paths: reference, compiled and native side by side ------------------------------------------------
def paths_row(row: Variant, builders: dict[int, FieldBuilder], q_pieces: list[int], args) -> list[dict]:
    """One ranker at every d: per path, the timed path (query_state + score_batch over the candidates in the
    service's batches of SCORE_BATCH) in alternating repetitions (the order rotated each round)."""
    d_max = max(b.pieces.shape[1] for b in builders.values())
    with torch.inference_mode(False):  # weights as a loaded checkpoint's
        ranker = row.init(seed=args.seed, max_query_len=QUERY_PIECES, max_doc_len=d_max)
    if row.strategy:
        ranker.strategy = row.strategy
    score_head_reads_interaction(ranker)
    ranker.eval()
    q = pad([ranker.query_ids(q_pieces)], DEVICE, ranker.text.pad)
    n = args.bert_n if row.kind == "bert" else args.n
    inputs = {}
    for d, builder in builders.items():
        fields, mask = builder.build(ranker, slice(0, n))
        inputs[d] = (fields, mask)
    # bert: reference, compiled and native only (its few rows for the kernels make the families moot there)
    paths = [p for p in args.paths if row.kind != "bert" or not p.startswith("native-no-")]
    rankers = {p: ranker for p in paths}
    compile_s = compile_error = None
    if "compiled" in paths:
        os.environ[native.ENVIRONMENT] = PATH_NATIVE["compiled"]
        with torch.inference_mode(False):
            twin = row.init(seed=args.seed, max_query_len=QUERY_PIECES, max_doc_len=d_max)
        if row.strategy:
            twin.strategy = row.strategy
        score_head_reads_interaction(twin)
        warm = [lambda f=f, m=m: run_query(twin, q, f, m, SCORE_BATCH, n) for f, m in inputs.values()]
        try:
            compile_s = compile_ranker(twin, dynamic=args.compile_dynamic, warm=warm)
            rankers["compiled"] = twin
            console.print(
                f"{row.name}: torch.compile and its warm-up over {len(warm)} shapes: {compile_s:.0f} s"
            )
        except Exception as exc:  # noqa: BLE001 - recorded in the row: a failed compile is a result
            compile_error = f"{type(exc).__name__}: {str(exc)[:500]}"
            console.print(f"[red]{row.name}: torch.compile failed[/]: {compile_error[:200]}")
            paths.remove("compiled")
            del rankers["compiled"]
    out = []
    for d, (fields, mask) in inputs.items():
        times: dict[str, list[float]] = {p: [] for p in paths}
        scores = {}
        for p in paths:  # warm-up and the scores
            os.environ[native.ENVIRONMENT] = PATH_NATIVE[p]
            scores[p] = run_query(rankers[p], q, fields, mask, SCORE_BATCH, n).float()
        others = []
        for rep in range(args.repeats):
            k = rep % len(paths)
            for p in paths[k:] + paths[:k]:
                os.environ[native.ENVIRONMENT] = PATH_NATIVE[p]
                start = cpu_sample()
                times[p].append(
                    timed(lambda p=p, f=fields, m=mask: run_query(rankers[p], q, f, m, SCORE_BATCH, n))
                )
                others.append(others_cores(start, cpu_sample()))
        base = "native" if "native" in paths else paths[0]
        ref = scores.get("reference", scores[base])
        scale = float(ref.abs().max().clamp(min=1e-12))
        res = {
            "ranker": row.name,
            "d_pieces": int(mask.shape[1]) if row.kind != "bert" else builders[d].pieces.shape[1],
            "d_nominal": d,
            "n_docs": n,
            "compile_s": None if compile_s is None else round(compile_s, 1),
            "compile_error": compile_error,
            "other_processes_cores_median": round(statistics.median(others), 2),
            "paths": {},
        }
        for p in paths:
            ms = [t * 1e3 for t in times[p]]
            paired = [a / b for a, b in zip(times[p], times[base], strict=True)]
            res["paths"][p] = {
                "ms_median": round(statistics.median(ms), 2),
                "ms_min": round(min(ms), 2),
                "ms": [round(x, 2) for x in ms],
                f"x_{base}_paired_median": round(statistics.median(paired), 3),
                f"x_{base}_min": round(min(times[p]) / min(times[base]), 3),
                "max_abs_score_diff_vs_reference": float((scores[p] - ref).abs().max()),
                "relative_score_diff": float((scores[p] - ref).abs().max()) / scale,
            }
        console.print(
            f"{row.name:16s} d={d:4d} n={n:4d} "
            + "  ".join(f"{p} {res['paths'][p]['ms_median']:.1f} ms" for p in paths)
            + f"  (others {res['other_processes_cores_median']:.1f} cores)"
        )
        out.append(res)
    os.environ[native.ENVIRONMENT] = "all"
    return out


def family_decisions(rows: list[dict], threshold: float = 1.15) -> dict:
    """Per kernel family, the rule of issue 40: keep a hand-written kernel only where the service's path with it
    (native) is >= ``threshold`` times faster than the best path without it, i.e. than the faster of native with
    the family off and the compiled path (paired medians of path / native), in at least one row."""
    out = {}
    for f in native.FAMILIES:
        p = f"native-no-{f}"
        per_row = {}
        for r in rows:
            if p not in r["paths"] or "native" not in r["paths"]:
                continue
            alternatives = [r["paths"][p]["x_native_paired_median"]]
            if "compiled" in r["paths"]:
                alternatives.append(r["paths"]["compiled"]["x_native_paired_median"])
            per_row[f"{r['ranker']} d={r['d_nominal']}"] = {
                "x_native_family_off": alternatives[0],
                "x_native_best_other": min(alternatives),
            }
        if not per_row:
            continue
        where, top = max(per_row.items(), key=lambda kv: kv[1]["x_native_best_other"])
        out[f] = {
            "largest_x_native_best_other": top["x_native_best_other"],
            "where": where,
            "keep": top["x_native_best_other"] >= threshold,
            "per_row": per_row,
        }
    return out


def paths_markdown(result: dict) -> str:
    paths = result["settings"]["paths"]
    lines = [
        f"# bench/speed.py --paths at {result['machine']['git_commit']}",
        "",
        f"`{result['command']}` ({result['machine']['cpu']}, {result['machine']['threads']} threads,"
        f" torch {result['machine']['torch']}; {result['wall_s']} s). ms per query (query_state + score_batch"
        " over the candidates in batches of 256, float16 fields in memory), medians of alternating repetitions;"
        " x native: the paired median of path / native.",
        "",
        "| ranker | d | N | " + " | ".join(f"{p} ms (x native)" for p in paths) + " | compile s |",
        "|---|---:|---:|" + "---:|" * (len(paths) + 1),
    ]
    for r in result["rows"]:
        cells = []
        for p in paths:
            c = r["paths"].get(p)
            if c is None:
                cells.append("")
                continue
            x = c.get("x_native_paired_median")
            cells.append(f"{c['ms_median']:,.1f}" + (f" ({x:.2f}x)" if x is not None else ""))
        compile_s = "" if r["compile_s"] is None else f"{r['compile_s']:.0f}"
        lines.append(
            f"| {r['ranker']} | {r['d_pieces']} | {r['n_docs']} | " + " | ".join(cells) + f" | {compile_s} |"
        )
    if result.get("families"):
        lines += [
            "",
            "| family | best path without it / native, largest over the rows (where) | keep (>= 1.15x) |",
            "|---|---:|---|",
        ]
        for f, v in result["families"].items():
            x = v["largest_x_native_best_other"]
            lines.append(f"| {f} | {x:.2f}x ({v['where']}) | {'yes' if v['keep'] else 'no'} |")
    return "\n".join(lines) + "\n"


def compare_paths(args, argv: list[str] | None) -> int:
    global DEVICE
    DEVICE = torch.device(args.device)
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    info = machine_info(args.threads)
    info["git_commit"] = os.environ.get("AHEADRANK_GIT_COMMIT") or info["git_commit"]
    gen = torch.Generator().manual_seed(args.seed)
    probe = init_ranker("bert", max_query_len=QUERY_PIECES, max_doc_len=128)
    max_pos, vocab = int(probe.config.bert["max_position_embeddings"]), int(probe.config.bert["vocab_size"])
    q_pieces = torch.randint(FIRST_WORD_ID, vocab, (QUERY_PIECES,), generator=gen).tolist()
    n_max = max(args.n, args.bert_n)
    builders = {}
    for d in args.d:
        pieces = torch.randint(
            FIRST_WORD_ID, vocab, (n_max, min(d, max_pos - QUERY_PIECES - 3)), generator=gen
        )
        layers = [r.options["layer"] for r in args.rows if r.kind == "prettr"]
        builders[d] = FieldBuilder(pieces, args.encode_batch, layers)
    console.print(f"[bold]{info['cpu']}[/], {args.threads} threads, paths {' '.join(args.paths)}")
    rows = []
    with torch.inference_mode():
        for row in args.rows:
            rows.extend(paths_row(row, builders, q_pieces, args))
            for b in builders.values():
                b.drop(row.kind)
            gc.collect()
    info["load_average_end"] = list(os.getloadavg())
    result = {
        "benchmark": "bench/speed.py --paths",
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "machine": info,
        "settings": {
            "paths": args.paths,
            "path_native": {p: PATH_NATIVE[p] for p in args.paths},
            "n_docs": args.n,
            "bert_n_docs": args.bert_n,
            "repeats": args.repeats,
            "batch": SCORE_BATCH,
            "compile": {"dynamic": args.compile_dynamic, "options": "freezing"},
            "timed": "query_state + score_batch over the candidates in batches of 256 (the service's), float16"
            " fields in memory, inference_mode; the paths alternate within each repetition, the order rotated",
        },
        "rows": rows,
        "families": family_decisions(rows) if "native" in args.paths else {},
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    for f, v in result["families"].items():
        x = v["largest_x_native_best_other"]
        console.print(
            f"{f:10s} the best path without it: up to {x:.2f}x native ({v['where']}): keep {v['keep']}"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(paths_markdown(result))
    console.print(f"wrote {args.out} and {args.out.with_suffix('.md').name} ({result['wall_s']} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.paths:
        return compare_paths(args, argv)
    global DEVICE
    DEVICE = torch.device(args.device)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: CUDA is not available on this machine")
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    info = machine_info(args.threads)
    info["device"] = str(DEVICE)
    if DEVICE.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(DEVICE)
    # a copy of the tree (the device tool's, on its GPU or its CPU) names its commit in the environment: its .git
    # may be stale
    info["git_commit"] = os.environ.get("AHEADRANK_GIT_COMMIT") or info["git_commit"]
    console.print(
        f"[bold]{info.get('gpu', info['cpu'])}[/], {args.threads} threads, torch {info['torch']}, device {DEVICE}"
    )
    mm = measure_matmul()
    read_start = measure_read_bandwidth()
    console.print(
        f"float32 matmul: best {mm['gflops']:.0f} GFLOP/s ("
        + ", ".join(f"{k}: {v:.0f}" for k, v in mm["per_shape"].items())
        + f"; the rankers' linear layers ({mm['linear_backend']}): "
        + ", ".join(f"{v:.0f}" for v in mm["per_shape_linear"].values())
        + f"); exp: {mm['exp_g_per_s']:.2f} G/s; memory read {read_start:.1f} GB/s"
    )

    rows: list[dict] = []
    d_map: dict[int, int] = {}
    gen = torch.Generator().manual_seed(args.seed)
    with torch.inference_mode():
        for d in args.d:
            probe = init_ranker("bert", max_query_len=QUERY_PIECES, max_doc_len=128)
            max_pos = int(probe.config.bert["max_position_embeddings"])
            vocab = int(probe.config.bert["vocab_size"])
            special = set(probe.text.tokenizer.all_special_ids)
            q_pieces = torch.randint(FIRST_WORD_ID, vocab, (QUERY_PIECES,), generator=gen).tolist()
            assert not special & set(q_pieces)
            d_pieces = min(d, max_pos - QUERY_PIECES - 3)
            d_map[d] = d_pieces
            pieces = torch.randint(FIRST_WORD_ID, vocab, (args.n, d_pieces), generator=gen)
            layers = [r.options["layer"] for r in args.rows if r.kind == "prettr"]
            builder = FieldBuilder(pieces, args.encode_batch, layers)
            console.rule(f"d = {d} ({d_pieces} word pieces), N = {args.n}")
            for i, row in enumerate(args.rows):
                for int8 in (False, True) if args.int8 and row.kind != "bert" else (False,):
                    r = bench_row(row, d_pieces, builder, q_pieces, args, int8)
                    r["d_nominal"] = d
                    rows.append(r)
                    gc.collect()
                    c = r["fp16_check"]
                    console.print(
                        f"{r['ranker']:23s} {r['ms_median']:10.1f} ms (min {r['ms_min']:.1f}, chunk {r['chunk']}, "
                        f"{r['repeats']} runs, other processes {r['other_processes_cores']:.1f} cores)  "
                        f"{r['stored_dtype']} vs fp32: same ranking {c['same_ranking']}, τ = {c['kendall_tau']:.4f}, "
                        f"max |Δscore| {c['max_abs_score_diff']:.2e}"
                    )
                if not any(later.kind == row.kind for later in args.rows[i + 1 :]):
                    builder.drop(row.kind)
            del builder
            gc.collect()

    mm_end = measure_matmul()
    read_end = measure_read_bandwidth()
    gflops = max(mm["gflops"], mm_end["gflops"])
    matmul_only = max(*mm["per_shape"].values(), *mm_end["per_shape"].values())
    read_gbps = max(read_start, read_end)
    finish_rows(rows, gflops, max(mm["exp_g_per_s"], mm_end["exp_g_per_s"]), matmul_only, read_gbps)
    targets = evaluate_targets(rows, d_map)
    print_table(rows, gflops)
    for t in targets:
        if t["measured"] is None:
            continue
        mark = "[green]met[/]" if t["met"] else "[red]missed[/]"
        console.print(f"{mark:22s} {t['target']}: {t['measured']:.1f}")

    info["load_average_end"] = list(os.getloadavg())
    result = {
        "benchmark": "bench/speed.py",
        "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])]),
        "machine": info,
        "matmul": {"start": mm, "end": mm_end, "gflops_used_for_floor": gflops},
        "memory": {"read_gbps_start": read_start, "read_gbps_end": read_end, "read_gbps": read_gbps},
        "settings": {
            "n_docs": args.n,
            "query_pieces": QUERY_PIECES,
            "d": {str(k): v for k, v in d_map.items()},
            "d_note": (
                "d = 512 means 512 - 16 - 3 = 493 word pieces for every ranker: [CLS] q [SEP] d [SEP] must fit"
                " bert's and prettr's 512 positions; MORES stores [CLS] d [SEP], bert and prettr d [SEP], tk d"
            ),
            "token_ids": f"uniform in [{FIRST_WORD_ID}, vocab): no special or [unused] tokens",
            "repeats": args.repeats,
            "slow_repeats": args.slow_repeats,
            "very_slow_repeats": args.very_slow_repeats,
            "slow_rows": (
                f"bert and rows over {SLOW_GFLOP:g} analytic GFLOP per pass get slow_repeats runs, rows over"
                f" {VERY_SLOW_GFLOP:g} GFLOP very_slow_repeats; always over all N documents. Rows up to"
                f" {FAST_GFLOP:g} GFLOP try chunks {CHUNK_CANDIDATES} on all N (the best of {CHUNK_TRIALS} runs each,"
                f" interleaved), others {SLOW_CHUNKS} on 32 documents"
            ),
            "contention": (
                f"a timed run during which other processes kept more than {CONTENDED:g} cores busy is discarded"
                f" and run again, at most {args.retries} times per row (rows: discarded_contended_runs);"
                f" before each row the script waits up to {args.wait_quiet:g} s for other processes to go idle"
            ),
            "warmup": "one untimed pass before the chunk-size trials (slow rows: one chunk), then the trials",
            "timed": "query_state + score_batch over all N documents, float16 fields in memory, inference_mode",
            "floor": (
                "analytic matmul FLOPs / best measured float32 matmul GFLOP/s (start or end of the run; torch.matmul"
                " and the rankers' linear layers, blocks.Linear, measured at the same shapes: matmul.*.per_shape*)"
            ),
            "split": (
                "query_ms_median: query_state alone, timed after the row (max(10, repeats) runs); docs_ms ="
                " ms_median - query_ms_median; x_floor_query / x_floor_docs: each part against its own share of"
                " the floor (query_side FLOPs / the rest)"
            ),
            "flops_note": (
                "matmuls only (2·m·k·n); LayerNorm, GELU, softmax, float16->float32 conversion are not counted;"
                " TK's 11 RBF kernels are exp() calls, counted in flops.exp_per_query and not in floor_ms;"
                " floor_ms_incl_exp adds them at the measured exp() rate"
            ),
            "seed": args.seed,
            "device": str(DEVICE),
            "cuda_graphs": args.cuda_graphs,
        },
        "rows": rows,
        "targets": targets,
        "wall_s": round(time.perf_counter() - t_start, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    console.print(f"wrote {args.out} and {args.out.with_suffix('.md').name} ({result['wall_s']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
