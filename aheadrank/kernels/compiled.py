"""The compiled path: a ranker's query side and scoring (``query_state``, ``score_batch``: what the service, the
``rerank-run`` loop and the public ``score`` call) through ``torch.compile`` with Inductor's CPU backend, which
generates vectorised C++ for the element-wise and reduction work and, with ``freezing``, treats the weights as
constants and packs them for oneDNN. The hand-written kernels are off while it traces (``aheadrank/kernels/native.py``
answers None) and the rankers' own oneDNN packing steps aside (``blocks._onednn_inference``), so the graph is the
reference PyTorch code.

Compiling is slow (minutes per ranker on two cores: ``bench/speed.py --paths``) and happens on the first call
of each new shape; :func:`compile_ranker` therefore warms the given shapes up at load, never on a request.
With ``dynamic=True`` one graph serves every batch size and document length; with False each shape compiles
its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any

import torch

COMPILE_OPTIONS = {"freezing": True}  # Inductor: weights as constants, packed once for oneDNN


def compile_ranker(ranker: Any, dynamic: bool = True, warm: Iterable[Callable[[], object]] = ()) -> float:
    """Route ``ranker.query_state`` and ``ranker.score_batch`` through ``torch.compile`` (instance attributes:
    every caller of the two methods takes the compiled path), then run each ``warm`` call (inference mode) so
    the shapes they use are compiled now. Returns the seconds the warm-up took (the compile time)."""
    if getattr(ranker, "compiled", False):
        raise ValueError("the ranker's scoring is compiled already")
    ranker.eval()
    cls = type(ranker)
    ranker.query_state = torch.compile(
        cls.query_state.__get__(ranker), dynamic=dynamic, options=COMPILE_OPTIONS
    )
    ranker.score_batch = torch.compile(
        cls.score_batch.__get__(ranker), dynamic=dynamic, options=COMPILE_OPTIONS
    )
    ranker.compiled = True
    t0 = time.perf_counter()
    with torch.inference_mode():
        for call in warm:
            call()
    return time.perf_counter() - t0
