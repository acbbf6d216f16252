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
from aheadrank.store import native

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


BOOK_SAMPLE_TOKENS = 200_000  # tokens a shard's codebooks are fitted on (evenly spaced over the shard)
# Lloyd-Max iterations at most when fitting per-dimension codebooks (each costs O(levels·log tokens))
BOOK_ITERATIONS = 200


def fit_codebooks(sample: np.ndarray, bits: int, iterations: int = BOOK_ITERATIONS) -> np.ndarray:
    """One codebook of 2^bits levels per dimension, fitted to ``sample`` [tokens, dim] by Lloyd-Max (1-D k-means:
    least squared error), float32 [dim, 2^bits], each row ascending.

    The levels start at the sample's quantiles (k + 1/2) / 2^bits; each iteration assigns every value to its
    nearest level (the midpoints between ascending levels are the boundaries) and moves each level to the mean of
    its values (a level that gets none stays). On the sorted sample with prefix sums (float64), an iteration is a
    search of the boundaries, not a pass over the values. Deterministic: same sample, same books."""
    torch = load_torch()
    # [dim, tokens] ascending: sorted as float32 (4x faster than float64 here), summed in float64
    x = torch.as_tensor(cast(sample, np.float32)).T.contiguous().sort(dim=1).values.double()
    dim, n = x.shape
    k = 2**bits
    if n == 0:
        return np.zeros((dim, k), np.float32)
    prefix = torch.cat([torch.zeros(dim, 1, dtype=torch.float64), x.cumsum(dim=1)], dim=1)  # [dim, n + 1]
    # the sorted values at the quantiles (k + 1/2) / 2^bits
    at = ((torch.arange(k, dtype=torch.float64) + 0.5) / k * (n - 1)).round().long()
    books = x[:, at].contiguous()
    ends = torch.full((dim, 1), n, dtype=torch.int64)
    starts = torch.zeros((dim, 1), dtype=torch.int64)
    for _ in range(iterations):
        # values below a midpoint go to the lower level, those on or above it to the upper (as encode_codebooks)
        cuts = torch.searchsorted(x, ((books[:, 1:] + books[:, :-1]) / 2).contiguous(), right=True)
        lo, hi = torch.cat([starts, cuts], dim=1), torch.cat([cuts, ends], dim=1)
        counts = hi - lo
        sums = prefix.gather(1, hi) - prefix.gather(1, lo)
        moved = torch.where(counts > 0, sums / counts.clamp(min=1), books).sort(dim=1).values
        if torch.equal(moved, books):
            break
        books = moved
    return books.float().numpy()


def encode_codebooks(x: np.ndarray, books: np.ndarray) -> np.ndarray:
    """``x`` [tokens, dim] -> uint8 codes [tokens, dim]: per dimension the index of the nearest level of ``books``
    [dim, levels] (a value on a midpoint goes to the upper level)."""
    torch = load_torch()
    b = torch.as_tensor(books, dtype=torch.float32)
    bounds = ((b[:, 1:] + b[:, :-1]) / 2).contiguous()
    t = torch.as_tensor(cast(x, np.float32)).T.contiguous()
    return torch.searchsorted(bounds, t, right=True).T.to(torch.uint8).numpy()


