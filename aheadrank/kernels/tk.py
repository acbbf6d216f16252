"""TK's kernel stage, Σ_j K per (document, query term, kernel) for Gaussian kernels sharing σ, behind one interface:
:func:`kernel_sums` from the cosines [B, Tq, Td] (the hand-written C stage of the ``tk`` family where it applies,
else the same chain in PyTorch: :func:`reference_sums`), and :func:`stored_sums`, the cosines and the kernels in one
native pass from the stored term vectors. The chain (:class:`KernelChain`) reaches every kernel from one: a
kernel is its neighbour times ``e^{Δ·m/σ²}`` and a constant, so TK's 11 kernels take 3 ``exp`` passes instead
of 11. The ranker's formula, the pooling and the score stay in ``rankers/tk.py``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from aheadrank.kernels import native
from aheadrank.kernels.stored import QuantizedField, native_kind, native_values

BLOCK_VALUES = 1 << 19  # match values per block (2 MB of float32): the kernel loop stays in cache
# The chained stage's per-value floor: 1e-30 (e^-69), still far below what the features see, above subnormals
CHAIN_FLOOR = -69.0
COSINE_RANGE = 1.0 + 1e-3  # cosines of unit vectors in float32 stay within this


@dataclass(frozen=True)
class KernelChain:
    """How the chained stage reaches every kernel from one: ``anchor`` (the centre nearest 0, evaluated with
    ``exp``), then ``steps`` of (kernel, previous kernel, Δ = μ_k − μ_prev, log s_k): ``K̃_k = K̃_prev · e^{Δ·m/σ²}``
    with ``K̃ = K / s`` (the constant factor e^{−(μ_k² − μ_prev²)/2σ²} of each step is gathered in ``s`` and
    applied to the [B, Tq] sums, not to the [B, Tq, Td] values)."""

    anchor: int
    steps: tuple[tuple[int, int, float, float], ...]


@lru_cache(maxsize=8)
def kernel_chain(mu: tuple[float, ...], sigma: float) -> KernelChain | None:
    """The chain for these centres, or None where it is not exact in float32: the anchor kernel must stay far
    above the floor over every cosine (so no chain starts from a floored value and grows), and no scaled
    value may overflow."""
    anchor = min(range(len(mu)), key=lambda k: (abs(mu[k]), k))
    two_s2 = 2 * sigma**2
    if (COSINE_RANGE + abs(mu[anchor])) ** 2 / two_s2 > -CHAIN_FLOOR - 5:
        return None
    steps = []
    for side in (1, -1):  # outward from the anchor: up the centres, then down
        chain = sorted(
            (k for k in range(len(mu)) if side * (mu[k] - mu[anchor]) > 0), key=lambda k: side * mu[k]
        )
        prev, log_s = anchor, 0.0
        for k in chain:
            log_s += -(mu[k] ** 2 - mu[prev] ** 2) / two_s2
            if abs(log_s) > 80 or abs(mu[k] - mu[prev]) * COSINE_RANGE / sigma**2 > 80:
                return None
            steps.append((k, prev, mu[k] - mu[prev], log_s))
            prev = k
    return KernelChain(anchor, tuple(steps))


def kernel_sums(match: Tensor, d_mask: Tensor, mu: tuple[float, ...], sigma: float) -> Tensor | None:
    """Σ_j K per (document, query term, kernel) [B, Tq, K] of the cosines match [B, Tq, Td] (float32, no
    gradient) by the chained stage: the native pass where it applies (:func:`native_sums`), else
    :func:`reference_sums`. None where the chain is not exact for these centres (:func:`kernel_chain`): the
    caller evaluates each kernel by its own ``exp``."""
    chain = kernel_chain(mu, sigma)
    if chain is None:
        return None
    found = native_sums(match, d_mask, mu, sigma)
    return found if found is not None else reference_sums(match, d_mask, mu, sigma, chain)


def reference_sums(
    match: Tensor, d_mask: Tensor, mu: tuple[float, ...], sigma: float, chain: KernelChain
) -> Tensor:
    """The chained stage in PyTorch, over a cache-sized block of documents at a time: the anchor by ``exp``, the
    others each a multiply by a ratio, a floor and ``Σ_j``; the ratios by ``exp`` or as the reciprocal of one
    before. Same values as the formula up to float32 rounding and a 1e-30 floor per value."""
    b, tq, td = match.shape
    # Padding: its cosines are clamped into the cosine range (any value a padding slot holds stays finite
    # through the chain; real cosines are inside it already) and its anchor value is zeroed by a multiply
    # with the [B, 1, Td] mask (masked_fill over a broadcast mask runs ~8x slower), so every chained value of
    # it stays at the floor, as for a real cosine far from a kernel. The passes keep match's memory layout
    # (``cosines`` gives [B, Td, Tq] storage) and write into buffers allocated once per call.
    keep = d_mask[:, None, :].to(match.dtype)
    per_term = torch.empty(len(mu), b, tq, dtype=match.dtype, device=match.device)
    inv = 1.0 / sigma**2
    block = max(1, BLOCK_VALUES // max(1, tq * td))
    floor = math.exp(CHAIN_FLOOR)
    bufs = [torch.empty_like(match[:block]) for _ in range(4)]
    ratio_bufs: dict[float, Tensor] = {}
    for lo in range(0, b, block):
        rows = slice(lo, lo + block)
        m, first, *chained = (x[: min(block, b - lo)] for x in bufs)
        torch.clamp(match[rows], -COSINE_RANGE, COSINE_RANGE, out=m)
        torch.sub(m, mu[chain.anchor], out=first)
        first.square_().mul_(-0.5 * inv).exp_().mul_(keep[rows])
        torch.sum(first, -1, out=per_term[chain.anchor, rows])
        ratios: dict[float, Tensor] = {}
        cur = first
        for i, (kern, prev, delta, log_s) in enumerate(chain.steps):
            key, back = round(delta, 12), round(-delta, 12)
            if key not in ratios:
                if key not in ratio_bufs:
                    ratio_bufs[key] = torch.empty_like(bufs[0])
                ratio = ratio_bufs[key][: m.shape[0]]
                if back in ratios:
                    ratios[key] = torch.reciprocal(ratios[back], out=ratio)
                else:
                    ratios[key] = torch.mul(m, delta * inv, out=ratio).exp_()
            src = first if prev == chain.anchor else cur
            cur = torch.mul(src, ratios[key], out=chained[i % 2])
            cur.clamp_(min=floor * math.exp(-log_s))
            torch.sum(cur, -1, out=per_term[kern, rows])
    for kern, _, _, log_s in chain.steps:  # K = K̃ · s, once over all documents' sums
        per_term[kern].mul_(math.exp(log_s))
    return per_term.permute(1, 2, 0)


@dataclass(frozen=True)
class _NativeChain:
    """:class:`KernelChain` as the C stage takes it (``native_kernels.c``: tk_kernel_sums)."""

    anchor: int
    mu_anchor: float
    c: float
    rdelta: Tensor  # [R] float32: Δ/σ² of each distinct ratio
    rop: Tensor  # [R] int64: 0 exp, 1 square of ratio rsrc, 2 reciprocal of ratio rsrc
    rsrc: Tensor
    kern: Tensor  # [S] int64
    prev: Tensor
    ridx: Tensor
    lo: Tensor  # [S] float32: the per-value floor of each chained kernel (1e-30 / s_k)
    gain: Tensor  # [K] float32: s_k, 1 for the anchor


@lru_cache(maxsize=8)
def _native_chain(mu: tuple[float, ...], sigma: float) -> _NativeChain | None:
    chain = kernel_chain(mu, sigma)
    if chain is None:
        return None
    inv = 1.0 / sigma**2
    # the ratios e^{Δ·m/σ²}: by exp where they must be, else as the square or the reciprocal of one before
    # (TK: e^{10m} by exp, e^{20m} its square, e^{-20m} that one's reciprocal: one exp pass instead of three)
    deltas = sorted({round(d, 12) for _, _, d, _ in chain.steps}, key=lambda d: (abs(d), -d))
    rop, rsrc = [], []
    for q, d in enumerate(deltas):
        how = [(1, p) for p in range(q) if abs(2 * deltas[p] - d) < 1e-9]
        how += [(2, p) for p in range(q) if abs(deltas[p] + d) < 1e-9]
        op, src = how[0] if how else (0, q)
        rop.append(op)
        rsrc.append(src)
    gain = [1.0] * len(mu)
    for k, _, _, log_s in chain.steps:
        gain[k] = math.exp(log_s)
    if len(mu) > native.MAX_KERNELS or len(deltas) > native.MAX_RATIOS:
        return None
    return _NativeChain(
        anchor=chain.anchor,
        mu_anchor=mu[chain.anchor],
        c=-0.5 * inv,
        rdelta=torch.tensor([d * inv for d in deltas], dtype=torch.float32),
        rop=torch.tensor(rop, dtype=torch.int64),
        rsrc=torch.tensor(rsrc, dtype=torch.int64),
        kern=torch.tensor([s[0] for s in chain.steps], dtype=torch.int64),
        prev=torch.tensor([s[1] for s in chain.steps], dtype=torch.int64),
        ridx=torch.tensor([deltas.index(round(s[2], 12)) for s in chain.steps], dtype=torch.int64),
        lo=torch.tensor([math.exp(CHAIN_FLOOR - s[3]) for s in chain.steps], dtype=torch.float32),
        gain=torch.tensor(gain, dtype=torch.float32),
    )


def _chain_args(nc: _NativeChain, k: int) -> tuple:
    """The chain's arguments of the C stages (``native_kernels.c``: struct chain's order)."""
    return (
        k, nc.anchor, nc.mu_anchor, nc.c, COSINE_RANGE, len(nc.rdelta), nc.rdelta.data_ptr(),
        nc.rop.data_ptr(), nc.rsrc.data_ptr(), len(nc.kern), nc.kern.data_ptr(), nc.prev.data_ptr(),
        nc.ridx.data_ptr(), nc.lo.data_ptr(), nc.gain.data_ptr(),
    )  # fmt: skip


def _native_for(mu: tuple[float, ...], sigma: float, tq: int):
    """(library, chain) where the compiled stages take this chain and Tq query terms, else None."""
    if not 0 < tq <= native.MAX_QUERY_TERMS:  # an empty query: the C code divides by Tq
        return None
    nc = _native_chain(mu, sigma)
    lib = native.library("tk") if nc is not None else None
    return None if lib is None else (lib, nc)


def native_sums(match: Tensor, d_mask: Tensor, mu: tuple[float, ...], sigma: float) -> Tensor | None:
    """Σ_j K per (document, query term, kernel) [B, Tq, K] by the compiled chained stage (``aheadrank/kernels/native.py``):
    one pass over each document's cosines, the kernels' values kept in cache, padding skipped; the documents
    split over torch's thread count. None where it does not apply (no compiled library, not a float32 CPU
    tensor, more than 64 query terms, a chain it cannot take): the caller runs the PyTorch stage. Same sums as
    that stage within float32 rounding."""
    b, tq, td = match.shape
    if not (b and td) or match.device.type != "cpu" or match.dtype != torch.float32 or match.requires_grad:
        return None
    found = _native_for(mu, sigma, tq)
    if found is None:
        return None
    lib, nc = found
    m = match.transpose(1, 2).contiguous()  # [B, Td, Tq]: the storage ``cosines`` writes, so no copy
    keep = d_mask.expand(b, td).to(torch.uint8).contiguous()
    out = torch.empty(b, len(mu), tq, dtype=torch.float32)
    chain = _chain_args(nc, len(mu))
    threads = torch.get_num_threads()
    status = lib.tk_kernel_sums(native.ptr(m), native.ptr(keep), b, td, tq, *chain, native.ptr(out), threads)
    if status != 0:  # outside the C stage's limits, which _native_for checked: never a silent garbage sum
        raise RuntimeError(f"tk_kernel_sums refused its arguments (Tq={tq}, K={len(mu)})")
    return out.transpose(1, 2)


def stored_sums(
    q: Tensor, d: Tensor | QuantizedField, d_mask: Tensor, mu: tuple[float, ...], sigma: float
) -> Tensor | None:
    """Σ_j K per (document, query term, kernel) [B, Tq, K] straight from the stored term vectors, cosines and
    kernels in one compiled pass per document (``native_kernels.c``: tk_stored_sums): d [B, Td, n] is read in its
    own dtype (float16, bfloat16, int8 with per-term scales, float32), a few vectors at a time, and neither a
    float32 copy of it nor the [B, Tq, Td] cosines are made. q [1, Tq, n] float32, one query for every document.
    None where it does not apply (no compiled library, autograd, more than 64 query terms, a width not a multiple
    of 16, a chain it cannot take): the caller computes the cosines and runs :func:`kernel_features`. Same sums
    as that within float32 rounding (``tests/rankers/test_native_tk.py``)."""
    if q.dim() != 3 or q.shape[0] != 1 or q.dtype != torch.float32 or q.device.type != "cpu":
        return None
    if torch.is_grad_enabled() and (q.requires_grad or getattr(d, "requires_grad", False)):
        return None
    kind = native_kind(d)
    b, td, n = d.shape
    tq = q.shape[1]
    if kind is None or not (b and tq and td) or n != q.shape[2] or n % 16 or td > native.ATTENTION_MAX_KEYS:
        return None
    found = _native_for(mu, sigma, tq)
    if found is None:
        return None
    lib, nc = found
    values, scales = native_values(d)
    keep = d_mask.expand(b, td).to(torch.uint8).contiguous()
    out = torch.empty(b, len(mu), tq, dtype=torch.float32)
    q0 = q[0].contiguous()
    status = lib.tk_stored_sums(
        native.ptr(q0),
        native.ptr(values),
        None if scales is None else native.ptr(scales),
        kind,
        native.ptr(keep),
        b,
        td,
        n,
        tq,
        *_chain_args(nc, len(mu)),
        native.ptr(out),
        torch.get_num_threads(),
    )
    if status == -1:  # this build has no AVX-512 kernel (the limits were checked above)
        return None
    if status != 0:
        raise MemoryError("tk_stored_sums could not allocate its scratch")
    return out.transpose(1, 2)
