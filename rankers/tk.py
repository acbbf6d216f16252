"""TK (Transformer-Kernel): contextualised term vectors matched by a cosine matrix and 11 RBF kernels.

``t`` = word embeddings (taken from the base model's table), contextualised by a few small Transformer layers
shared by query and document over ``t + p`` (sinusoidal positions); ``t̂ = α·t + (1−α)·context(t + p)``.
Term vectors are unit-normalised; the stored document side is those vectors (field ``doc``, no special
tokens). ``M = q̂·d̂ᵀ`` (one GEMM over all candidates' terms); kernel k: ``K_k(M_ij) = exp(−(M_ij − μ_k)² / 2σ²)``, σ = 0.1,
μ = 1, 0.9, 0.7, …, −0.9. Per kernel: ``φ_log = Σ_i log(max(Σ_j K, 1e-10))·0.01`` and
``φ_len = Σ_i Σ_j K / |d|``; ``s = β·(w_log·φ_log) + γ·(w_len·φ_len)``.

With ``tk_base`` (variant ``tk-<n>l-base``) the contextualisation starts from the base instead of from scratch:
``t`` = the base's embedding (word + learned position, LayerNorm) and the layers are its first n, so the
term vectors start as the base's own layer-n token states mixed with its embedding (``rankers/config.py``).
"""

from __future__ import annotations

import math
import re
import weakref
from dataclasses import dataclass
from functools import lru_cache

import torch
import torch.nn.functional as F
from aheadrank.rankers.base import QueryState, Ranker
from aheadrank.rankers.base_model import base_embeddings, base_layer
from aheadrank.rankers.blocks import (
    TransformerLayer,
    key_mask,
    make_embeddings,
    matmul_t,
    pack_weight,
    run_layers,
    sinusoidal_positions,
)
from aheadrank.rankers.spec import RankerSpec, Variant, option
from aheadrank.rankers.text import positions
from torch import Tensor, nn

from aheadrank.kernels import native
from aheadrank.kernels.stored import QuantizedField, native_kind, native_values, widened

KERNEL_MU = (1.0, 0.9, 0.7, 0.5, 0.3, 0.1, -0.1, -0.3, -0.5, -0.7, -0.9)
KERNEL_SIGMA = 0.1


def kernel_features_reference(
    match: Tensor, q_mask: Tensor, d_mask: Tensor, mu: Tensor, sigma: float
) -> tuple[Tensor, Tensor]:
    """The kernel stage as the formula reads: every kernel of every (query term, document term) pair in one
    [B, Tq, Td, K] tensor. Differentiable; used for training and as the reference of :func:`kernel_features`."""
    k = torch.exp(-((match[..., None] - mu) ** 2) / (2 * sigma**2))  # [B, Tq, Td, K]
    k = k * d_mask[:, None, :, None].to(k.dtype)
    return pooled_features(k.sum(2), q_mask, d_mask)


