"""Stored fields as the scoring paths read them: :class:`QuantizedField` (int8 values with one scale per token, as
the store hands them over), the blocks of documents a narrower stored dtype is widened by (:func:`widened`: a
block's float32 copy used while it is in cache), and a field as the native kernels read it in place
(:func:`native_kind`, :func:`native_values`). The rankers and the kernels' interface share them."""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch import Tensor

# Stored fields in float16/bfloat16 are widened to float32 this many values (1 MB) at a time: a block's
# float32 copy stays in cache for the computation that reads it right away (bench/online_kernels.py measures it).
STORED_BLOCK_VALUES = 1 << 18
# ... but never fewer documents than this: below it the per-call cost of the attention on one long document
# (d = 493: one document per 1 MB block) outweighs what the cache saves (bench/online_kernels.py, MORES 1xIB S2)
STORED_BLOCK_MIN_DOCS = 8
# Both stay module constants, not parameters: the tests shrink them (monkeypatch) to drive a whole ranker's
# score_batch through blocks of one or a few documents (tests/rankers/test_equivalence.py, test_linear.py,
# test_init_and_math.py); as parameters they would be threaded through every ranker's stored-field path for
# the tests alone. Nothing else sets them.


class QuantizedField:
    """A stored int8 field as the store hands it over: values [B, T, dim] int8 and one float32 scale per token
    [B, T] (0 at padding), never dequantised whole. It answers what the scoring paths ask of a stored field
    (``dtype``, ``shape``, ``device``, ``[rows]``, ``to(dtype)``); ``to`` dequantises ``values * scale`` straight
    into the compute dtype in one pass, and the attention and pooling call it a block of documents at a time
    (:func:`widened`), so no float16 or float32 copy of every candidate's field is made."""

    dtype = torch.int8

    def __init__(self, values: Tensor, scale: Tensor):
        if values.dtype != torch.int8 or scale.shape != values.shape[:-1]:
            raise ValueError(
                f"int8 values [B, T, dim] and scales [B, T], got {values.dtype} {tuple(scale.shape)}"
            )
        self.values, self.scale = values, scale

    @classmethod
    def quantize(cls, x: Tensor) -> QuantizedField:
        """x [B, T, dim] -> int8 with one scale per token (absmax / 127), as the store quantises."""
        scale = x.float().abs().amax(-1) / 127
        values = torch.round(x.float() / scale.clamp(min=1e-30).unsqueeze(-1)).clamp_(-127, 127)
        return cls(values.to(torch.int8), scale)

    @property
    def shape(self) -> torch.Size:
        return self.values.shape

    @property
    def device(self) -> torch.device:
        return self.values.device

    def __len__(self) -> int:
        return self.values.shape[0]

    def __getitem__(self, rows: slice) -> QuantizedField:
        if not isinstance(rows, slice):
            raise TypeError("a QuantizedField is sliced by documents (a slice of the first dimension)")
        return QuantizedField(self.values[rows], self.scale[rows])

    def to(self, dtype: torch.dtype) -> Tensor:
        return self.widen_into(torch.empty(self.shape, dtype=dtype, device=self.device))

    def widen_into(self, out: Tensor) -> Tensor:
        """``values * scale`` written into ``out`` (a float tensor of this shape): on a GPU one pass (int8 times
        float32, promoted as it is computed), elsewhere two in-place passes (PyTorch's mixed-dtype product runs 4.5x
        slower than the copy and the product on the CPU). The same values either way."""
        if out.device.type == "cuda":
            return torch.mul(self.values, self.scale.unsqueeze(-1), out=out)
        return out.copy_(self.values).mul_(self.scale.unsqueeze(-1))

    def float(self) -> Tensor:
        return self.to(torch.float32)


def stored_blocks(x: Tensor | QuantizedField, factor: int = 1) -> list[slice]:
    """Slices of x's first dimension (documents [B, T, dim]) of about ``factor`` × STORED_BLOCK_VALUES values
    each (at least STORED_BLOCK_MIN_DOCS documents)."""
    per_doc = max(1, math.prod(x.shape[1:]))
    step = max(STORED_BLOCK_MIN_DOCS, factor * STORED_BLOCK_VALUES // per_doc)
    return [slice(lo, lo + step) for lo in range(0, x.shape[0], step)]


def widened(
    x: Tensor | QuantizedField, dtype: torch.dtype, factor: int = 1
) -> Iterator[tuple[slice, Tensor]]:
    """``(rows, x[rows] in dtype)`` for the blocks of :func:`stored_blocks` (``factor``: blocks that many times
    the default size), each widened into one buffer allocated once per call: a block's values are used while
    they are in cache, and no block allocates (fresh pages cost more than the conversion: bench/online_kernels.py). A
    yielded tensor is overwritten by the next block: use it before asking for the next."""
    blocks = stored_blocks(x, factor)
    if not blocks:
        return
    step = blocks[0].stop - blocks[0].start
    buf = torch.empty((min(step, x.shape[0]), *x.shape[1:]), dtype=dtype, device=x.device)
    for rows in blocks:
        part = x[rows]
        out = buf[: part.shape[0]]
        yield rows, part.widen_into(out) if isinstance(part, QuantizedField) else out.copy_(part)


# native_kernels.c: the kind of a stored field the kernels read in place (int8 QuantizedFields: 2)
_NATIVE_KV_KINDS = {torch.float16: 0, torch.bfloat16: 1, torch.float32: 3}


def native_kind(x: Tensor | QuantizedField) -> int | None:
    """The compiled kernels' kind of a CPU field (0 float16, 1 bfloat16, 2 int8 with per-token scales, 3 float32),
    or None where they cannot read it."""
    if x.device.type != "cpu":
        return None
    return 2 if isinstance(x, QuantizedField) else _NATIVE_KV_KINDS.get(x.dtype)


def native_values(x: Tensor | QuantizedField) -> tuple[Tensor, Tensor | None]:
    """A field as the compiled kernels read it: (contiguous values, contiguous float32 per-token scales or None)."""
    if isinstance(x, QuantizedField):
        return x.values.contiguous(), x.scale.float().contiguous()
    return x.contiguous(), None
