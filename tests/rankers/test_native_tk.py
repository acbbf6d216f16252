"""TK's cosines and kernel sums in one compiled pass from the stored term vectors (``rankers/tk.py``:
``aheadrank/kernels/tk.py``: stored_sums, ``native_kernels.c``: tk_stored_sums): equal to the formula for every stored dtype, declining
(None, so that the cosine GEMM and the kernel stage run) wherever it does not apply, and giving TK the scores of
that path."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from aheadrank.rankers import QuantizedField, init_ranker, tk
from conftest import needs_kernel

from aheadrank.kernels import native
from aheadrank.kernels import tk as tk_kernels

MU = tk.KERNEL_MU
KINDS = ("float16", "bfloat16", "int8", "float32")


def _stored(b: int, td: int, n: int, tq: int, kind: str, seed: int = 0):
    """(q [1, Tq, n], stored d in ``kind``, d as float64, mask [B, Td]): unit vectors; documents of every length
    from 0 (all padding) up, holes inside them; padding rows hold NaN (float kinds) or garbage, never read."""
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(1, tq, n, generator=g), dim=-1)
    d = F.normalize(torch.randn(b, td, n, generator=g), dim=-1)
    lengths = torch.arange(b) % (td + 1)
    mask = torch.arange(td)[None, :] < lengths[:, None]
    mask[:, 2::5] = False  # holes
    if kind == "int8":
        d[~mask] = 3.0
        stored = QuantizedField.quantize(d)
        exact = stored.to(torch.float64)
    else:
        d[~mask] = float("nan")
        stored = d.to(getattr(torch, kind))
        exact = stored.double()
    return q, stored, exact, mask


def _sums_formula(q: torch.Tensor, d: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ_j K [B, Tq, K] in float64 from the formula: cosines of the real terms, clamped as TK's stage clamps."""
    m = torch.einsum("tn,bjn->btj", q[0].double(), torch.nan_to_num(d) * mask[..., None])
    m = m.clamp(-tk_kernels.COSINE_RANGE, tk_kernels.COSINE_RANGE)
    mu = torch.tensor(MU, dtype=torch.float64)
    k = torch.exp(-((m[..., None] - mu) ** 2) / (2 * tk.KERNEL_SIGMA**2))
    return (k * mask[:, None, :, None]).sum(2)


@needs_kernel
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("b", "td", "n", "tq"),
    [(9, 13, 64, 5), (6, 130, 384, 16), (5, 17, 32, 17), (4, 9, 48, 33), (3, 8, 16, 64), (2, 1, 16, 1)],
)  # 1-4 vectors of query terms, blocks of 8 vectors full and partial, one-term documents
def test_stored_sums_equal_the_formula(kind, b, td, n, tq):
    """Per (document, query term, kernel) the compiled pass's Σ_j K within 1e-4 of the float64 formula over the
    stored values, relative to that kernel's largest sum (the bound native_sums is held to), NaN in the
    padding never read; an all-padding document gets the 1e-30 floor per value and nothing more."""
    q, stored, exact, mask = _stored(b, td, n, tq, kind)
    with torch.inference_mode():
        got = tk_kernels.stored_sums(q, stored, mask, MU, tk.KERNEL_SIGMA)
    assert got is not None and got.shape == (b, tq, len(MU)) and got.dtype == torch.float32
    assert torch.isfinite(got).all()
    want = _sums_formula(q, exact, mask)
    scale = want.abs().amax((0, 1)).clamp(min=1e-6)
    assert ((got.double() - want).abs() / scale).max().item() <= 1e-4
    empty = mask.sum(1) == 0
    assert empty.any() and got[empty].max().item() < 1e-20


@needs_kernel
@pytest.mark.parametrize("kind", ["float16", "int8"])
def test_stored_sums_equal_the_cosine_gemm_and_the_kernel_stage(kind):
    """The same sums as the path it replaces (the stored vectors widened, the cosine GEMM, native_sums),
    within float32 rounding."""
    q, stored, exact, mask = _stored(40, 70, 384, 16, kind, seed=3)
    widened = exact.float().nan_to_num()
    with torch.inference_mode():
        got = tk_kernels.stored_sums(q, stored, mask, MU, tk.KERNEL_SIGMA)
        want = tk_kernels.native_sums(tk.cosines(q, widened), mask, MU, tk.KERNEL_SIGMA)
    scale = want.abs().amax((0, 1)).clamp(min=1e-6)
    assert ((got - want).abs() / scale).max().item() <= 1e-5


