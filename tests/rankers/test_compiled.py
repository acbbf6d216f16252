"""The compiled path (``aheadrank/kernels/compiled.py``): a ranker's query side and scoring through torch.compile,
compiled while warming up at load, score as the reference path does, and never call a hand-written kernel."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from aheadrank.rankers import init_ranker

from aheadrank.kernels import native
from aheadrank.kernels.compiled import compile_ranker


def test_compiled_scoring_equals_the_reference_and_runs_no_native_kernel(tiny_base, monkeypatch):
    """TK (the cheapest to compile) on stored float16 vectors: the compiled query side and score_batch, compiled
    by the warm-up, give the reference's scores within 1e-5 of their spread, with no call into the C library
    (its families on, so a kernel would be taken were the graph not PyTorch's code)."""
    r = init_ranker("tk", base=tiny_base, tk_heads=4).eval()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1000, 2000, (1, 9), generator=g)
    q_mask = torch.ones_like(ids, dtype=torch.bool)
    d = F.normalize(torch.randn(12, 20, r.config.hidden, generator=g), dim=-1).half()
    d_mask = torch.arange(20)[None, :] < torch.randint(1, 21, (12, 1), generator=g)
    monkeypatch.setenv(native.ENVIRONMENT, "none")
    with torch.inference_mode():
        want = r.score_batch(r.query_state(ids, q_mask), {"doc": d}, d_mask)

    def score():
        return r.score_batch(r.query_state(ids, q_mask), {"doc": d}, d_mask)

    seconds = compile_ranker(r, warm=[score])
    assert seconds > 0 and r.compiled
    monkeypatch.setenv(native.ENVIRONMENT, "all")
    monkeypatch.setattr(native, "_load", lambda: pytest.fail("the compiled path called the C library"))
    with torch.inference_mode():
        got = score()
    spread = (want.max() - want.min()).item()
    assert spread > 0 and (got - want).abs().max().item() <= 1e-5 * spread
    with pytest.raises(ValueError, match="compiled already"):
        compile_ranker(r)
