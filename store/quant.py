"""Value conversions: float16 casts, and int8 with one float32 scale per token (absmax / 127).

numpy's float16 casts are scalar code (~5-9 ns a value on x86); torch's are vectorised (~1-2 ns), so the
casts and the int8 dequantization go through torch when it is installed (it is a dependency of
aheadrank), in blocks below torch's parallel grain size (32,768 values): they stay on the calling
thread, with no OpenMP hand-off per block (costly on a busy machine) and no oversubscription when
several threads fetch at once. Without torch, numpy does the same work.
"""

from __future__ import annotations

from typing import Any

import numpy as np

INT8_MAX = 127
_TORCH_GRAIN = 32_000  # values per torch call: below at::internal::GRAIN_SIZE, so single-threaded
_NUMPY_BLOCK = 2048 * 384  # values per float32 scratch block in the numpy fallback (~3 MB)


def load_torch() -> Any:
    """The torch module, or None."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of aheadrank
        return None
    return torch


def cast(x: Any, dtype: type | np.dtype) -> np.ndarray:
    """``x`` as a C-contiguous array of ``dtype`` (no copy when it already is one)."""
    x = np.asarray(x)
    dtype = np.dtype(dtype)
    if x.dtype == dtype or x.size == 0:
        return np.ascontiguousarray(x, dtype=dtype)
    torch = load_torch()
    floats = (np.float16, np.float32, np.float64)
    if torch is None or x.dtype not in floats or dtype not in floats:
        with np.errstate(over="ignore"):
            return np.ascontiguousarray(x, dtype=dtype)
    src = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(x.shape, dtype=dtype)
    flat = torch.from_numpy(out.reshape(-1))
    source = torch.from_numpy(src)
    for a in range(0, src.size, _TORCH_GRAIN):
        flat[a : a + _TORCH_GRAIN].copy_(source[a : a + _TORCH_GRAIN])
    return out


def all_finite_float16(x: np.ndarray) -> bool:
    """No NaN or inf in a float16 array (exponent bits all ones), without numpy's slow float16 math."""
    bits = np.ascontiguousarray(x).view(np.uint16)
    return not np.any((bits & 0x7C00) == 0x7C00)


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` [tokens, dim] -> (int8 [tokens, dim], float32 scale [tokens]); ``|x - q*scale| <= scale/2``."""
    x32 = cast(x, np.float32)
    if x32.shape[1] == 0:
        return np.zeros(x32.shape, np.int8), np.zeros(len(x32), np.float32)
    absmax = np.maximum(x32.max(axis=1), -x32.min(axis=1))
    scale = absmax / np.float32(INT8_MAX)
    safe = np.where(scale > 0, scale, np.float32(1))
    q = x32 / safe[:, None]
    np.rint(q, out=q)
    np.clip(q, -INT8_MAX, INT8_MAX, out=q)
    return q.astype(np.int8), scale.astype(np.float32)


def dequantize_int8(q: np.ndarray, scale: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``q`` [..., dim] int8 times ``scale`` [...] -> float16, computed in float32 a block at a time."""
    if out is None:
        out = np.empty(q.shape, dtype=np.float16)
    dim = q.shape[-1] if q.ndim else 1
    q2, s1, o2 = q.reshape(-1, dim), scale.reshape(-1), out.reshape(-1, dim)
    torch = load_torch()
    if torch is not None and len(q2):
        rows = max(1, _TORCH_GRAIN // max(dim, 1))
        tq, ts, to = torch.from_numpy(q2), torch.from_numpy(s1), torch.from_numpy(o2)
        for a in range(0, len(q2), rows):
            torch.mul(tq[a : a + rows], ts[a : a + rows, None], out=to[a : a + rows])
        return out
    rows = max(1, _NUMPY_BLOCK // max(dim, 1))
    tmp = np.empty((min(rows, len(q2)), dim), dtype=np.float32)
    for a in range(0, len(q2), rows):
        b = min(a + rows, len(q2))
        part = tmp[: b - a]
        np.multiply(q2[a:b], s1[a:b, None], out=part)
        o2[a:b] = part
    return out
