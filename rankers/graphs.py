"""Query-side work replayed from CUDA graphs: one graph per input shape, captured on first use.

On a GPU the query side of the split rankers is launch-bound: 5-6 layers over at most 18 tokens are ~140 kernel
launches and ~1,000 ATen calls, 1.2-5 ms of CPU time for microseconds of GPU work (docs/performance.md, "The online
path on a GPU"); the dense prior's query embedding (the base's 6 layers) is the same story. Queries come
in few shapes (``[1, T]``), so the work is captured once per shape and replayed: one launch.

:class:`ShapeGraphs` graphs any ``fn(ids, mask)`` of a module: :class:`QueryGraphs` a ranker's ``query_state``
(``Ranker.use_cuda_graphs``), ``DenseEncoder.use_cuda_graphs`` its ``embed`` for one query. A graph reads the
module's parameters where they live, so an in-place update is seen; a parameter replaced (a move,
``load_state_dict`` with ``assign``) drops every graph. Used only where it can be: CUDA inputs, the module in eval
mode, gradients off. Elsewhere — and for a shape whose capture failed (logged, e.g. an op that synchronises with
the host) — ``fn`` runs as usual. Same values as ``fn`` (the same kernels, replayed; ``tests/rankers/test_graphs.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

log = logging.getLogger("aheadrank.rankers")

# runs before a capture, on a side stream: lazy initialisation (cuBLAS handles and workspaces) stays out of it
WARMUP_RUNS = 3


def query_lengths(max_query_len: int) -> range:
    """Every token count a query can have: its pieces (at most ``max_query_len``) with [CLS] and [SEP] — the shapes a
    service captures at warm-up, so that no request pays for a capture."""
    return range(1, max_query_len + 3)


def _copy(out: Any, mask: Tensor) -> Any:
    """The caller's copy of a graph's outputs (the next replay overwrites the graph's own memory)."""
    if isinstance(out, Tensor):
        return out.clone()
    # a QueryState, with the caller's mask
    return type(out)({k: v.clone() for k, v in out.tensors.items()}, mask)


def _dropped() -> None:
    return None


class ShapeGraphs:
    """``fn(ids, mask)`` of ``module`` from a CUDA graph per input shape (at most ``max_graphs``; more shapes run
    uncaptured). ``fn`` returns a tensor or a ``QueryState``. A copy or a pickle of the module
    carries no graphs (they belong to this module's memory): its attribute becomes None."""

    def __reduce__(self):
        return _dropped, ()

    def __init__(self, module: nn.Module, fn: Callable[[Tensor, Tensor], Any], max_graphs: int = 64):
        self.module = module
        self.fn = fn
        self.max_graphs = max_graphs
        # shape -> (graph, static ids, static mask, static output), or None: runs uncaptured
        self.graphs: dict[tuple, tuple | None] = {}
        self._params: tuple = ()
        self.replays = 0

    def applies(self, ids: Tensor) -> bool:
        return ids.is_cuda and not self.module.training and not torch.is_grad_enabled()

    def __call__(self, ids: Tensor, mask: Tensor) -> Any:
        if not self.applies(ids):
            return self.fn(ids, mask)
        params = tuple(p.data_ptr() for p in self.module.parameters())
        # a parameter replaced: the graphs read memory that is no longer the model's
        if params != self._params:
            self.graphs.clear()
            self._params = params
        key = (tuple(ids.shape), tuple(mask.shape), ids.device)
        if key not in self.graphs:
            self.graphs[key] = self._capture(ids, mask) if len(self.graphs) < self.max_graphs else None
        entry = self.graphs[key]
        if entry is None:
            return self.fn(ids, mask)
        graph, static_ids, static_mask, out = entry
        static_ids.copy_(ids)
        static_mask.copy_(mask)
        graph.replay()
        self.replays += 1
        return _copy(out, mask)

    def capture_all(self, lengths: Iterable[int], pad_id: int = 0) -> int:
        """Capture the graphs of single inputs of these token counts ahead of time (a service's warm-up);
        returns how many graphs exist."""
        device = next(self.module.parameters()).device
        with torch.inference_mode():  # as the callers run (graphs are used with gradients off only)
            for t in lengths:
                self(
                    torch.full((1, t), pad_id, device=device),
                    torch.ones(1, t, dtype=torch.bool, device=device),
                )
        return sum(v is not None for v in self.graphs.values())

    def _capture(self, ids: Tensor, mask: Tensor) -> tuple | None:
        static_ids, static_mask = ids.clone(), mask.clone()
        try:
            side = torch.cuda.Stream(ids.device)
            side.wait_stream(torch.cuda.current_stream(ids.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    self.fn(static_ids, static_mask)
            torch.cuda.current_stream(ids.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.fn(static_ids, static_mask)
            torch.cuda.synchronize(ids.device)
        except Exception as exc:  # an op that cannot be captured: this shape runs as usual from now on
            log.warning(
                "%s not captured for shape %s (runs uncaptured): %s",
                getattr(self.fn, "__qualname__", self.fn),
                tuple(ids.shape),
                exc,
            )
            torch.cuda.synchronize(ids.device)
            return None
        return graph, static_ids, static_mask, out


class QueryGraphs(ShapeGraphs):
    """A ranker's ``query_state(ids, mask)`` from a CUDA graph per query shape."""

    def __init__(self, ranker, max_graphs: int = 64):
        super().__init__(ranker, ranker.query_state, max_graphs)
        self.ranker = ranker

    def capture_all(self, lengths: Iterable[int], pad_id: int | None = None) -> int:
        text = self.ranker.text
        return super().capture_all(lengths, pad_id if pad_id is not None else (text.pad if text else 0))
