"""blocks.Linear: oneDNN over a packed weight for CPU float32 inference, F.linear for everything else."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
import torch.nn.functional as F
from aheadrank.rankers import blocks

from aheadrank.kernels import stored
from aheadrank.kernels import tk as tk_kernels

needs_onednn = pytest.mark.skipif(not blocks.ONEDNN_LINEAR, reason="oneDNN linear not available")


def close(a, b):
    torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@needs_onednn
def test_inference_runs_packed_and_follows_every_change_of_the_weight():
    torch.manual_seed(0)
    lin = blocks.Linear(64, 48)
    x = torch.randn(3, 40, 64)
    with torch.no_grad():
        close(lin(x), F.linear(x, lin.weight, lin.bias))
        assert lin._packed is not None
        lin.weight.mul_(-2.0)  # an in-place fit
        close(lin(x), F.linear(x, lin.weight, lin.bias))
    fresh = blocks.Linear(64, 48).state_dict()
    lin.load_state_dict(fresh)
    with torch.inference_mode():
        close(lin(x), F.linear(x, fresh["weight"], fresh["bias"]))
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    lin(x).square().sum().backward()
    opt.step()  # an optimiser step
    with torch.no_grad():
        close(lin(x), F.linear(x, lin.weight, lin.bias))


def test_training_autocast_and_small_layers_stay_plain():
    torch.manual_seed(0)
    lin = blocks.Linear(64, 48)
    x = torch.randn(4, 64, requires_grad=True)
    (gx,) = torch.autograd.grad(lin(x).sum(), x)
    (want,) = torch.autograd.grad(F.linear(x, lin.weight, lin.bias).sum(), x)
    close(gx, want)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16
    head = blocks.Linear(64, 1)
    with torch.no_grad():
        close(head(x), F.linear(x, head.weight, head.bias))
        assert head._packed is None
        close(lin.double()(x.double()), F.linear(x.double(), lin.weight, lin.bias))  # float64: plain
    assert lin._packed is None


def test_weights_made_in_inference_mode_stay_plain():
    with torch.inference_mode():
        lin = blocks.Linear(64, 48)
        x = torch.randn(2, 64)
        close(lin(x), F.linear(x, lin.weight, lin.bias))
    assert lin._packed is None


@needs_onednn
def test_pickles_and_copies_without_the_packed_weight():
    lin = blocks.Linear(64, 48)
    x, few = torch.randn(200, 64), torch.randn(2, 64)
    with torch.no_grad():
        y, y_few = lin(x), lin(few)
        for other in (pickle.loads(pickle.dumps(lin)), copy.deepcopy(lin)):
            assert other._packed is None
            close(other(x), y)
            close(other(few), y_few)


def test_the_environment_turns_it_off(monkeypatch):
    monkeypatch.setenv("AHEADRANK_ONEDNN_LINEAR", "0")
    assert blocks._onednn_linear_available() is False
    monkeypatch.setattr(blocks, "ONEDNN_LINEAR", False)
    lin = blocks.Linear(64, 48)
    with torch.no_grad():
        lin(torch.randn(200, 64))
    assert lin._packed is None


@needs_onednn
def test_shared_right_hand_sides_run_packed_and_equal_the_plain_products(monkeypatch):
    """pack_weight + matmul_t (a query's rows against every candidate block) = x @ wᵀ; and the paths that use
    it — MORES S1's folded cross-attention and TK's cosines — give the same values packed as plain."""
    from aheadrank.rankers.tk import cosines

    torch.manual_seed(0)
    x, w = torch.randn(6, 7, 64), torch.randn(12, 64)
    with torch.no_grad():
        packed = blocks.pack_weight(w, x)
        assert packed is not None
        close(blocks.matmul_t(x, w, packed), x @ w.T)
        assert blocks.pack_weight(w[:4], x) is None  # too few rows to gain
    assert blocks.pack_weight(w, x) is None  # gradients on: plain

    monkeypatch.setattr(stored, "STORED_BLOCK_MIN_DOCS", 2)
    monkeypatch.setattr(stored, "STORED_BLOCK_VALUES", 1)
    att = blocks.Attention(64, 4, 1e-12, 0.0, 0.0).eval()
    mask = blocks.key_mask(torch.arange(7)[None, :] < torch.tensor([7, 1, 4, 6, 2, 5])[:, None])
    q = att.project_q(torch.randn(1, 3, 64)).detach()
    with torch.no_grad():
        packed_ctx = att.folded_context(q, x.half(), mask)
        monkeypatch.setattr(blocks, "ONEDNN_LINEAR", False)
        close(packed_ctx, att.folded_context(q, x.half(), mask))
        close(packed_ctx, att.context(q, *att.project_kv(x.half().float()), mask))
        qt = torch.nn.functional.normalize(torch.randn(1, 16, 64), dim=-1)
        plain = cosines(qt, x)
        monkeypatch.setattr(blocks, "ONEDNN_LINEAR", True)
        close(cosines(qt, x, packed_q=blocks.pack_weight(qt[0], qt)), plain)


@needs_onednn
def test_tk_packs_a_query_once_and_never_pickles_the_pack(tiny_base, monkeypatch):
    """TK's scoring reuses the packed query for every chunk of one query state's candidates, packs a new query
    tensor afresh (never another query's pack), and a ranker holding a pack pickles and deep-copies without
    it (the cosine GEMM path: the compiled pass from the stored vectors, where it runs, needs no pack)."""
    from aheadrank.rankers import init_ranker

    monkeypatch.setattr(tk_kernels, "stored_sums", lambda *a, **k: None)
    r = init_ranker("tk", base=tiny_base, tk_heads=4).eval()
    n = r.config.hidden
    q1, q2 = (F.normalize(torch.randn(1, 16, n), dim=-1) for _ in range(2))
    d = F.normalize(torch.randn(12, 9, n), dim=-1).half()
    qm, dm = torch.ones(1, 16, dtype=torch.bool), torch.ones(12, 9, dtype=torch.bool)
    with torch.no_grad():
        first = r.kernel_score(q1, qm, d, dm)
        pack = r._q_pack[1]
        assert pack is not None
        torch.testing.assert_close(r.kernel_score(q1, qm, d[:5], dm[:5]), first[:5])
        assert r._q_pack[1] is pack
        other = r.kernel_score(q2, qm, d, dm)
        assert r._q_pack[1] is not pack
    fresh = copy.deepcopy(r)
    assert "_q_pack" not in fresh.__dict__
    pickle.loads(pickle.dumps(r))
    with torch.no_grad():
        torch.testing.assert_close(fresh.kernel_score(q2, qm, d, dm), other)


@needs_onednn
def test_gelu_of_many_rows_is_onednns_post_op():
    """Linear.gelu over many rows in inference: oneDNN's linear with its GELU post-op (erf form) over the packed
    weight, equal to F.gelu of the linear within float32 rounding; with gradients on, the two steps."""
    torch.manual_seed(0)
    lin = blocks.Linear(64, 96)
    x = torch.randn(4, 50, 64) * 3
    with torch.no_grad():
        got = lin.gelu(x)
        assert lin._packed is not None
    close(got, F.gelu(F.linear(x, lin.weight, lin.bias)))
    assert lin.gelu(x).requires_grad
