"""The codebook stores' decode compiled for this CPU (``native_decode.c``, built by :mod:`aheadrank.cbuild` on first
use, ``-O3 -march=native``, one thread): a table word per packed byte, 0.49 ns a packed byte against
``torch.take``'s 1.4-1.8 (scratch timing on the Xeon of ``bench/results``). Optional like the rankers' kernels: with
``AHEADRANK_NATIVE=0``, without a compiler, or when the build fails (logged once), :func:`library` returns None and
``store.quant.decode_packed`` runs torch."""

from __future__ import annotations

import ctypes
import threading
from functools import lru_cache
from pathlib import Path

from aheadrank import cbuild

SOURCE = Path(__file__).with_name("native_decode.c")
FLAGS = ("-O3", "-march=native", "-fPIC")
LINK_FLAGS = ("-shared",)
_P, _I = ctypes.c_void_p, ctypes.c_int64
# by the bytes of a table word: 2 (8 bits a value), 4 (book4), 8 (book2)
ENTRY_POINTS = {2: "decode_bytes16", 4: "decode_bytes32", 8: "decode_bytes64"}
_lock = threading.Lock()


def _build_and_load(cc: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(cbuild.build_with(cc, FLAGS, LINK_FLAGS, SOURCE, "store")))
    for name in ENTRY_POINTS.values():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [_P, _P, _P, _I, _I], ctypes.c_int
    return lib


@lru_cache(maxsize=1)
def _load() -> ctypes.CDLL | None:
    return cbuild.load_or_none(_build_and_load, "the store's compiled codebook decode", "torch runs instead")


def library() -> ctypes.CDLL | None:
    """The compiled decode, or None (switched off, no compiler, or a failed build: logged once)."""
    if not cbuild.enabled():
        return None
    with _lock:
        return _load()
