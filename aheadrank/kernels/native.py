"""The hand-written C kernels for stages PyTorch runs as many small passes, compiled on first use: TK's kernel stage
(alone, or with the cosines, from the stored term vectors: :mod:`aheadrank.kernels.tk`), the attention of a few
query rows (:mod:`aheadrank.kernels.attention`: MORES' interaction blocks, PreTTR's [CLS], the query encoders), and
whole BERT layers over a few rows (:mod:`aheadrank.kernels.layer`: the query encoders).
Each is one family of :data:`FAMILIES`, switched on and off by ``AHEADRANK_NATIVE``; the kernels that did not pay
at the service level are gone (``docs/performance.md``, "Kernels"). The rankers call the interfaces
(:mod:`aheadrank.kernels.attention`, :mod:`aheadrank.kernels.layer`, :mod:`aheadrank.kernels.tk`), which run a
kernel where it applies and their PyTorch reference elsewhere.

The C source (``native_kernels.c``, shipped with the package) is compiled with the machine's C compiler
(``$CC``, else ``cc``/``gcc``) for this CPU (``-O3 -march=native -ffast-math -fopenmp``: GCC vectorises
``expf`` through glibc's libmvec), then linked without ``-ffast-math``, so that loading it leaves the process's
floating-point mode alone (the build and its cache: :mod:`aheadrank.cbuild`, shared with the store's decoder). It is
loaded with :mod:`ctypes` (a call releases the GIL). A kernel splits its documents over
``torch.get_num_threads()`` OpenMP threads, and those are PyTorch's own: the library needs ``libgomp.so.1``,
which the dynamic loader resolves to the copy PyTorch has already loaded (same soname), so the threads that
have just run PyTorch's last op take the work. Threads of our own (the first version: a Python thread pool)
ran beside PyTorch's OpenMP workers, which spin for a while after each op: on 2 cores that halved the kernel's
speed in the whole path (MORES 1×IB S2: 12.7 ms of cross-attention in the path against 6.6).

Nothing depends on it: with ``AHEADRANK_NATIVE=0`` (or a family left out: :data:`FAMILIES`), without a compiler, or when compiling fails (logged once),
:func:`library` returns None and the interfaces run their PyTorch reference. Results agree with it within
float32 rounding (``tests/rankers/test_native*.py``).
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

from aheadrank import cbuild

log = logging.getLogger("aheadrank.native")

SOURCE = Path(__file__).with_name("native_kernels.c")
FLAGS = ("-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC")
# Linked in a second step without -ffast-math: GCC (before 13) links crtfastmath.o into a -ffast-math shared
# library, whose constructor turns on flush-to-zero / denormals-are-zero for the whole process when it loads
LINK_FLAGS = ("-shared", "-fopenmp")
# A compiler without OpenMP (no libgomp to link): the same kernels on one thread each (the pragmas ignored)
SERIAL = (
    tuple(f if f != "-fopenmp" else "-fopenmp-simd" for f in FLAGS),
    tuple(f for f in LINK_FLAGS if f != "-fopenmp"),
)
MAX_QUERY_TERMS = 64  # the kernels' per-row scratch (native_kernels.c: MAXQ, MAXK, MAXR)
MAX_KERNELS = 32
MAX_RATIOS = 4

_P, _I, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
_CHAIN = [  # the chain's arguments, in native_kernels.c's order
    _I, _I, _F, _F, _F,  # K, anchor, mu_a, c, mlim
    _I, _P, _P, _P,  # R, rdelta, rop, rsrc
    _I, _P, _P, _P, _P, _P,  # S, kern, prev, ridx, lo, gain
]  # fmt: skip
_SIGNATURES = {
    "tk_kernel_sums": [_P, _P, _I, _I, _I, *_CHAIN, _P, _I],  # ..., out, threads
    # q, d, d scales, kind, mask, B, Td, n, Tq, chain..., out, threads
    "tk_stored_sums": [_P, _P, _P, _I, _P, _I, _I, _I, _I, *_CHAIN, _P, _I],
    # q, Bq, k, v, k scales, v scales, kind, mask, B, T, H, dh, Tq, out, lse, extra values, their coefficients,
    # the quadratic form giving them, threads
    "cross_attention": [
        _P,
        _I,
        _P,
        _P,
        _P,
        _P,
        _I,
        _P,
        _I,
        _I,
        _I,
        _I,
        _I,
        _P,
        _P,
        _P,
        _P,
        _P,
        _I,
    ],  # fmt: skip
    # x, B, T, n, mask, heads, then packed panels and bias of Q, K, V, O, LayerNorm 1 (weight, bias, eps),
    # W1, b1, inner width, W2, b2, LayerNorm 2 (weight, bias, eps), out, threads
    "encoder_layer": [_P, _I, _I, _I, _P, _I, *[_P] * 10, _F, _P, _P, _I, _P, _P, _P, _P, _F, _P, _I],
    # x, B, T, n, mask, layers, their weights' addresses [L, 16] (encoder_layer's order), [heads, inner] [L, 2],
    # LayerNorm eps [L, 2], out, alternate output, threads
    "encoder_stack": [_P, _I, _I, _I, _P, _I, _P, _P, _P, _P, _P, _I],
}
ENCODER_LAYER_MAX_TOKENS = 512  # native_kernels.c: EL_MAXT
ENCODER_STACK_MAX_LAYERS = 64  # native_kernels.c: encoder_stack
ATTENTION_MAX_ROWS = 32  # native_kernels.c: ATT_ROWS, ATT_MAXT, ATT_MAXDH
ATTENTION_MAX_KEYS = 4096
ATTENTION_MAX_HEAD_DIM = 512
SKINNY_PANEL = (
    32  # native_kernels.c: SK_NR, the output columns of one packed panel of encoder_layer's linears
)


def attention_head_dim(dh: int) -> bool:
    """Whether the compiled attention takes heads dh wide: a multiple of 16 up to 512 (32 and multiples of 64 run
    its widest blocks)."""
    return dh % 16 == 0 and 0 < dh <= ATTENTION_MAX_HEAD_DIM


_lock = threading.Lock()


# AHEADRANK_NATIVE (read at every call, in this one place): which kernel families run compiled. ``all`` (also 1, true,
# yes, on, or unset) every family, ``none`` (0, false, no, off) none, else a comma list of families (``attention,tk``)
# or of families left out of all (``-layer``); an unknown name is an error, never a silent fallback
ENVIRONMENT = cbuild.ENVIRONMENT
FAMILIES = (
    "attention",  # cross_attention: kernels/attention.py (MORES, PreTTR's [CLS], the query encoders)
    "layer",  # encoder_layer, encoder_stack: whole BERT layers over a few rows (kernels/layer.py)
    "tk",  # tk_kernel_sums, tk_stored_sums: TK's kernel stage (kernels/tk.py)
)
_ALL = ("", "1", "true", "yes", "on", "all")
_NONE = ("0", "false", "no", "off", "none")


@lru_cache(maxsize=32)
def parse_families(value: str) -> frozenset[str]:
    """The kernel families an ``AHEADRANK_NATIVE`` value turns on (ValueError for a name not in FAMILIES)."""
    v = value.strip().lower()
    if v in _ALL:
        return frozenset(FAMILIES)
    if v in _NONE:
        return frozenset()
    names = [part.strip() for part in v.split(",") if part.strip()]
    left_out = [name[1:] for name in names if name.startswith("-")]
    if left_out and len(left_out) != len(names):
        raise ValueError(
            f"{ENVIRONMENT}={value!r}: either families to run or families to leave out (-name), not both"
        )
    unknown = sorted(set(left_out or names) - set(FAMILIES))
    if unknown:
        raise ValueError(
            f"{ENVIRONMENT}={value!r}: unknown kernel family {', '.join(unknown)}; give all, none, or a comma list "
            f"of {', '.join(FAMILIES)} (each prefixed with - to leave it out of all)"
        )
    return frozenset(FAMILIES) - set(left_out) if left_out else frozenset(names)


def spelled(on: frozenset[str]) -> str:
    """The one spelling of a set of families: ``all``, ``none``, or a comma list in FAMILIES' order."""
    if on == frozenset(FAMILIES):
        return "all"
    return ",".join(f for f in FAMILIES if f in on) or "none"