@needs_kernel
def test_tk_scores_through_the_compiled_pass_equal_the_gemm_path(tiny_base, monkeypatch):
    """TK's kernel_score takes the compiled pass for stored float16 and int8 vectors (calls counted) and scores
    the candidates as the GEMM path does, within 1e-5 of the scores' spread."""
    r = init_ranker("tk", base=tiny_base, tk_heads=4).eval()
    n = r.config.hidden
    g = torch.Generator().manual_seed(5)
    q = F.normalize(torch.randn(1, 11, n, generator=g), dim=-1)
    d = F.normalize(torch.randn(30, 40, n, generator=g), dim=-1)
    qm = torch.ones(1, 11, dtype=torch.bool)
    qm[0, -2:] = False
    dm = torch.arange(40)[None, :] < torch.randint(1, 41, (30, 1), generator=g)
    calls = []
    real = tk_kernels.stored_sums

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(out is not None)
        return out

    for stored in (d.half(), QuantizedField.quantize(d)):
        with torch.inference_mode():
            monkeypatch.setattr(tk_kernels, "stored_sums", counted)
            fast = r.kernel_score(q, qm, stored, dm)
            monkeypatch.setattr(tk_kernels, "stored_sums", lambda *a, **k: None)
            slow = r.kernel_score(q, qm, stored, dm)
        spread = (slow.max() - slow.min()).item()
        assert spread > 0 and (fast - slow).abs().max().item() <= 1e-5 * spread
    assert calls == [True, True]


@needs_kernel
def test_outside_its_limits_the_pass_declines():
    """None (the GEMM path runs) for a query per document, a width not a multiple of 16, more than 64 query terms,
    an empty query or batch, gradients, float64 queries, or the kernels switched off."""
    q, stored, _, mask = _stored(4, 10, 32, 5, "float16")
    sums = tk_kernels.stored_sums
    with torch.inference_mode():
        assert sums(q.expand(4, -1, -1), stored, mask, MU, tk.KERNEL_SIGMA) is None
        assert sums(q[..., :24], stored[..., :24], mask, MU, tk.KERNEL_SIGMA) is None
        wide = F.normalize(torch.randn(1, native.MAX_QUERY_TERMS + 1, 32), dim=-1)
        assert sums(wide, stored, mask, MU, tk.KERNEL_SIGMA) is None
        assert sums(q[:, :0], stored, mask, MU, tk.KERNEL_SIGMA) is None
        assert sums(q, stored[:0], mask[:0], MU, tk.KERNEL_SIGMA) is None
        assert sums(q.double(), stored, mask, MU, tk.KERNEL_SIGMA) is None
    assert sums(q.clone().requires_grad_(), stored, mask, MU, tk.KERNEL_SIGMA) is None
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AHEADRANK_NATIVE", "0")
        with torch.inference_mode():
            assert sums(q, stored, mask, MU, tk.KERNEL_SIGMA) is None


@needs_kernel
@pytest.mark.parametrize(("tq", "n"), [(0, 32), (native.MAX_QUERY_TERMS + 1, 32), (4, 24)])
def test_the_c_pass_refuses_arguments_outside_its_limits(tq, n):
    """Called directly outside its limits (no query term, more than 64, a width not a multiple of 16), the C entry
    point returns -1 and writes nothing."""
    lib = native.library()
    nc = tk_kernels._native_chain(MU, tk.KERNEL_SIGMA)
    q = torch.rand(max(tq, 1), n)
    d = torch.rand(2, 3, n).half()
    keep = torch.ones(2, 3, dtype=torch.uint8)
    out = torch.full((2, len(MU), max(tq, 1)), -7.0)
    status = lib.tk_stored_sums(
        q.data_ptr(), d.data_ptr(), None, 0, keep.data_ptr(), 2, 3, n, tq,
        *tk_kernels._chain_args(nc, len(MU)), out.data_ptr(), 1,
    )  # fmt: skip
    assert status == -1
    assert (out == -7.0).all()


@needs_kernel
def test_thread_count_changes_nothing_but_the_speed():
    q, stored, _, mask = _stored(37, 50, 64, 7, "float16", seed=9)
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            torch.set_num_threads(1)
            one = tk_kernels.stored_sums(q, stored, mask, MU, tk.KERNEL_SIGMA)
            torch.set_num_threads(3)
            three = tk_kernels.stored_sums(q, stored, mask, MU, tk.KERNEL_SIGMA)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, three)
