"""A BERT layer, and a stack of them, over a few rows (a query encoder's tokens) behind one interface: :func:`layer`
and :func:`stack` run the hand-written kernel (the ``layer`` family of :mod:`aheadrank.kernels.native`:
encoder_layer, encoder_stack) where it applies, else the caller's PyTorch layer (``reference``). The layer's
weights come in as :class:`LayerWeights` (plain tensors, built and kept by the ranker's layer), never as a module.

The whole layer in one call: Q, K, V, the attention over each sequence's real tokens, the output projection with
its residual and LayerNorm, the feed-forward with its GELU, residual and LayerNorm, over packed panels of the
weights (:func:`pack_panels`). The same layer as separate calls spent more time between the compiled linears than in
them (the PreTTR l5 query side: 3.4 ms, of which 1.8 in the kernels); a stack in one call saves a Python wrapper, a
parallel region and its scratch per layer (~50 µs a layer). Same values as PyTorch's layer within float32 rounding
(``tests/rankers/test_native_layer.py``).

Shapes: x [B, T, n] float32 on the CPU, mask None or a key mask [B, 1, 1, T] bool (True: a real token).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch
from torch import Tensor

from aheadrank.kernels import native as _native

# At most this many rows in all (B·T: a query encoder's tokens) go through the kernel
MAX_ROWS = 64
_MIN_FEATURES = 16  # a linear with fewer inputs or outputs: the kernel declines (as the packed linears do)


def pack_panels(w: Tensor) -> Tensor:
    """w [N, K] as the kernel reads it: panels of ``native.SKINNY_PANEL`` output columns, [ceil(N / P), K, P]
    float32, the columns past N zero."""
    n, k = w.shape
    p = _native.SKINNY_PANEL
    panels = w.new_zeros(-(-n // p) * p, k, dtype=torch.float32)
    panels[:n] = w.detach()
    return panels.view(-1, p, k).transpose(1, 2).contiguous()


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """A BERT layer's parameters as the kernel takes them: ``heads``, the (weight, bias) of its linears in the order
    Q, K, V, attention output, intermediate, output, and the (weight, bias, eps) of its two LayerNorms (the
    attention's, the feed-forward's). Built by the ranker's layer and kept while none of them changes; the panels and
    the kernel's arguments are made on first use (:attr:`arguments`) and kept with it."""

    heads: int
    linears: tuple[tuple[Tensor, Tensor], ...]
    norms: tuple[tuple[Tensor, Tensor, float], ...]

    @cached_property
    def arguments(self) -> tuple[int, tuple] | None:
        """(n, encoder_layer's weight arguments) where the kernel takes these weights (float32 on the CPU, not
        inference tensors, contiguous, linears at least 16 wide, LayerNorms over n), else None. The panels the
        addresses point into are kept in this object."""
        n = self.linears[0][0].shape[1]
        params = [p for lin in self.linears for p in lin] + [p for w, b, _ in self.norms for p in (w, b)]
        ok = all(
            p.dtype == torch.float32 and p.device.type == "cpu" and not p.is_inference() and p.is_contiguous()
            for p in params
        ) and all(w.shape == (n,) for w, _, _ in self.norms)
        if not ok or any(min(w.shape) < _MIN_FEATURES for w, _ in self.linears):
            return None
        panels = [pack_panels(w) for w, _ in self.linears]
        self.__dict__["_panels"] = panels  # alive while the addresses are
        (ln1_w, ln1_b, eps1), (ln2_w, ln2_b, eps2) = self.norms
        qkvo = (v for pan, (_, b) in zip(panels[:4], self.linears[:4], strict=True) for v in (pan, b))
        inner_bias, out_bias = self.linears[4][1], self.linears[5][1]
        return n, (
            self.heads,
            *(t.data_ptr() for t in qkvo),
            ln1_w.data_ptr(),
            ln1_b.data_ptr(),
            float(eps1),
            panels[4].data_ptr(),
            inner_bias.data_ptr(),
            self.linears[4][0].shape[0],
            panels[5].data_ptr(),
            out_bias.data_ptr(),
            ln2_w.data_ptr(),
            ln2_b.data_ptr(),
            float(eps2),
        )


def layer(
    weights: LayerWeights | None, x: Tensor, mask: Tensor | None, reference: Callable[[], Tensor]
) -> Tensor:
    """The layer on x: the kernel where it applies (:func:`native`), else ``reference()`` (the ranker's PyTorch
    layer on the same x and mask). ``weights`` None: the reference."""
    found = native(weights, x, mask)
    return found if found is not None else reference()


def stack(
    weights: Sequence[LayerWeights | None] | None,
    x: Tensor,
    mask: Tensor | None,
    reference: Callable[[], Tensor],
) -> Tensor:
    """Layers one after the other on x: all of them by one kernel call where it applies (:func:`native_stack`),
    else ``reference()`` (the layers one by one, each of which may take :func:`layer`)."""
    found = None if weights is None else native_stack(weights, x, mask)
    return found if found is not None else reference()


