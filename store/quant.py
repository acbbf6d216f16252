"""int8 values with one float32 scale per token (absmax / 127), dequantized to float16 on fetch."""

from __future__ import annotations

import numpy as np

INT8_MAX = 127
_BLOCK_VALUES = 2048 * 384  # float32 scratch of ~3 MB


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``x`` [tokens, dim] -> (int8 [tokens, dim], float32 scale [tokens]); ``|x - q*scale| <= scale/2``."""
    x32 = np.asarray(x, dtype=np.float32)
    scale = np.abs(x32).max(axis=1) / np.float32(INT8_MAX) if x32.shape[1] else np.zeros(len(x32), np.float32)
    safe = np.where(scale > 0, scale, np.float32(1))
    q = np.rint(x32 / safe[:, None])
    np.clip(q, -INT8_MAX, INT8_MAX, out=q)
    return q.astype(np.int8), scale.astype(np.float32)


def dequantize_int8(q: np.ndarray, scale: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``q`` [..., dim] int8 times ``scale`` [...] -> float16, computed in float32 in cache-sized blocks.

    (numpy's float16 arithmetic and one-shot casts are slow; 2,048-row float32 blocks are ~2.5x faster.)
    """
    if out is None:
        out = np.empty(q.shape, dtype=np.float16)
    dim = q.shape[-1] if q.ndim else 1
    q2, s1, o2 = q.reshape(-1, dim), scale.reshape(-1), out.reshape(-1, dim)
    block = max(1, _BLOCK_VALUES // max(dim, 1))
    tmp = np.empty((min(block, len(q2)), dim), dtype=np.float32)
    for a in range(0, len(q2), block):
        b = min(a + block, len(q2))
        part = tmp[: b - a]
        np.multiply(q2[a:b], s1[a:b, None], out=part)
        o2[a:b] = part
    return out
