"""Attention of a few query rows over keys and values as the store hands them over: one interface, the reference
in PyTorch and the hand-written kernel (the ``attention`` family of :mod:`aheadrank.kernels.native`) behind the same
signature. :func:`context` is softmax(q·kᵀ/√dh)·v (MORES' interaction blocks, the query encoders' attention);
:func:`attend` the same with a given scale, each row's log-sum-exp and keys extended by one value (PreTTR's [CLS]
over stored states, its folded decompression). The kernel runs where it applies (:func:`native`), else PyTorch's
code: the same values within float32 rounding (``tests/rankers/test_native_attention.py``). PyTorch's CPU
attention is slow on these shapes (19 rows × 130 keys × 32 per head; ``bench/online_kernels.py --parts native``).

Shapes: q [1 or B, h, Tq, dh] float32, k / v [B, T, h·dh] (a Tensor in any float dtype, or a
:class:`~aheadrank.kernels.stored.QuantizedField`), mask None or [B or 1, 1, 1, T] bool (True: a real token).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from aheadrank.kernels import native as _native
from aheadrank.kernels.stored import QuantizedField, native_kind, native_values, widened

Field = Tensor | QuantizedField


def context(q: Tensor, k: Field, v: Field, mask: Tensor | None, dropout: float = 0.0) -> Tensor:
    """softmax(q·kᵀ/√dh)·v -> [B, Tq, h·dh]: the kernel where it applies (no ``dropout``: inference), else
    PyTorch's attention (:func:`reference_context`)."""
    if not dropout:
        found = native(q, k, v, mask, q.shape[-1] ** -0.5)
        if found is not None:
            return found[0]
    return reference_context(q, k, v, mask, dropout)


def reference_context(q: Tensor, k: Field, v: Field, mask: Tensor | None, dropout: float = 0.0) -> Tensor:
    """:func:`context` in PyTorch (``scaled_dot_product_attention``, with ``dropout`` on the weights). Keys and
    values in a narrower dtype than q are widened a few documents at a time, right before those documents'
    attention (:func:`~aheadrank.kernels.stored.widened`), instead of one float32 copy of every candidate's."""
    if k.dtype != q.dtype:
        if k.device.type != "cpu":
            return reference_context(q, k.to(q.dtype), v.to(q.dtype), mask, dropout)
        out = q.new_empty(k.shape[0], q.shape[2], k.shape[2])
        for (rows, kw), (_, vw) in zip(widened(k, q.dtype), widened(v, q.dtype), strict=True):
            part = mask if mask is None or mask.shape[0] == 1 else mask[rows]
            out[rows] = reference_context(q if q.shape[0] == 1 else q[rows], kw, vw, part, dropout)
        return out
    b, t, _ = k.shape
    h, dh = q.shape[1], q.shape[3]
    kh, vh = (x.view(b, t, h, dh).transpose(1, 2) for x in (k, v))
    if q.shape[0] != b:
        q = q.expand(b, -1, -1, -1)
    ctx = F.scaled_dot_product_attention(q, kh, vh, attn_mask=mask, dropout_p=dropout)
    return ctx.transpose(1, 2).reshape(b, ctx.shape[2], -1)


def attend(
    q: Tensor, k: Field, v: Field, mask: Tensor | None, scale: float, **options: Any
) -> tuple[Tensor, Tensor | None]:
    """softmax(scale·q·kᵀ)·v and, with ``lse=True``, each row's log-sum-exp of its scores [B, h, Tq]; the
    ``options`` (``lse``, ``key_scale``, ``extra``, ``quad``) as :func:`native` reads them: the kernel where it
    applies, else :func:`reference_attend`."""
    found = native(q, k, v, mask, scale, **options)
    if found is not None:
        return found
    return reference_attend(q, k, v, mask, scale, **options)


