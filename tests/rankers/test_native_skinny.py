"""The compiled skinny linear (``native_kernels.c``: skinny_linear; ``blocks.linear_native``, ``pack_panels``):
``x @ wᵀ + b`` for a few rows (a query's tokens) equal to the float64 product within float32 rounding, the same
bits for any thread count, declining where it does not apply, and what ``blocks.Linear`` runs for few rows."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from aheadrank.rankers import blocks, init_ranker, native
from conftest import needs_kernel


def _ref(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().T
    return y if b is None else y + b.double()


@needs_kernel
@pytest.mark.parametrize("rows", [1, 2, 11, 12, 13, 18, 25, 64])  # row blocks of 12: full, partial, several
@pytest.mark.parametrize(
    ("k", "n"), [(384, 384), (384, 1536), (1536, 384), (64, 40), (16, 17), (33, 100), (7, 1)]
)
@pytest.mark.parametrize("bias", [True, False])
def test_equals_the_float64_product(rows, k, n, bias):
    """Within 1e-5 of the float64 product relative to its largest |value| (float32 sums of k terms), for output
    widths that fill panels of 32 columns, half a panel (16: the second vector masked off) or neither, every
    row-block remainder; nothing is written past N (the output is exactly [rows, N])."""
    g = torch.Generator().manual_seed(rows * 1000 + k + n)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g) if bias else None
    panels = blocks.pack_panels(w)
    assert panels.shape == (-(-n // 32), k, 32) and (panels.transpose(1, 2).reshape(-1, k)[n:] == 0).all()
    got = blocks.linear_native(x, panels, b, n)
    assert got is not None and got.shape == (rows, n) and got.dtype == torch.float32
    want = _ref(x, w, b)
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()


@needs_kernel
def test_leading_dimensions_and_non_contiguous_inputs():
    """x [..., k] of any leading shape (a query state [1, Tq, n]) and a non-contiguous x (a transposed view)."""
    g = torch.Generator().manual_seed(1)
    w, b = torch.randn(48, 64, generator=g), torch.randn(48, generator=g)
    x = torch.randn(1, 18, 64, generator=g)
    got = blocks.linear_native(x, blocks.pack_panels(w), b, 48)
    assert got.shape == (1, 18, 48)
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    xt = torch.randn(64, 5, generator=g).T  # [5, 64], not contiguous
    torch.testing.assert_close(blocks.linear_native(xt, blocks.pack_panels(w), b, 48), F.linear(xt, w, b))


@needs_kernel
def test_same_bits_for_any_thread_count():
    g = torch.Generator().manual_seed(2)
    x, w, b = (
        torch.randn(18, 384, generator=g),
        torch.randn(1536, 384, generator=g),
        torch.randn(1536, generator=g),
    )
    panels = blocks.pack_panels(w)
    before = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(blocks.linear_native(x, panels, b, 1536))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(outs[0], o) for o in outs[1:])


def test_declines_where_it_does_not_apply(monkeypatch):
    """Too many rows, no rows, panels for another width, or no compiled kernels: None (the caller's linear
    runs)."""
    w = torch.randn(48, 64)
    panels = blocks.pack_panels(w)
    assert blocks.linear_native(torch.randn(blocks.SKINNY_MAX_ROWS + 1, 64), panels, None, 48) is None
    assert blocks.linear_native(torch.randn(0, 64), panels, None, 48) is None
    assert blocks.linear_native(torch.randn(3, 32), panels, None, 48) is None
    monkeypatch.setenv(native.ENVIRONMENT, "0")
    assert blocks.linear_native(torch.randn(3, 64), panels, None, 48) is None


@needs_kernel
def test_the_entry_point_refuses_bad_arguments():
    """Empty shapes, an unknown activation, a residual without its LayerNorm, GELU with a LayerNorm: -1, nothing
    written."""
    lib = native.library()
    x, panels, out = torch.randn(2, 8), blocks.pack_panels(torch.randn(4, 8)), torch.full((2, 4), 7.0)
    res, w = torch.zeros(2, 4), torch.ones(4)

    def call(m, k, n, act=0, residual=None, ln_w=None, ln_b=None):
        ptrs = [None if t is None else native.ptr(t) for t in (residual, ln_w, ln_b)]
        xp, pp, op = native.ptr(x), native.ptr(panels), native.ptr(out)
        return lib.skinny_linear(xp, m, k, pp, None, n, op, act, *ptrs, 0.0, 1)

    for m, k, n in ((0, 8, 4), (2, 0, 4), (2, 8, 0)):
        assert call(m, k, n) == -1
    assert call(2, 8, 4, act=2) == -1
    assert call(2, 8, 4, residual=res) == -1
    assert call(2, 8, 4, act=1, residual=res, ln_w=w, ln_b=w) == -1
    assert (out == 7.0).all()


@needs_kernel
@pytest.mark.parametrize(("rows", "k", "n"), [(18, 384, 1536), (5, 64, 40), (13, 33, 17)])
def test_gelu_as_the_outputs_are_stored(rows, k, n):
    """act SKINNY_GELU: F.gelu (erf form) of the product, within float32 rounding of torch's; Linear.gelu takes it
    for few rows and is F.gelu(linear(x)) for many."""
    g = torch.Generator().manual_seed(rows + k)
    x, w, b = (
        torch.randn(rows, k, generator=g),
        torch.randn(n, k, generator=g) / k**0.5,
        torch.randn(n, generator=g),
    )
    got = blocks.linear_native(x, blocks.pack_panels(w), b, n, blocks.SKINNY_GELU)
    want = F.gelu(F.linear(x.double(), w.double(), b.double()))
    assert got is not None and (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
    lin = blocks.Linear(k, n)
    many = torch.randn(3, 40, k, generator=g)
    with torch.no_grad():
        torch.testing.assert_close(
            lin.gelu(x), F.gelu(F.linear(x, lin.weight, lin.bias)), rtol=1e-5, atol=1e-5
        )
        torch.testing.assert_close(
            lin.gelu(many), F.gelu(F.linear(many, lin.weight, lin.bias)), rtol=1e-5, atol=1e-5
        )


@needs_kernel
def test_linear_runs_it_for_few_rows_and_follows_weight_changes(monkeypatch):
    """blocks.Linear in inference: few rows through the panels (calls counted), many through oneDNN's pack
    where available; an in-place change of the weight repacks; with the kernels off, the usual linear."""
    calls = []
    real = blocks.linear_native
    monkeypatch.setattr(blocks, "linear_native", lambda *a: calls.append(a[0].shape) or real(*a))
    torch.manual_seed(0)
    lin = blocks.Linear(64, 48)
    few, many = torch.randn(1, 18, 64), torch.randn(4, 30, 64)
    with torch.no_grad():
        torch.testing.assert_close(lin(few), F.linear(few, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        assert calls == [(1, 18, 64)] and lin._panels is not None
        torch.testing.assert_close(lin(many), F.linear(many, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        assert len(calls) == 1
        lin.weight.mul_(-2.0)
        torch.testing.assert_close(lin(few), F.linear(few, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        monkeypatch.setenv(native.ENVIRONMENT, "0")
        torch.testing.assert_close(lin(few), F.linear(few, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert len(calls) == 2


@needs_kernel
def test_query_states_equal_with_and_without_it(tiny_base, monkeypatch):
    """A ranker's query side (its query encoder's layers: the rows this is for) gives the same states through the
    compiled layer (encoder_layer), through the skinny linears alone, and with the kernels off, within float32
    rounding."""
    calls = {"layer": 0, "linear": 0}
    real_layer, real_linear = blocks.layer_native, blocks.linear_native
    monkeypatch.setattr(
        blocks, "layer_native", lambda *a: calls.__setitem__("layer", calls["layer"] + 1) or real_layer(*a)
    )
    monkeypatch.setattr(
        blocks,
        "linear_native",
        lambda *a: calls.__setitem__("linear", calls["linear"] + 1) or real_linear(*a),
    )
    r = init_ranker("prettr", base=tiny_base, layer=1, compress=0).eval()
    ids = torch.tensor([[101, 2054, 2003, 1037, 3231, 102]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        whole = r.query_state(ids, mask)["q"]
        assert calls["layer"] > 0 and calls["linear"] == 0
        monkeypatch.setattr(blocks, "layer_native", lambda *a: None)  # the layer as separate calls
        linears = r.query_state(ids, mask)["q"]
        assert calls["linear"] > 0
        monkeypatch.setenv(native.ENVIRONMENT, "0")
        plain = r.query_state(ids, mask)["q"]
    torch.testing.assert_close(whole, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(linears, plain, rtol=1e-5, atol=1e-5)


def _layer(n: int, heads: int, inner: int, seed: int) -> blocks.TransformerLayer:
    """A BERT layer with random weights, biases and LayerNorm parameters (not the identity's 1 and 0)."""
    torch.manual_seed(seed)
    layer = blocks.TransformerLayer(n, heads, inner, 1e-12, 0.1, 0.1)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if "LayerNorm.weight" in name:
                p.copy_(torch.rand_like(p) + 0.5)
            else:
                p.copy_(torch.randn_like(p) * (0.5 if "bias" in name else p.shape[-1] ** -0.5))
    return layer.eval()


@needs_kernel
@pytest.mark.parametrize(
    ("b", "t", "n", "heads", "inner"),
    [
        (1, 18, 384, 12, 1536),
        (2, 18, 384, 12, 1536),
        (3, 5, 64, 4, 96),
        (1, 1, 64, 2, 64),
        (4, 16, 48, 3, 80),
        (1, 40, 64, 4, 96),  # the softmax's 16-key steps: two whole and a part
    ],
)
@pytest.mark.parametrize("padded", [False, True])
def test_whole_layer_in_one_call(b, t, n, heads, inner, padded):
    """encoder_layer (blocks.layer_native) equals the layer run by PyTorch (kernels off) within float32 rounding
    for one or several sequences, with padding keys skipped (the padded rows computed as PyTorch does); the same
    bits for 1 and 2 threads."""
    layer = _layer(n, heads, inner, seed=b * 100 + t)
    g = torch.Generator().manual_seed(t)
    x = torch.randn(b, t, n, generator=g)
    real = torch.ones(b, t, dtype=torch.bool)
    if padded:
        real[-1, (t + 1) // 2 :] = False
    mask = blocks.key_mask(real)
    with torch.no_grad():
        got = blocks.layer_native(layer, x, mask)
        assert got is not None and got.shape == (b, t, n)
        with native_off():
            want = layer(x, mask)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(layer(x, mask), got, rtol=0, atol=0)  # forward takes it
        assert torch.equal(on_one_thread(lambda: blocks.layer_native(layer, x, mask)), got)


@needs_kernel
def test_whole_layer_declines_where_it_does_not_apply_and_follows_weight_changes():
    """None for more than SKINNY_MAX_ROWS rows, a per-row mask, gradients, a non-float32 input; forward keeps
    PyTorch's layer in training; a weight changed in place after a call is used by the next one; a deep copy
    computes from its own weights."""
    layer = _layer(64, 4, 96, seed=1)
    x = torch.randn(1, 9, 64)
    with torch.no_grad():
        assert blocks.layer_native(layer, torch.randn(5, 13, 64), None) is None  # 65 rows
        assert blocks.layer_native(layer, x, torch.ones(1, 1, 9, 9, dtype=torch.bool)) is None
        assert blocks.layer_native(layer, x.double(), None) is None
        first = blocks.layer_native(layer, x, None)
        layer.intermediate.dense.weight.mul_(-1.5)
        layer.attention.output.LayerNorm.bias.add_(1.0)
        second = blocks.layer_native(layer, x, None)
        with native_off():
            want = layer(x)
    assert not torch.allclose(first, second)
    torch.testing.assert_close(second, want, rtol=1e-5, atol=2e-5)
    twin = copy.deepcopy(layer)  # without the cached addresses (into the original's weights): builds its own
    assert "_native_arguments" in layer.__dict__ and "_native_arguments" not in twin.__dict__
    with torch.no_grad():
        layer.intermediate.dense.weight.zero_()  # the original changes; the copy must not read it
        torch.testing.assert_close(blocks.layer_native(twin, x, None), second, rtol=0, atol=0)
    assert blocks.layer_native(layer, x, None) is None  # gradients on: autograd runs PyTorch's layer
    layer.train()
    assert layer(x).requires_grad


@needs_kernel
@pytest.mark.parametrize(
    ("b", "t", "n", "heads", "inner", "n_layers"),
    [(1, 18, 384, 12, 1536, 5), (2, 9, 64, 4, 96, 3), (1, 40, 48, 3, 80, 2), (3, 5, 64, 2, 64, 4)],
)
@pytest.mark.parametrize("padded", [False, True])
def test_a_stack_of_layers_in_one_call(b, t, n, heads, inner, n_layers, padded):
    """encoder_stack (blocks.stack_native, what Encoder.run and TK's contextualisation take for a few rows): the
    same bits as the layers one by one through encoder_layer (an even and an odd count of layers: the last lands
    in the output either way), within float32 rounding of PyTorch's layers, and the same bits for 1 and 2
    threads."""
    layers = torch.nn.ModuleList(_layer(n, heads, inner, seed=10 * i + t) for i in range(n_layers))
    g = torch.Generator().manual_seed(b + t)
    x = torch.randn(b, t, n, generator=g)
    real = torch.ones(b, t, dtype=torch.bool)
    if padded:
        real[0, (t + 1) // 2 :] = False
    mask = blocks.key_mask(real)
    with torch.no_grad():
        got = blocks.stack_native(layers, x, mask)
        assert got is not None and got.shape == (b, t, n)
        one_by_one = x
        for layer in layers:
            one_by_one = blocks.layer_native(layer, one_by_one, mask)
        assert torch.equal(got, one_by_one)
        with native_off():
            want = blocks.run_layers(layers, x, mask)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert torch.equal(blocks.run_layers(layers, x, mask), got)
        assert torch.equal(on_one_thread(lambda: blocks.stack_native(layers, x, mask)), got)


@needs_kernel
def test_a_stack_declines_where_a_layer_would_and_follows_weight_changes():
    """None for more than SKINNY_MAX_ROWS rows, a per-row mask, gradients, one layer of another width; run_layers
    then runs the layers one by one (PyTorch's in training); a weight of a later layer changed in place after a
    call is used by the next one; a deep copy computes from its own weights."""
    layers = torch.nn.ModuleList(_layer(64, 4, 96, seed=s) for s in (1, 2, 3))
    x = torch.randn(1, 9, 64)
    with torch.no_grad():
        assert blocks.stack_native(layers, torch.randn(5, 13, 64), None) is None  # 65 rows
        assert blocks.stack_native(layers, x, torch.ones(1, 1, 9, 9, dtype=torch.bool)) is None
        mixed = torch.nn.ModuleList([layers[0], _layer(48, 4, 96, seed=4)])
        assert blocks.stack_native(mixed, x, None) is None
        first = blocks.stack_native(layers, x, None)
        layers[2].intermediate.dense.weight.mul_(-1.5)
        layers[1].attention.output.LayerNorm.bias.add_(1.0)
        second = blocks.stack_native(layers, x, None)
        with native_off():
            want = blocks.run_layers(layers, x, None)
    assert not torch.allclose(first, second)
    torch.testing.assert_close(second, want, rtol=1e-4, atol=1e-4)
    twin = copy.deepcopy(layers)
    assert "_native_stack" in layers[0].__dict__ and "_native_stack" not in twin[0].__dict__
    with torch.no_grad():
        layers[2].intermediate.dense.weight.zero_()  # the original changes; the copy must not read it
        torch.testing.assert_close(blocks.stack_native(twin, x, None), second, rtol=0, atol=0)
    assert blocks.stack_native(layers, x, None) is None  # gradients on
    layers.train()
    assert blocks.run_layers(layers, x, None).requires_grad


def on_one_thread(fn):
    """fn() with PyTorch (and so the compiled kernels) on one thread."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        return fn()
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def native_off():
    """The compiled kernels off inside the block (PyTorch's code throughout)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(native.ENVIRONMENT, "0")
        yield


@needs_kernel
@pytest.mark.parametrize(("rows", "k", "n"), [(18, 384, 384), (18, 1536, 384), (1, 64, 48), (13, 40, 17)])
def test_projection_residual_and_layer_norm_in_one_call(rows, k, n):
    """residual + norm: LayerNorm(x·wᵀ + b + residual), as torch computes it, within float32 rounding (rows far
    from zero mean, a LayerNorm with random weight and bias); _AddNorm (BERT's output sub-layer) takes it for few
    rows in inference, and its usual two steps for many rows and in training."""
    g = torch.Generator().manual_seed(rows * 7 + n)
    x, w = torch.randn(rows, k, generator=g), torch.randn(n, k, generator=g) / k**0.5
    b = torch.randn(n, generator=g)
    residual = torch.randn(rows, n, generator=g) * 3 + 5
    norm = torch.nn.LayerNorm(n, eps=1e-12)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(n, generator=g) + 0.5)
        norm.bias.copy_(torch.randn(n, generator=g))
        got = blocks.linear_native(x, blocks.pack_panels(w), b, n, residual=residual, norm=norm)
        exact = F.linear(x.double(), w.double(), b.double()) + residual.double()
        want = F.layer_norm(exact, (n,), norm.weight.double(), norm.bias.double(), 1e-12)
        assert got is not None and got.shape == (rows, n)
        assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
        panels = blocks.pack_panels(w)
        assert blocks.linear_native(x, panels, b, n, residual=residual[:, :-1], norm=norm) is None  # shape
        assert blocks.linear_native(x, panels, b, n, blocks.SKINNY_GELU, residual, norm) is None

    sub = blocks._AddNorm(k, n, 1e-12, 0.1).eval()
    many = torch.randn(3, 40, k, generator=g)
    with torch.no_grad():
        for inp, res in ((x, residual), (many, torch.randn(3, 40, n, generator=g))):
            plain = sub.LayerNorm(F.linear(inp, sub.dense.weight, sub.dense.bias) + res)
            torch.testing.assert_close(sub(inp, res), plain, rtol=1e-5, atol=1e-5)
    sub.train()
    assert sub(x, residual).requires_grad  # dropout on, gradients on: the usual path, which trains
