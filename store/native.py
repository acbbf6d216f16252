"""The codebook stores' decode compiled for this CPU (``native_decode.c``, built by :mod:`aheadrank.cbuild` on first
use, ``-O3 -march=native``, one thread): a table word per packed byte, 0.49 ns a packed byte against
``torch.take``'s 1.4-1.8 (scratch timing on the Xeon of ``bench/results``). Optional like the rankers' kernels: with
``AHEADRANK_NATIVE=0``, without a compiler, or when the build fails (logged once), :func:`library` returns None and
``store.quant.decode_packed`` runs torch."""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
from functools import lru_cache
from pathlib import Path

from aheadrank import cbuild

log = logging.getLogger("aheadrank.native")

SOURCE = Path(__file__).with_name("native_decode.c")
FLAGS = ("-O3", "-march=native", "-fPIC")
LINK_FLAGS = ("-shared",)
_P, _I = ctypes.c_void_p, ctypes.c_int64
# by the bytes of a table word: 2 (8 bits a value), 4 (book4), 8 (book2)
ENTRY_POINTS = {2: "decode_bytes16", 4: "decode_bytes32", 8: "decode_bytes64"}
_lock = threading.Lock()


@lru_cache(maxsize=1)
def _load() -> ctypes.CDLL | None:
    cc = cbuild.compiler()
    if cc is None:
        log.warning("no C compiler found ($CC, cc, gcc): the store's codebook decode runs torch")
        return None
    try:
        lib = ctypes.CDLL(str(cbuild.build_with(cc, FLAGS, LINK_FLAGS, SOURCE, "store")))
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("the store's compiled decode is unavailable, torch runs instead: %s", e)
        return None
    for name in ENTRY_POINTS.values():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = [_P, _P, _P, _I, _I], ctypes.c_int
    return lib


def library() -> ctypes.CDLL | None:
    """The compiled decode, or None (switched off, no compiler, or a failed build: logged once)."""
    if not cbuild.enabled():
        return None
    with _lock:
        return _load()