def reference_attend(
    q: Tensor,
    k: Field,
    v: Field,
    mask: Tensor | None,
    scale: float,
    lse: bool = False,
    key_scale: Tensor | None = None,
    extra: Tensor | None = None,
    quad: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """:func:`attend` as the formula reads, in float32, a block of documents at a time (widened as
    :func:`reference_context` widens them); ``key_scale``, ``extra`` and ``quad`` with v = k only (as the kernel).
    Padding is never read; a document without a real token gives zeros and a log-sum-exp of −inf."""
    b, t, n = k.shape
    h = q.shape[1]
    extended = extra is not None or quad is not None
    out = q.new_empty(b, q.shape[2], n + extended)
    lse_out = q.new_empty(b, h, q.shape[2]) if lse else None
    for rows, kb, vb, own in _float_blocks(k, v):
        part = None if mask is None else mask if mask.shape[0] == 1 else mask[rows]
        if part is not None:  # padding is never read, whatever it holds (as the kernel skips it)
            pad = ~part.reshape(-1, t, 1)
            if own:  # a widened block: a buffer of this call's own
                kb.masked_fill_(pad, 0.0)
                vb = vb if v is k else vb.masked_fill_(pad, 0.0)
            else:
                kb, vb = kb.masked_fill(pad, 0.0), (None if v is k else vb.masked_fill(pad, 0.0))
        if quad is not None:  # x_j = (max(r_j·(diag ⊙ r_j + g2) + bb, 0)/n + ε)^−½, the row scaled by it
            diag, g2, (bb, inv_n, eps) = quad[:n], quad[n : 2 * n], quad[2 * n :].tolist()
            x = ((kb * (diag * kb + g2)).sum(-1) + bb).clamp(min=0.0).mul(inv_n).add(eps).rsqrt()
            kb = torch.cat([kb * x[..., None], x[..., None]], -1)
        else:
            if key_scale is not None:
                kb = kb * key_scale[rows, :, None].float()
            if extra is not None:
                kb = torch.cat([kb, extra[rows, :, None].float()], -1)
        if v is k:
            vb = kb
        nb = kb.shape[0]
        kh, vh = (x.view(nb, t, h, -1).transpose(1, 2) for x in (kb, vb))
        scores = (q if q.shape[0] == 1 else q[rows]) * scale @ kh.transpose(-1, -2)  # [nb, h, Tq, T]
        if part is not None:
            scores = scores.masked_fill(~part, float("-inf"))
        if lse_out is not None:
            lse_out[rows] = torch.logsumexp(scores, -1)
        p = scores.softmax(-1)
        if part is not None:  # a document without a real token: zeros (lse −inf), as the kernel gives
            p = p.nan_to_num(0.0) if torch.is_grad_enabled() else p.nan_to_num_(0.0)
        out[rows] = (p @ vh).transpose(1, 2).reshape(nb, q.shape[2], -1)
    return out, lse_out


def _float_blocks(k: Field, v: Field):
    """(rows, k[rows], v[rows], whether the blocks are buffers of this call's own) in float32: float32 tensors (and
    those on another device) whole, narrower stored fields a block of documents at a time; v is k's block where
    v is k."""
    if isinstance(k, Tensor) and (k.dtype == torch.float32 or k.device.type != "cpu"):
        kf = k.float()
        yield slice(None), kf, kf if v is k else v.float(), False
        return
    if v is k:
        for rows, kb in widened(k, torch.float32):
            yield rows, kb, kb, True
        return
    for (rows, kb), (_, vb) in zip(widened(k, torch.float32), widened(v, torch.float32), strict=True):
        yield rows, kb, vb, True


def native(
    q: Tensor,
    k: Tensor | QuantizedField,
    v: Tensor | QuantizedField,
    mask: Tensor | None,
    scale: float,
    lse: bool = False,
    key_scale: Tensor | None = None,
    extra: Tensor | None = None,
    quad: Tensor | None = None,
) -> tuple[Tensor, Tensor | None] | None:
    """The native path of :func:`attend`: the kernel (``native_kernels.c``: cross_attention) for a few query rows (at
    most 32), reading keys and values in their own dtype (stored float16, bfloat16, or int8 with one scale per
    token; float32 for the query rows' own self-attention): per document and head, the real tokens' rows are
    widened into a cache-resident scratch and used at once, padding is skipped, and no float32 copy of the
    candidates' fields is made; the documents are split over torch's OpenMP threads. The scores' scale is given
    (``scale·q·kᵀ``) and, with ``lse``, also each row's
    log-sum-exp of its scores [B, h, Tq], for merging with scores over other keys (PreTTR's query tokens). A
    head may be as wide as the states (dh a multiple of 16 up to 512: h = 1 reads whole rows), and v may be k.
    With
    ``key_scale`` [B, T] (v = k only) each token's row is multiplied by its scale (with an int8 field's own).
    With ``extra`` [B, T] or ``quad`` (h = 1, v = k) each key and value is its row followed by one
    more value x_j, q's rows are n + 1 wide (their last value: the coefficient on x_j) and so is the output;
    ``extra`` gives x_j, ``quad`` [2n + 3] = (diag, g2, bb, 1/n, ε) has the kernel compute it from the row it
    widens, x_j = (max(r_j·(diag ⊙ r_j + g2) + bb, 0)/n + ε)^−½, and scale the row by it (PreTTR's folded
    decompression: keys [r/σ, 1/σ] read from the stored r). Returns (context [B, Tq, h·dh], lse or None), or None
    where the kernel does not apply (no compiled kernels or no AVX-512, autograd, a head size, row or key count
    outside the kernel's limits, a per-row mask): :func:`attend` then runs the reference."""
    if q.device.type != "cpu" or q.dtype != torch.float32 or q.dim() != 4:
        return None
    if torch.is_grad_enabled() and any(getattr(x, "requires_grad", False) for x in (q, k, v)):
        return None  # no backward through the kernel: autograd keeps PyTorch's attention
    quant = isinstance(k, QuantizedField)
    if quant != isinstance(v, QuantizedField) or k.shape != v.shape or len(k.shape) != 3:
        return None
    kind = native_kind(k)
    if kind is None or (not quant and v.dtype != k.dtype):
        return None
    bq, h, tq, width = q.shape
    b, t, n = k.shape
    extended = extra is not None or quad is not None
    dh = width - 1 if extended else width
    if (
        not _native.attention_head_dim(dh)
        or not 1 <= tq <= _native.ATTENTION_MAX_ROWS
        or not 1 <= t <= _native.ATTENTION_MAX_KEYS
        or n != h * dh
        or bq not in (1, b)
        or b == 0
    ):
        return None
    if extended and (h != 1 or bq != 1 or v is not k):
        return None
    if extra is not None and quad is not None:
        return None
    if quad is not None and (
        quad.shape != (2 * n + 3,) or quad.dtype != torch.float32 or key_scale is not None
    ):
        return None
    per_token = [x for x in (key_scale, extra) if x is not None]
    if per_token and (v is not k or any(x.shape != (b, t) or x.device.type != "cpu" for x in per_token)):
        return None
    if mask is not None and (mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1:3] != (1, 1)):
        return None
    lib = _native.library("attention")
    if lib is None:
        return None
    qs = q * scale
    coef = None
    if extended:  # the rows' coefficients on the extra value go in apart from the rows
        coef = qs[0, 0, :, dh].contiguous()
        qs = qs[..., :dh]
    qs = qs.contiguous()
    keep = None if mask is None else mask.reshape(-1, t).expand(b, t).contiguous().view(torch.uint8)

    k_values, k_scales = native_values(k)
    if key_scale is not None:
        k_scales = key_scale.float() if k_scales is None else k_scales * key_scale
        k_scales = k_scales.contiguous()
    v_values, v_scales = (k_values, k_scales) if v is k else native_values(v)  # one tensor: widened once
    extra = None if extra is None else extra.float().contiguous()
    quad = None if quad is None else quad.contiguous()
    out = torch.empty(b, tq, h * dh + extended, dtype=torch.float32)
    lse_out = torch.empty(b, h, tq, dtype=torch.float32) if lse else None
    status = lib.cross_attention(
        _native.ptr(qs),
        bq,
        _native.ptr(k_values),
        _native.ptr(v_values),
        None if k_scales is None else _native.ptr(k_scales),
        None if v_scales is None else _native.ptr(v_scales),
        kind,
        None if keep is None else _native.ptr(keep),
        b,
        t,
        h,
        dh,
        tq,
        _native.ptr(out),
        None if lse_out is None else _native.ptr(lse_out),
        None if extra is None else _native.ptr(extra),
        None if coef is None else _native.ptr(coef),
        None if quad is None else _native.ptr(quad),
        torch.get_num_threads(),
    )
    if status == -1:  # this build has no AVX-512 kernel (the limits were checked above)
        return None
    if status != 0:
        raise MemoryError("cross_attention could not allocate its scratch")
    return out, lse_out