def pooled_features(per_term: Tensor, q_mask: Tensor, d_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Σ_j K per (document, query term, kernel) [B, Tq, K] -> (φ_log, φ_len), each [B, K]."""
    qm = q_mask[..., None].to(per_term.dtype)
    log_feat = (torch.log(per_term.clamp(min=1e-10)) * 0.01 * qm).sum(1)
    doc_len = d_mask.sum(1).to(per_term.dtype).clamp(min=1.0)[:, None, None]
    len_feat = (per_term / doc_len * qm).sum(1)
    return log_feat, len_feat


# Exponents below this are raised to it: exp(-80) = 1.8e-35 is far below anything the features can see
# (Σ_j K is clamped at 1e-10 before the log, and Td · 1.8e-35 never reaches it), and it keeps exp() and the
# sum out of float32's subnormal range, where x86 runs 30x slower. Padding gets a cosine of 1e3: its
# exponent is raised to the floor too, so no mask multiplication is needed.
EXPONENT_FLOOR = -80.0
_FAR = 1e3
_BLOCK_VALUES = 1 << 19  # match values per block (2 MB of float32): the kernel loop stays in cache
# Stored vectors widened for the cosine GEMM 4x the default block (4 MB of float32, 20 documents of 130 terms):
# the GEMM has only Tq columns, so fewer, taller calls pay off. `bench/kernels.py --threads 2 --parts blocks
# --rounds 15 --chunk 300` (bench/results/kernels-blocks.json), tk-2l: 1.19x the whole path at d = 128 (300
# candidates), 1.07x at d = 493 (75); 8x the block: 1.12x / 1.00x
COSINE_BLOCK_FACTOR = 4
# The chained stage's per-value floor: 1e-30 (e^-69), still far below what the features see, above subnormals
_CHAIN_FLOOR = -69.0
_COSINE_RANGE = 1.0 + 1e-3  # cosines of unit vectors in float32 stay within this


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
    if (_COSINE_RANGE + abs(mu[anchor])) ** 2 / two_s2 > -_CHAIN_FLOOR - 5:
        return None
    steps = []
    for side in (1, -1):  # outward from the anchor: up the centres, then down
        chain = sorted(
            (k for k in range(len(mu)) if side * (mu[k] - mu[anchor]) > 0), key=lambda k: side * mu[k]
        )
        prev, log_s = anchor, 0.0
        for k in chain:
            log_s += -(mu[k] ** 2 - mu[prev] ** 2) / two_s2
            if abs(log_s) > 80 or abs(mu[k] - mu[prev]) * _COSINE_RANGE / sigma**2 > 80:
                return None
            steps.append((k, prev, mu[k] - mu[prev], log_s))
            prev = k
    return KernelChain(anchor, tuple(steps))


def kernel_centres(mu: Tensor) -> tuple[float, ...]:
    """The kernels' centres as the decimals they stand for: a float32 buffer's 0.9 is 0.89999998, and its
    unrounded differences (0.19999999, 0.20000001, ...) would each need a ratio pass of their own."""
    return tuple(round(x, 6) for x in mu.tolist())


def kernel_features(
    match: Tensor, q_mask: Tensor, d_mask: Tensor, mu: Tensor, sigma: float
) -> tuple[Tensor, Tensor]:
    """match [B, Tq, Td] cosine similarities; masks [B or 1, Tq] / [B, Td] -> (φ_log, φ_len), each [B, n_kernels].

    Online (no gradient) the kernels are evaluated over a cache-sized block of documents at a time, chained
    (:class:`KernelChain`): the Gaussians share σ, so a kernel is its neighbour times ``e^{Δ·m/σ²}`` and a
    constant. TK's 11 kernels take 3 ``exp`` passes (the anchor, ``e^{0.2·m/σ²}``, ``e^{0.1·m/σ²}``) and one
    reciprocal instead of 11 ``exp``; each kernel is then a multiply, a floor and ``Σ_j``. Same values as
    :func:`kernel_features_reference` up to float32 rounding and a 1e-30 floor per value
    (``tests/rankers/test_init_and_math.py``); centres the chain cannot reach exactly are evaluated one
    ``exp`` each (:func:`kernel_features_direct`). Where the compiled stage is available the same chain runs
    there, one pass per document (:func:`kernel_sums_native`)."""
    if match.requires_grad or match.dtype != torch.float32:
        return kernel_features_reference(match, q_mask, d_mask, mu, sigma)
    centres = kernel_centres(mu)
    chain = kernel_chain(centres, float(sigma))
    if chain is None:
        return kernel_features_direct(match, q_mask, d_mask, mu, sigma)
    per_term = kernel_sums_native(match, d_mask, centres, float(sigma))
    if per_term is not None:
        return pooled_features(per_term, q_mask, d_mask)
    b, tq, td = match.shape
    # Padding: its cosines are clamped into the cosine range (any value a padding slot holds stays finite
    # through the chain; real cosines are inside it already) and its anchor value is zeroed by a multiply
    # with the [B, 1, Td] mask (masked_fill over a broadcast mask runs ~8x slower), so every chained value of
    # it stays at the floor, as for a real cosine far from a kernel. The passes keep match's memory layout
    # (``cosines`` gives [B, Td, Tq] storage) and write into buffers allocated once per call.
    keep = d_mask[:, None, :].to(match.dtype)
    per_term = torch.empty(len(centres), b, tq, dtype=match.dtype, device=match.device)
    inv = 1.0 / sigma**2
    block = max(1, _BLOCK_VALUES // max(1, tq * td))
    floor = math.exp(_CHAIN_FLOOR)
    bufs = [torch.empty_like(match[:block]) for _ in range(4)]
    ratio_bufs: dict[float, Tensor] = {}
    for lo in range(0, b, block):
        rows = slice(lo, lo + block)
        m, first, *chained = (x[: min(block, b - lo)] for x in bufs)
        torch.clamp(match[rows], -_COSINE_RANGE, _COSINE_RANGE, out=m)
        torch.sub(m, centres[chain.anchor], out=first)
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
    return pooled_features(per_term.permute(1, 2, 0), q_mask, d_mask)


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
        lo=torch.tensor([math.exp(_CHAIN_FLOOR - s[3]) for s in chain.steps], dtype=torch.float32),
        gain=torch.tensor(gain, dtype=torch.float32),
    )


def _chain_args(nc: _NativeChain, k: int) -> tuple:
    """The chain's arguments of the C stages (``native_kernels.c``: struct chain's order)."""
    return (
        k, nc.anchor, nc.mu_anchor, nc.c, _COSINE_RANGE, len(nc.rdelta), nc.rdelta.data_ptr(),
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


def kernel_sums_native(match: Tensor, d_mask: Tensor, mu: tuple[float, ...], sigma: float) -> Tensor | None:
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


def kernel_sums_stored(
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


def kernel_features_direct(
    match: Tensor, q_mask: Tensor, d_mask: Tensor, mu: Tensor, sigma: float
) -> tuple[Tensor, Tensor]:
    """The kernels one ``exp`` each over a cache-sized block of documents, in place: ``t = match − μ_k``,
    ``t² · (−1/2σ²)``, floor, ``exp``, ``Σ_j`` (no mask multiplication: padding is a far cosine). The stage
    before the chain (kept for centres the chain cannot reach exactly, and as its benchmark reference)."""
    b, tq, td = match.shape
    far = match.masked_fill(~d_mask[:, None, :], _FAR)
    per_term = torch.empty(len(mu), b, tq, dtype=match.dtype, device=match.device)
    scale = -1.0 / (2 * sigma**2)
    block = max(1, _BLOCK_VALUES // max(1, tq * td))
    for lo in range(0, b, block):
        m = far[lo : lo + block]
        t = torch.empty_like(m)
        for k, centre in enumerate(mu.tolist()):
            torch.sub(m, centre, out=t)
            t.square_().mul_(scale).clamp_(min=EXPONENT_FLOOR).exp_()
            torch.sum(t, -1, out=per_term[k, lo : lo + block])
    return pooled_features(per_term.permute(1, 2, 0), q_mask, d_mask)


def cosines(q: Tensor, d: Tensor, out: Tensor | None = None, packed_q: Tensor | None = None) -> Tensor:
    """M = q̂·d̂ᵀ: q [1 or B, Tq, n], d [B, Td, n] -> [B, Tq, Td], a view of [B, Td, Tq] storage (``out``, when
    given). With one query that is one GEMM of every candidate term against the query's few terms, not a batch
    of B small ones (2.5x faster at Td = 128); the kernel stage's element-wise passes keep that layout and its
    ``Σ_j`` reduces over the strided axis."""
    b, td, tq = d.shape[0], d.shape[1], q.shape[1]
    if packed_q is not None:  # q[0] packed for oneDNN (blocks.pack_weight): inference on the CPU
        m = matmul_t(d.reshape(-1, d.shape[-1]), q[0], packed_q).view(b, td, tq)
        out = m if out is None else out.copy_(m)
    elif q.shape[0] == 1:  # out=None allocates (and keeps autograd: training goes through here)
        flat = None if out is None else out.view(-1, tq)
        out = torch.mm(d.reshape(-1, d.shape[-1]), q[0].T, out=flat).view(b, td, tq)
    else:
        out = torch.bmm(d, q.transpose(1, 2), out=out)
    return out.transpose(1, 2)


class TkRanker(Ranker):
    kind = "tk"
    derived_caches = ("_q_pack",)  # a weak reference and an opaque oneDNN tensor: neither pickles

    @property
    def fresh_modules(self) -> tuple[str, ...]:  # type: ignore[override]
        """The kernel weights and the mix; the contextualisation layers too unless they come from the base."""
        kernels = ("dense_log", "dense_len", "dense_comb", "mixer")
        return kernels if self.config.tk_base else (*kernels, "layers")

    def __init__(self, config, text=None, strategy=None):
        super().__init__(config, text, strategy)
        b, n = config.bert, config.hidden
        # tk_base: the base's embedding (init_from_base loads it and the layers, whose shape config.validate
        # checked is the base's); else a word table, sinusoids added in contextualize
        if config.tk_base:
            self.embeddings = make_embeddings(b)
        else:
            self.embeddings = nn.Embedding(b["vocab_size"], n, padding_idx=0)
        self.layers = nn.ModuleList(
            TransformerLayer(
                n,
                config.tk_heads,
                config.tk_ffn or n,
                b["layer_norm_eps"],
                b["hidden_dropout_prob"],
                b["attention_probs_dropout_prob"],
            )
            for _ in range(config.tk_layers)
        )
        self.mixer = nn.Parameter(torch.tensor(0.5))
        self.register_buffer("mu", torch.tensor(KERNEL_MU), persistent=False)
        self.dense_log = nn.Linear(len(KERNEL_MU), 1, bias=False)
        self.dense_len = nn.Linear(len(KERNEL_MU), 1, bias=False)
        self.dense_comb = nn.Linear(2, 1, bias=False)  # β, γ
        for lin in (self.dense_log, self.dense_len):
            nn.init.uniform_(lin.weight, -0.014, 0.014)
        # β = γ = 1 at the start: with both layers drawn near zero (as in the TK code) their product's
        # gradient vanishes and training stalls at the uniform softmax
        nn.init.ones_(self.dense_comb.weight)

    def field_dims(self) -> dict[str, int]:
        return {"doc": self.config.hidden}

    def query_ids(self, pieces: list[int]) -> list[int]:
        return list(pieces)

    def doc_ids(self, pieces: list[int]) -> list[int]:
        return list(pieces)

    def contextualize(self, ids: Tensor, mask: Tensor) -> Tensor:
        if self.config.tk_base:  # t = LayerNorm(word + learned position + type 0): what base layer 1 reads
            t = self.embeddings(ids, 0, positions(mask))
            x = t
        else:
            t = self.embeddings(ids)
            x = t + sinusoidal_positions(ids.shape[1], t.shape[-1], t.device)
        x = run_layers(self.layers, x, key_mask(mask))
        h = self.mixer * t + (1 - self.mixer) * x
        return F.normalize(h, dim=-1) * mask[..., None].to(h.dtype)

    def document_fields(self, ids: Tensor, mask: Tensor) -> dict[str, Tensor]:
        return {"doc": self.contextualize(ids, mask)}

    def query_state(self, ids: Tensor, mask: Tensor) -> QueryState:
        return QueryState({"q": self.contextualize(ids, mask)}, mask)

    def kernel_score(self, q: Tensor, q_mask: Tensor, d: Tensor, d_mask: Tensor) -> Tensor:
        """q [1 or B, Tq, n], d [B, Td, n] -> [B]. On the CPU, for one query and no gradients, cosines and kernels
        come from the compiled pass over d in its stored dtype (:func:`kernel_sums_stored`); elsewhere a stored d
        (float16, or int8 + scales) is widened a block of documents at a time, each block's cosines computed by
        one GEMM while it is in cache."""
        centres = kernel_centres(self.mu)
        per_term = kernel_sums_stored(q, d, d_mask, centres, KERNEL_SIGMA)  # compiled, from the stored dtype
        if per_term is not None:
            return self.combine(*pooled_features(per_term, q_mask, d_mask))
        packed = self._query_packed(q) if q.shape[0] == 1 else None  # once per query, for every block
        if d.dtype == q.dtype or d.device.type != "cpu":
            match = cosines(q, d.to(q.dtype), packed_q=packed)
        else:
            terms = q.new_empty(d.shape[0], d.shape[1], q.shape[1])
            for rows, block in widened(d, q.dtype, COSINE_BLOCK_FACTOR):
                cosines(q if q.shape[0] == 1 else q[rows], block, out=terms[rows], packed_q=packed)
            match = terms.transpose(1, 2)
        return self.combine(*kernel_features(match, q_mask, d_mask, self.mu, KERNEL_SIGMA))

    def combine(self, log_feat: Tensor, len_feat: Tensor) -> Tensor:
        """The score from the pooled kernel features (φ_log, φ_len) [B, K] -> [B]."""
        both = torch.cat([self.dense_log(log_feat), self.dense_len(len_feat)], -1)
        return self.dense_comb(both).squeeze(-1)

    def _query_packed(self, q: Tensor) -> Tensor | None:
        """q[0] packed for oneDNN (:func:`pack_weight`, ~0.2 ms), kept for the next call with the same query
        tensor: a request scores its candidates in several chunks, each a call with the query state's q."""
        cached = self.__dict__.get("_q_pack")
        if cached is not None and cached[0]() is q:
            return cached[1]
        packed = pack_weight(q[0], q)
        self.__dict__["_q_pack"] = (weakref.ref(q), packed)
        return packed

    def score_batch(self, qs: QueryState, fields: dict[str, Tensor], mask: Tensor) -> Tensor:
        return self.kernel_score(qs["q"], qs.mask, fields["doc"], mask)

    def forward_pairs(self, q_ids: Tensor, q_mask: Tensor, d_ids: Tensor, d_mask: Tensor) -> Tensor:
        return self.kernel_score(
            self.contextualize(q_ids, q_mask), q_mask, self.contextualize(d_ids, d_mask), d_mask
        )

    @torch.no_grad()
    def fit_kernel_weights(
        self, lists: list[tuple[str, list[str], list[float]]], ridge: float = 1e-3, batch: int = 64
    ) -> dict:
        """Fit the kernel weights (``w_log``, ``w_len``; β = γ = 1) by ridge regression so that the score follows
        ``lists`` of (query, document texts, target scores) — e.g. a teacher's over the query's candidates —
        within each query: features and targets are centred per query (a ranking ignores a query's offset) and
        the targets z-scored per query (the scale the listwise loss reads them at). ``ridge`` is relative to the
        mean variance of the features. The contextualisation is not touched. Returns the fit's record (pairs,
        queries, R² within queries), also kept in ``config.extra["kernel_fit"]``."""
        from aheadrank.rankers.text import pad

        was_training = self.training
        self.eval()
        xs, ys = [], []
        for query, texts, target in lists:
            if len(texts) < 2:
                continue
            q_ids, q_mask = pad(self.tokenize_queries([query]), self.device)
            q = self.contextualize(q_ids, q_mask)
            feats = []
            for i in range(0, len(texts), batch):
                d_ids, d_mask = pad(self.tokenize_documents(texts[i : i + batch]), self.device)
                match = cosines(q, self.contextualize(d_ids, d_mask))
                feats.append(torch.cat(kernel_features(match, q_mask, d_mask, self.mu, KERNEL_SIGMA), -1))
            x = torch.cat(feats).double()
            y = torch.tensor(target, dtype=torch.float64, device=x.device)
            y = (y - y.mean()) / y.std().clamp(min=1e-6)
            xs.append(x - x.mean(0))
            ys.append(y)
        if not xs:
            raise ValueError("fit_kernel_weights needs at least one query with two or more documents")
        x, y = torch.cat(xs), torch.cat(ys)
        lam = ridge * float(x.var(0).mean()) * len(x)
        w = torch.linalg.solve(x.T @ x + lam * torch.eye(x.shape[1], dtype=x.dtype, device=x.device), x.T @ y)
        k = len(KERNEL_MU)
        self.dense_log.weight.copy_(w[:k].to(self.dense_log.weight.dtype)[None])
        self.dense_len.weight.copy_(w[k:].to(self.dense_len.weight.dtype)[None])
        nn.init.ones_(self.dense_comb.weight)
        residual = float(((x @ w - y) ** 2).sum() / (y**2).sum())
        self.train(was_training)
        record = {"pairs": len(x), "queries": len(xs), "ridge": ridge, "r2": round(1.0 - residual, 4)}
        self.config.extra = {**self.config.extra, "kernel_fit": record}  # saved with every later checkpoint
        return record

    def init_from_base(self, sd: dict[str, Tensor]) -> None:
        """``tk_base``: the base's embedding and first layers as they are. Else the base's word embeddings, rescaled to a mean norm of √n: the scale of the sinusoidal positions
        and of the post-LN context layers. Cosine matching is scale-free, but at BERT's scale (norm ≈ 1) the
        position term drowns ``t + p`` and the context term drowns the α-mix, and training stalls."""
        if self.config.tk_base:
            self.embeddings.load_state_dict(base_embeddings(sd))
            for i, layer in enumerate(self.layers):
                layer.load_state_dict(base_layer(sd, i))
            return
        table = base_embeddings(sd)["word_embeddings.weight"]
        scale = math.sqrt(table.shape[1]) / table.norm(dim=1).mean()
        self.embeddings.weight.data.copy_(table * scale)