def families() -> frozenset[str]:
    """The kernel families switched on now (``AHEADRANK_NATIVE``)."""
    return parse_families(os.environ.get(ENVIRONMENT, "all"))


def enabled(family: str | None = None) -> bool:
    """Whether ``family`` (any family, when None) is switched on."""
    if family is not None and family not in FAMILIES:
        raise ValueError(f"unknown kernel family {family!r} (one of {', '.join(FAMILIES)})")
    on = families()
    return bool(on) if family is None else family in on


_compiler = cbuild.compiler
cache_dir = cbuild.cache_dir


def _build(cc: str, source: Path = SOURCE) -> Path:
    """The compiled library (from the cache when built before): with OpenMP, else serial (logged)."""
    try:
        return _build_with(cc, FLAGS, LINK_FLAGS, source)
    except RuntimeError as with_openmp:
        try:
            serial = _build_with(cc, *SERIAL, source)
        except RuntimeError:
            raise with_openmp from None  # not OpenMP's fault: the caller logs the first error, once
        log.warning("native kernels built without OpenMP (one thread each): %s", with_openmp)
        return serial


def _build_with(cc: str, flags: tuple[str, ...], link_flags: tuple[str, ...], source: Path = SOURCE) -> Path:
    return cbuild.build_with(cc, flags, link_flags, source, "kernels")


def load_source(source: Path, require_all: bool = True) -> ctypes.CDLL:
    """Compile (or take from the cache) and load the kernels of one C source, their argument types set. With
    ``require_all`` False, entry points the source lacks are left out (another revision's source, for
    ``bench/online_kernels.py --parts source``). Raises RuntimeError, OSError or SubprocessError where that fails."""
    cc = _compiler()
    if cc is None:
        raise RuntimeError("no C compiler found ($CC, cc, gcc)")
    lib = ctypes.CDLL(str(_build(cc, source)))
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name) if require_all else getattr(lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = args, ctypes.c_int
    return lib


@lru_cache(maxsize=1)
def _load() -> ctypes.CDLL | None:
    return cbuild.load_or_none(
        lambda cc: load_source(SOURCE), "native kernels", "PyTorch's code runs instead"
    )


def library(family: str | None = None) -> ctypes.CDLL | None:
    """The compiled kernels, or None (``family``, or every family when None, switched off; no compiler, or a
    failed build: logged once). None while torch.compile traces: the compiled path is PyTorch's code throughout."""
    if torch.compiler.is_compiling() or not enabled(family):
        return None
    with _lock:
        return _load()


def ptr(x: Tensor) -> int:
    if not x.is_contiguous():
        raise ValueError("native kernels take contiguous tensors")
    return x.data_ptr()
