"""The compiled [CLS]-row sums (``native_kernels.c``: one_row_sums; ``blocks.one_row_native``): per document and
head ``softmax(u·xᵀ)·x`` over the real tokens equal to the float64 computation within float32 rounding, for
shared and per-document rows, strided rows, padding and uneven head and token counts; the same bits for any thread
count; declining where it does not apply; and ``Attention.one_row_context`` (what bert's, PreTTR's and MORES'
[CLS]-only layers run) equal with and without it."""

from __future__ import annotations

import pytest
import torch
from aheadrank.rankers import blocks, init_ranker
from conftest import needs_kernel


def _ref(u: torch.Tensor, x: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    scores = u.double() @ x.double().transpose(1, 2)  # [B, H, T]
    scores = scores.masked_fill(~real[:, None, :], float("-inf"))
    return torch.bmm(scores.softmax(-1), x.double())


@needs_kernel
@pytest.mark.parametrize(
    ("b", "h", "t", "n"), [(7, 12, 18, 384), (3, 5, 33, 64), (2, 1, 1, 16), (4, 4, 4, 48)]
)
@pytest.mark.parametrize("shared", [False, True])  # per-document rows, or one set for every document
@pytest.mark.parametrize("padded", [False, True])
def test_equals_the_float64_sums(b, h, t, n, shared, padded):
    g = torch.Generator().manual_seed(b * 100 + t)
    x = torch.randn(b, t, n, generator=g)
    # the folded rows' layout: [H, Bq, n] in memory, seen as [Bq, H, n]
    u = (torch.randn(h, 1 if shared else b, n, generator=g) / n**0.5).transpose(0, 1)
    real = torch.ones(b, t, dtype=torch.bool)
    if padded:
        real[-1, (t + 1) // 2 :] = False  # the last document ends early; its first token stays real
    with torch.no_grad():
        got = blocks.one_row_native(u, x, blocks.key_mask(real))
        assert got is not None and got.shape == (b, h, n)
        want = _ref(u.expand(b, h, n), x, real)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
        assert torch.equal(blocks.one_row_native(u.contiguous(), x, blocks.key_mask(real)), got)
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            one = blocks.one_row_native(u, x, blocks.key_mask(real))
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(one, got)


@needs_kernel
def test_a_document_without_real_tokens_gets_zeros_and_the_others_are_unaffected():
    g = torch.Generator().manual_seed(5)
    x, u = torch.randn(3, 6, 32, generator=g), torch.randn(3, 2, 32, generator=g)
    real = torch.ones(3, 6, dtype=torch.bool)
    real[1] = False
    with torch.no_grad():
        got = blocks.one_row_native(u, x, blocks.key_mask(real))
    assert torch.equal(got[1], torch.zeros(2, 32))
    torch.testing.assert_close(
        got[[0, 2]].double(), _ref(u[[0, 2]], x[[0, 2]], real[[0, 2]]), rtol=1e-5, atol=1e-5
    )


@needs_kernel
def test_declines_where_it_does_not_apply():
    x, u = torch.randn(2, 5, 32), torch.randn(2, 3, 32)
    mask = blocks.key_mask(torch.ones(2, 5, dtype=torch.bool))
    with torch.no_grad():
        assert blocks.one_row_native(u, x, mask) is not None
        assert blocks.one_row_native(u.double(), x.double(), mask) is None  # float64
        assert blocks.one_row_native(u[..., :30], x[..., :30], mask) is None  # n not a multiple of 16
        assert blocks.one_row_native(u[..., ::2], x[..., ::2], mask) is None  # rows not contiguous
        assert blocks.one_row_native(u[:1].expand(3, 3, 32), x, mask) is None  # 3 row sets for 2 documents
        assert blocks.one_row_native(u, torch.randn(2, 513, 32), None) is None  # more tokens than its limit
        assert blocks.one_row_native(u, x, mask.float()) is None
    u.requires_grad_(True)
    assert blocks.one_row_native(u, x, mask) is None  # autograd keeps PyTorch's code


@needs_kernel
@pytest.mark.parametrize("shared", [False, True])
def test_one_row_context_equals_pytorchs(tiny_base, shared, monkeypatch):
    """``Attention.one_row_context`` in inference (the compiled sums) = the batched products it replaces."""
    ranker = init_ranker("mores", base=tiny_base, ibs=1)
    att = ranker.ibs[0].layer.attention.eval()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 9, att.self.query.in_features, generator=g)
    real = torch.ones(6, 9, dtype=torch.bool)
    real[2, 4:] = False
    row = x[:1, :1] if shared else x[:, :1]
    with torch.no_grad():
        got = att.one_row_context(row, x, blocks.key_mask(real))
        monkeypatch.setattr(blocks, "one_row_native", lambda *args: None)
        want = att.one_row_context(row, x, blocks.key_mask(real))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
