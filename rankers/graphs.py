"""A ranker's query side replayed from CUDA graphs: one graph per query shape, captured on first use.

On a GPU the query side of the split rankers is launch-bound: 5-6 layers over at most 18 tokens are ~140 kernel
launches and ~1,000 ATen calls, 1.2-5 ms of CPU time for microseconds of GPU work (README, "The online paths and
the tests on one H100"). Queries come in few shapes (``[1, T]``, T <= max_query_len + 2), so ``query_state`` is
captured once per shape and replayed: one launch. The graph reads the ranker's parameters where they live, so an
in-place update is seen; a parameter replaced (a move, ``load_state_dict`` with ``assign``) drops every graph.

Used only where it can be: a CUDA ranker in eval mode, gradients off. Elsewhere — and for a shape whose capture
failed (logged once, e.g. an op that synchronises with the host) — ``query_state`` runs as usual. Same values
as ``query_state`` (the same kernels, replayed; ``tests/rankers/test_graphs.py``).
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

log = logging.getLogger("aheadrank.rankers")

WARMUP_RUNS = (
    3  # before a capture, on a side stream (lazy initialisation of cuBLAS and friends stays out of it)
)


class QueryGraphs:
    """``ranker.query_state(ids, mask)`` from a CUDA graph per ``ids.shape`` (at most ``max_graphs``)."""

    def __init__(self, ranker, max_graphs: int = 64):
        self.ranker = ranker
        self.max_graphs = max_graphs
        self.graphs: dict[tuple, tuple | None] = {}  # shape -> (graph, static ids, static mask, static state)
        self._params: tuple = ()
        self.replays = 0

    def applies(self, ids: Tensor) -> bool:
        r = self.ranker
        return ids.is_cuda and not r.training and not torch.is_grad_enabled()

    def __call__(self, ids: Tensor, mask: Tensor):
        if not self.applies(ids):
            return self.ranker.query_state(ids, mask)
        params = tuple(p.data_ptr() for p in self.ranker.parameters())
        if (
            params != self._params
        ):  # a parameter replaced: the graphs read memory that is no longer the model's
            self.graphs.clear()
            self._params = params
        key = (tuple(ids.shape), tuple(mask.shape), ids.device)
        if key not in self.graphs:
            self.graphs[key] = self._capture(ids, mask) if len(self.graphs) < self.max_graphs else None
        entry = self.graphs[key]
        if entry is None:
            return self.ranker.query_state(ids, mask)
        graph, static_ids, static_mask, state = entry
        static_ids.copy_(ids)
        static_mask.copy_(mask)
        graph.replay()
        self.replays += 1
        # the outputs live in the graph's memory, which the next replay overwrites: the caller gets copies
        return type(state)({k: v.clone() for k, v in state.tensors.items()}, mask)

    def capture_all(self, lengths, device=None) -> int:
        """Capture the graphs of single queries of these token counts ahead of time (a service's warm-up);
        returns how many graphs exist."""
        device = device or self.ranker.device
        with torch.inference_mode():  # as encode_query runs (graphs are used with gradients off only)
            for t in lengths:
                ids = torch.full((1, t), self.ranker.text.pad if self.ranker.text else 0, device=device)
                self(ids, torch.ones(1, t, dtype=torch.bool, device=device))
        return sum(v is not None for v in self.graphs.values())

    def _capture(self, ids: Tensor, mask: Tensor) -> tuple | None:
        static_ids, static_mask = ids.clone(), mask.clone()
        try:
            side = torch.cuda.Stream(ids.device)
            side.wait_stream(torch.cuda.current_stream(ids.device))
            with torch.cuda.stream(side):
                for _ in range(WARMUP_RUNS):
                    self.ranker.query_state(static_ids, static_mask)
            torch.cuda.current_stream(ids.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                state = self.ranker.query_state(static_ids, static_mask)
            torch.cuda.synchronize(ids.device)
        except Exception as exc:  # an op that cannot be captured: this shape runs as usual from now on
            log.warning(
                "query side of %s not captured for shape %s (runs uncaptured): %s",
                self.ranker.kind,
                tuple(ids.shape),
                exc,
            )
            torch.cuda.synchronize(ids.device)
            return None
        return graph, static_ids, static_mask, state