@dataclass
class TkOptions:
    tk_layers: int = option(2, "contextualisation layers", flag="--layers")
    tk_heads: int = option(8, "attention heads of the contextualisation (with --tk-base: the base's)")
    tk_ffn: int = option(384, "FFN width of the contextualisation (with --tk-base: the base's)")
    tk_base: bool = option(
        False,
        "the contextualisation starts from the base's embedding and first --layers layers, or from small random "
        "layers over its word embeddings",
        flag="--tk-base/--tk-scratch",
    )


def parse_tk(name: str) -> Variant | None:
    """``tk-<n>l`` (``-base`` / ``-scratch``: the contextualisation from the base's layers or from small random
    ones; neither: the default, written out so that the two never share a cache key)."""
    if m := re.fullmatch(r"tk-(\d+)l(-base|-scratch)?", name):
        base = m.group(2) == "-base" if m.group(2) else TkOptions.tk_base
        return Variant(name, name, "tk", {"tk_layers": int(m.group(1)), "tk_base": base})
    return None


SPEC = RankerSpec(
    "tk",
    TkRanker,
    TkOptions,
    variants=("tk-1l", "tk-2l"),
    parse=parse_tk,
    default_variant="tk-2l",
    grammar="tk-<n>l[-base|-scratch]",
)