def native(weights: LayerWeights | None, x: Tensor, mask: Tensor | None) -> Tensor | None:
    """The layer by one kernel call (encoder_layer) for at most :data:`MAX_ROWS` rows in all, or None where it does
    not apply (no weights the kernel takes, autograd, autocast, torch.compile tracing, more rows, a per-row mask,
    the ``layer`` family off or no compiled kernels)."""
    found = _inputs(weights, x, mask)
    if found is None:
        return None
    lib, flat, keep_ptr, (_, args), _keep = found
    b, t, n = flat.shape
    out = torch.empty_like(flat)
    status = lib.encoder_layer(
        _native.ptr(flat), b, t, n, keep_ptr, *args, _native.ptr(out), torch.get_num_threads()
    )
    if status == -2:
        raise MemoryError("encoder_layer could not allocate its scratch")
    return out if status == 0 else None


def native_stack(weights: Sequence[LayerWeights | None], x: Tensor, mask: Tensor | None) -> Tensor | None:
    """The layers one after the other by one kernel call (encoder_stack), each as :func:`native` runs it (the same
    bits), or None where :func:`native` would not take one of them. The weights' addresses are kept with the first
    layer's weights while the same :class:`LayerWeights` are given."""
    if not weights or len(weights) > _native.ENCODER_STACK_MAX_LAYERS:
        return None
    found = _inputs(weights[0], x, mask)
    if found is None:
        return None
    lib, flat, keep_ptr, (n, _), _keep = found
    for w in weights[1:]:
        if w is None or w.arguments is None or w.arguments[0] != n:
            return None
    packed = _stack_arguments(weights)
    b, t, _ = flat.shape
    out = torch.empty_like(flat)
    tmp = torch.empty_like(flat) if len(weights) > 1 else None
    status = lib.encoder_stack(
        _native.ptr(flat),
        b,
        t,
        n,
        keep_ptr,
        len(weights),
        *(_native.ptr(p) for p in packed),
        _native.ptr(out),
        None if tmp is None else _native.ptr(tmp),
        torch.get_num_threads(),
    )
    if status == -2:
        raise MemoryError("encoder_stack could not allocate its scratch")
    return out if status == 0 else None


def _inputs(weights: LayerWeights | None, x: Tensor, mask: Tensor | None) -> tuple | None:
    """(the kernels, x contiguous, the key mask's uint8 address or None, ``weights.arguments``, the mask's bytes)
    where the kernel applies to these weights on x and mask, else None."""
    if weights is None or x.dim() != 3 or x.device.type != "cpu" or x.dtype != torch.float32:
        return None
    if torch.is_grad_enabled() or torch.is_autocast_enabled("cpu") or torch.compiler.is_compiling():
        return None
    b, t, n = x.shape
    if not 1 <= b * t <= MAX_ROWS or t > _native.ENCODER_LAYER_MAX_TOKENS:
        return None
    keep = None
    if mask is not None:
        if mask.dtype != torch.bool or mask.shape != (b, 1, 1, t):
            return None
        keep = mask.reshape(b, t).contiguous().view(torch.uint8)
    lib = _native.library("layer")
    args = weights.arguments if lib is not None else None
    if args is None or n != args[0]:
        return None
    # the mask's bytes are kept alive by the caller's mask (a view where it was contiguous) or by this tuple
    return lib, x.contiguous(), None if keep is None else _native.ptr(keep), args, keep


def _stack_arguments(weights: Sequence[LayerWeights]) -> tuple[Tensor, Tensor, Tensor]:
    """(the weights' addresses int64 [L, 16], [heads, inner] int64 [L, 2], the LayerNorms' eps float32 [L, 2]) for
    encoder_stack, kept in the first layer's weights while the same ones follow it."""
    rest = tuple(weights[1:])  # the first holds the cache (no reference to itself)
    cached = weights[0].__dict__.get("_stack")
    if cached is not None and len(cached[0]) == len(rest):
        if all(a is c for a, c in zip(rest, cached[0], strict=True)):
            return cached[1]
    ptrs, dims, eps = [], [], []
    for w in weights:
        # encoder_layer's order: heads, Q, bq, K, bk, V, bv, O, bo, ln1 w, b, eps1, W1, b1, inner, W2, b2, ln2 w, b, eps2
        heads, *qkvo, ln1_w, ln1_b, eps1, w1, b1, inner, w2, b2, ln2_w, ln2_b, eps2 = w.arguments[1]
        ptrs.append([*qkvo, ln1_w, ln1_b, w1, b1, w2, b2, ln2_w, ln2_b])
        dims.append([heads, inner])
        eps.append([eps1, eps2])
    packed = (
        torch.tensor(ptrs, dtype=torch.int64),
        torch.tensor(dims, dtype=torch.int64),
        torch.tensor(eps, dtype=torch.float32),
    )
    weights[0].__dict__["_stack"] = (rest, packed)
    return packed