def decode_codebooks(codes: np.ndarray, books: np.ndarray) -> np.ndarray:
    """uint8 ``codes`` [..., dim] -> float16 values: ``books[d, codes[..., d]]`` per dimension d."""
    dim, levels = books.shape
    flat = np.asarray(books, np.float32).reshape(-1)
    index = codes.astype(np.int64) + np.arange(dim, dtype=np.int64) * levels
    return flat[index].astype(np.float16)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """uint8 codes [..., dim] (each < 2^bits; bits 1, 2, 4 or 8) -> uint8 [..., dim·bits/8]: 8/bits codes a
    byte, dimension j in bits (j·bits mod 8) upwards of byte j·bits/8."""
    per = 8 // bits
    c = np.asarray(codes, np.uint8)
    c = c.reshape(*c.shape[:-1], c.shape[-1] // per, per)
    out = np.zeros(c.shape[:-1], np.uint8)
    for i in range(per):
        out |= c[..., i] << np.uint8(i * bits)
    return out


def unpack_codes(packed: np.ndarray, bits: int) -> np.ndarray:
    """The inverse of :func:`pack_codes`: uint8 [..., width] -> codes [..., width·8/bits]."""
    per, mask = 8 // bits, np.uint8(2**bits - 1)
    p = np.asarray(packed, np.uint8)
    out = np.stack([(p >> np.uint8(i * bits)) & mask for i in range(per)], axis=-1)
    return out.reshape(*p.shape[:-1], p.shape[-1] * per)


def byte_table(books: np.ndarray, bits: int) -> np.ndarray:
    """Per packed byte position p and byte value v, the float16 values of the 8/bits dimensions it holds: [dim·bits/8,
    256, 8/bits], so that decoding is one lookup a byte (:func:`decode_packed`)."""
    dim, levels = books.shape
    per = 8 // bits
    # [256, per]: the codes each byte value holds
    v = unpack_codes(np.arange(256, dtype=np.uint8)[:, None], bits)
    b = np.asarray(books, np.float32).reshape(dim // per, per, levels)  # [P, per, levels]
    table = b[:, np.arange(per)[None, :], v]  # [P, 256, per]
    return table.astype(np.float16)


def decode_packed(packed: np.ndarray, table: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Packed codes [..., P] -> float16 [..., P·8/bits] through ``table`` [P, 256, 8/bits] (:func:`byte_table`):
    each byte's values read as one 2 (8 bits) / 4 (book4) / 8 (book2) byte word: by the compiled decode
    (``store/native.py``) when there is one, else ``torch.take`` a block at a time."""
    torch = load_torch()
    positions, _, per = table.shape
    word = {1: np.int16, 2: np.int32, 4: np.int64}[per]
    words = np.ascontiguousarray(table).view(word).reshape(positions * 256)
    p = np.ascontiguousarray(packed, np.uint8)
    if out is None:
        out = np.empty((*p.shape[:-1], positions * per), np.float16)
    flat_out = out.reshape(-1, positions * per).view(word)  # [rows, P]
    rows = p.reshape(-1, positions)
    lib = native.library()
    if lib is not None and flat_out.flags.c_contiguous:
        decode = getattr(lib, native.ENTRY_POINTS[2 * per])
        decode(rows.ctypes.data, words.ctypes.data, flat_out.ctypes.data, len(rows), positions)
        return out
    base = np.arange(positions, dtype=np.int64) * 256
    if torch is None:  # pragma: no cover - torch is a dependency of aheadrank
        np.take(words, rows.astype(np.int64) + base, out=flat_out)
        return out
    tw, tb = torch.from_numpy(words), torch.from_numpy(base)
    step = max(1, _TORCH_GRAIN // positions)
    for a in range(0, len(rows), step):
        index = torch.from_numpy(rows[a : a + step]).long() + tb
        torch.take(tw, index, out=torch.from_numpy(flat_out[a : a + step]))
    return out


def sample_rows(parts: list[np.ndarray], limit: int = BOOK_SAMPLE_TOKENS) -> np.ndarray:
    """Up to ``limit`` rows, evenly spaced over the row blocks ``parts`` (all of them when fewer), float32."""
    total = sum(len(p) for p in parts)
    if total <= limit:
        return cast(np.concatenate(parts), np.float32)
    wanted = np.linspace(0, total - 1, limit).round().astype(np.int64)
    starts = np.cumsum([0] + [len(p) for p in parts[:-1]])
    which = np.searchsorted(starts, wanted, side="right") - 1
    # the wanted rows grouped by part (ascending): one take per part
    cuts = np.flatnonzero(np.diff(which)) + 1
    groups = zip(np.split(which, cuts), np.split(wanted, cuts), strict=True)
    picked = [parts[int(w[0])][r - starts[int(w[0])]] for w, r in groups]
    return cast(np.concatenate(picked), np.float32)
