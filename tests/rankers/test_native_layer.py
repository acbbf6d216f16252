"""The compiled BERT layer over a few rows (``native_kernels.c``: encoder_layer, encoder_stack;
``aheadrank.kernels.layer``: ``native``, ``native_stack``, ``pack_panels``): equal to the layer run by PyTorch within
float32 rounding, the same bits for any thread count, declining where it does not apply, and what a query encoder
runs."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from aheadrank.rankers import blocks, init_ranker
from conftest import needs_kernel

from aheadrank.kernels import layer as kernel_layer
from aheadrank.kernels import native


def native_layer(layer, x, mask):
    """The kernels' layer on ``layer``'s weights (None where it declines)."""
    return kernel_layer.native(layer.kernel_weights(), x, mask)


def native_stack(layers, x, mask):
    """The kernels' stack on ``layers``' weights (None where it declines)."""
    return kernel_layer.native_stack([layer.kernel_weights() for layer in layers], x, mask)


@needs_kernel
def test_query_states_equal_with_and_without_it(tiny_base, monkeypatch):
    """A ranker's query side (its query encoder's layers: the rows this is for) gives the same states through the
    compiled layers and with the kernels off, within float32 rounding."""
    calls = {"layer": 0}
    real_layer = kernel_layer.native
    monkeypatch.setattr(
        kernel_layer, "native", lambda *a: calls.__setitem__("layer", calls["layer"] + 1) or real_layer(*a)
    )
    r = init_ranker("prettr", base=tiny_base, layer=1, compress=0).eval()
    ids = torch.tensor([[101, 2054, 2003, 1037, 3231, 102]])
    mask = torch.ones_like(ids, dtype=torch.bool)
    with torch.no_grad():
        whole = r.query_state(ids, mask)["q"]
        assert calls["layer"] > 0
        monkeypatch.setenv(native.ENVIRONMENT, "0")
        plain = r.query_state(ids, mask)["q"]
    torch.testing.assert_close(whole, plain, rtol=1e-5, atol=1e-5)


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
    """encoder_layer (kernels.layer.native) equals the layer run by PyTorch (kernels off) within float32 rounding
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
        got = native_layer(layer, x, mask)
        assert got is not None and got.shape == (b, t, n)
        with native_off():
            want = layer(x, mask)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-5)
        torch.testing.assert_close(layer(x, mask), got, rtol=0, atol=0)  # forward takes it
        assert torch.equal(on_one_thread(lambda: native_layer(layer, x, mask)), got)


@needs_kernel
def test_whole_layer_declines_where_it_does_not_apply_and_follows_weight_changes():
    """None for more than MAX_ROWS rows, a per-row mask, gradients, a non-float32 input; forward keeps
    PyTorch's layer in training; a weight changed in place after a call is used by the next one; a deep copy
    computes from its own weights."""
    layer = _layer(64, 4, 96, seed=1)
    x = torch.randn(1, 9, 64)
    with torch.no_grad():
        assert native_layer(layer, torch.randn(5, 13, 64), None) is None  # 65 rows
        assert native_layer(layer, x, torch.ones(1, 1, 9, 9, dtype=torch.bool)) is None
        assert native_layer(layer, x.double(), None) is None
        first = native_layer(layer, x, None)
        layer.intermediate.dense.weight.mul_(-1.5)
        layer.attention.output.LayerNorm.bias.add_(1.0)
        second = native_layer(layer, x, None)
        with native_off():
            want = layer(x)
    assert not torch.allclose(first, second)
    torch.testing.assert_close(second, want, rtol=1e-5, atol=2e-5)
    twin = copy.deepcopy(layer)  # without the cached addresses (into the original's weights): builds its own
    assert "_kernel_weights" in layer.__dict__ and "_kernel_weights" not in twin.__dict__
    with torch.no_grad():
        layer.intermediate.dense.weight.zero_()  # the original changes; the copy must not read it
        torch.testing.assert_close(native_layer(twin, x, None), second, rtol=0, atol=0)
    assert native_layer(layer, x, None) is None  # gradients on: autograd runs PyTorch's layer
    layer.train()
    assert layer(x).requires_grad


@needs_kernel
@pytest.mark.parametrize(
    ("b", "t", "n", "heads", "inner", "n_layers"),
    [(1, 18, 384, 12, 1536, 5), (2, 9, 64, 4, 96, 3), (1, 40, 48, 3, 80, 2), (3, 5, 64, 2, 64, 4)],
)
@pytest.mark.parametrize("padded", [False, True])
def test_a_stack_of_layers_in_one_call(b, t, n, heads, inner, n_layers, padded):
    """encoder_stack (kernels.layer.native_stack, what Encoder.run and TK's contextualisation take for a few rows): the
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
        got = native_stack(layers, x, mask)
        assert got is not None and got.shape == (b, t, n)
        one_by_one = x
        for layer in layers:
            one_by_one = native_layer(layer, one_by_one, mask)
        assert torch.equal(got, one_by_one)
        with native_off():
            want = blocks.run_layers(layers, x, mask)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert torch.equal(blocks.run_layers(layers, x, mask), got)
        assert torch.equal(on_one_thread(lambda: native_stack(layers, x, mask)), got)


@needs_kernel
def test_a_stack_declines_where_a_layer_would_and_follows_weight_changes():
    """None for more than MAX_ROWS rows, a per-row mask, gradients, one layer of another width; run_layers
    then runs the layers one by one (PyTorch's in training); a weight of a later layer changed in place after a
    call is used by the next one; a deep copy computes from its own weights."""
    layers = torch.nn.ModuleList(_layer(64, 4, 96, seed=s) for s in (1, 2, 3))
    x = torch.randn(1, 9, 64)
    with torch.no_grad():
        assert native_stack(layers, torch.randn(5, 13, 64), None) is None  # 65 rows
        assert native_stack(layers, x, torch.ones(1, 1, 9, 9, dtype=torch.bool)) is None
        mixed = torch.nn.ModuleList([layers[0], _layer(48, 4, 96, seed=4)])
        assert native_stack(mixed, x, None) is None
        first = native_stack(layers, x, None)
        layers[2].intermediate.dense.weight.mul_(-1.5)
        layers[1].attention.output.LayerNorm.bias.add_(1.0)
        second = native_stack(layers, x, None)
        with native_off():
            want = blocks.run_layers(layers, x, None)
    assert not torch.allclose(first, second)
    torch.testing.assert_close(second, want, rtol=1e-4, atol=1e-4)
    twin = copy.deepcopy(layers)
    assert "_kernel_weights" in layers[0].__dict__ and "_kernel_weights" not in twin[0].__dict__
    assert "_stack" in layers[0].kernel_weights().__dict__
    with torch.no_grad():
        layers[2].intermediate.dense.weight.zero_()  # the original changes; the copy must not read it
        torch.testing.assert_close(native_stack(twin, x, None), second, rtol=0, atol=0)
    assert native_stack(layers, x, None) is None  # gradients on
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
