"""The compiled attention for a few query rows (``aheadrank/kernels/attention.py``: native, ``native_kernels.c``:
cross_attention): equal to the formula for every stored dtype and float32, declining (None, so that the reference
runs) wherever it does not apply, and giving MORES S2 the scores of the PyTorch path; the reference path of
``attend`` equal to the kernel."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from aheadrank.rankers import QuantizedField, init_ranker
from aheadrank.rankers.blocks import Attention
from aheadrank.rankers.text import pad_fields
from conftest import needs_kernel, random_text, save_tiny_bert

from aheadrank.kernels import native
from aheadrank.kernels.attention import native as attend_native
from aheadrank.kernels.attention import reference_attend

# the native kernel and the reference path of attention.attend, held to the same float64 formula
BOTH_PATHS = pytest.mark.parametrize(
    "attend",
    [
        pytest.param(attend_native, marks=needs_kernel, id="native"),
        pytest.param(reference_attend, id="reference"),
    ],
)


def context_native(q, k, v, mask):
    """The kernel's softmax(q·kᵀ/√dh)·v, or None where it declines."""
    found = attend_native(q, k, v, mask, q.shape[-1] ** -0.5)
    return None if found is None else found[0]


def _fields(b: int, t: int, n: int, kind: str, seed: int = 0):
    """Stored keys and values in ``kind`` and the float64 values they stand for."""
    g = torch.Generator().manual_seed(seed)
    k, v = torch.randn(b, t, n, generator=g) * 2, torch.randn(b, t, n, generator=g)
    if kind == "int8":
        kq, vq = QuantizedField.quantize(k), QuantizedField.quantize(v)
        return kq, vq, kq.to(torch.float64), vq.to(torch.float64)
    dt = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}[kind]
    return k.to(dt), v.to(dt), k.to(dt).double(), v.to(dt).double()


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """softmax(q·kᵀ/√dh)·v in float64 straight from the formula, over each document's real tokens only."""
    bq, h, tq, dh = q.shape
    b, t, n = k.shape
    kh, vh = k.view(b, t, h, dh).transpose(1, 2), v.view(b, t, h, dh).transpose(1, 2)
    scores = (q.double().expand(b, -1, -1, -1) @ kh.transpose(-1, -2)) / dh**0.5
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    ctx = scores.softmax(-1) @ vh
    return ctx.transpose(1, 2).reshape(b, tq, n)


@needs_kernel
@pytest.mark.parametrize("kind", ["float16", "bfloat16", "int8", "float32"])
@pytest.mark.parametrize(
    ("b", "h", "dh", "tq", "t", "per_doc_q"),
    [(9, 12, 32, 19, 130, False), (5, 12, 32, 19, 37, True), (4, 6, 64, 16, 21, False), (3, 2, 32, 1, 9, True),
     (6, 4, 64, 32, 70, True), (17, 3, 32, 17, 8, False), (7, 2, 32, 24, 32, True), (4, 12, 32, 25, 48, False),
     (6, 5, 32, 21, 16, False), (5, 2, 48, 19, 30, False), (4, 3, 16, 9, 25, True),
     (2, 3, 32, 19, 530, False)],
)  # fmt: skip
def test_equals_the_formula(kind, b, h, dh, tq, t, per_doc_q):
    """Every stored dtype, one query for all documents or one per document, query-row counts on both sides of a
    vector (16), key counts that are no multiple of the key block, padding at the end and holes inside, a
    document with a single real token, head widths of 32 (keys across the lanes up to 512 keys, beyond them the
    rows across the lanes), multiples of 64 and other multiples of 16: within
    float32 rounding of the float64 formula (1e-5 of the largest
    value: the kernel's exp is a degree-6 polynomial with relative error < 2e-7)."""
    g = torch.Generator().manual_seed(7)
    k, v, k64, v64 = _fields(b, t, h * dh, kind)
    q = torch.randn(b if per_doc_q else 1, h, tq, dh, generator=g) * 3  # peaked and flat softmax rows
    keep = torch.rand(b, t, generator=g) > 0.2
    keep[:, 0] = True
    keep[0, t // 2 :] = False  # trailing padding
    keep[-1] = False
    keep[-1, t - 1] = True  # one real token, the last
    with torch.inference_mode():
        got = context_native(q, k, v, keep[:, None, None, :])
    assert got is not None and got.shape == (b, tq, h * dh) and got.dtype == torch.float32
    want = _reference(q, k64, v64, keep)
    assert ((got.double() - want).abs().max() / want.abs().max()).item() <= 1e-5


@needs_kernel
def test_no_mask_and_a_document_without_real_tokens():
    """No mask: every token counts. A document whose mask has no real token gets zeros (PyTorch's attention
    gives NaN for it; a stored document always has at least [CLS] and [SEP])."""
    k, v, k64, v64 = _fields(3, 11, 64, "float16")
    q = torch.randn(1, 2, 5, 32)
    with torch.inference_mode():
        got = context_native(q, k, v, None)
        keep = torch.ones(3, 11, dtype=torch.bool)
        keep[1] = False
        masked = context_native(q, k, v, keep[:, None, None, :])
    want = _reference(q, k64, v64, torch.ones(3, 11, dtype=torch.bool))
    assert ((got.double() - want).abs().max() / want.abs().max()).item() <= 1e-5
    assert (masked[1] == 0).all()
    torch.testing.assert_close(masked[[0, 2]], got[[0, 2]])


@needs_kernel
def test_declines_where_it_does_not_apply(monkeypatch):
    """None (PyTorch's attention runs) for a head size it has no code for, too many query rows, a per-row
    mask, gradients, mismatched fields, a query batch that is neither 1 nor the documents', and
    with the native kernels switched off."""
    k, v, _, _ = _fields(4, 10, 96, "float16")
    q = torch.randn(1, 3, 5, 32)
    keep = torch.ones(4, 1, 1, 10, dtype=torch.bool)
    with torch.inference_mode():
        assert context_native(q, k, v, keep) is not None
        assert context_native(q.view(1, 12, 5, 8), k, v, keep) is None  # dh = 8
        assert context_native(torch.randn(1, 3, 33, 32), k, v, keep) is None  # 33 rows
        assert context_native(q, k, v, keep.expand(4, 1, 5, 10)) is None  # a mask per query row
        assert context_native(q, k, v.bfloat16(), keep) is None
        assert context_native(torch.randn(2, 3, 5, 32), k, v, keep) is None
        assert context_native(q.double(), k, v, keep) is None
    assert context_native(q.requires_grad_(), k, v, keep) is None
    k32 = k.float().requires_grad_()  # keys that need a gradient (a trained document side), query not
    assert context_native(q.detach(), k32, v.float(), keep) is None
    with torch.no_grad():
        assert context_native(q.detach(), k32, v.float(), keep) is not None
    monkeypatch.setenv("AHEADRANK_NATIVE", "0")
    assert context_native(q.detach(), k, v, keep) is None


@needs_kernel
def test_the_c_entry_point_refuses_arguments_outside_its_limits():
    """Called directly with a head size or row count it cannot take, or extra values that are not one head's,
    given twice or not at all, cross_attention returns -1 and writes nothing (the Python side checks the same
    limits first)."""
    lib = native.library()
    k = torch.zeros(2, 4, 96, dtype=torch.float16)
    out = torch.full((2, 3, 97), -7.0)
    ones = torch.ones(2, 4)
    xq, quad = torch.ones(3), torch.ones(2 * 96 + 3)
    # (head width, rows, extra values, their coefficients, quadratic form)
    cases = [(40, 3, None, None, None), (8, 3, None, None, None), (32, 0, None, None, None)]
    cases += [(32, native.ATTENTION_MAX_ROWS + 1, None, None, None)]
    cases += [
        (32, 3, None, xq, quad),
        (96, 3, ones, xq, quad),
        (96, 3, None, xq, None),
        (96, 3, ones, None, None),
    ]
    for dh, tq, xcol, coef, form in cases:
        q = torch.zeros(1, 96 // dh, max(tq, 1), dh)
        status = lib.cross_attention(
            q.data_ptr(), 1, k.data_ptr(), k.data_ptr(), None, None, 0, None, 2, 4, 96 // dh, dh, tq,
            out.data_ptr(), None, *(None if x is None else x.data_ptr() for x in (xcol, coef, form)),
            1,
        )  # fmt: skip
        assert status == -1
    assert (out == -7.0).all()


@needs_kernel
@pytest.mark.parametrize("stored", ["float16", "float32"])
def test_attention_takes_it_for_a_few_query_rows(monkeypatch, stored):
    """Attention.context computes a few query rows with the kernel, from stored float16 keys and values or
    float32 ones (the query rows' own self-attention), and gets PyTorch's values; training with attention
    dropout keeps PyTorch's attention."""
    calls: list[bool] = []

    def counted(*args):
        out = attend_native(*args)
        calls.append(out is not None)
        return out

    monkeypatch.setattr("aheadrank.kernels.attention.native", counted)
    att = Attention(384, 12, 1e-12, 0.1, 0.1).eval()
    k, v, _, _ = _fields(6, 40, 384, stored)
    q = torch.randn(1, 12, 19, 32)
    keep = torch.rand(6, 40) > 0.1
    keep[:, 0] = True
    mask = keep[:, None, None, :]
    with torch.inference_mode():
        fast = att.context(q, k, v, mask)
        assert calls == [True]
        monkeypatch.setenv("AHEADRANK_NATIVE", "0")
        slow = att.context(q, k, v, mask)
    assert calls[1:] and not any(calls[1:])  # switched off: asked, declined
    torch.testing.assert_close(fast, slow, rtol=1e-5, atol=1e-5)
    monkeypatch.setenv("AHEADRANK_NATIVE", "1")
    n = len(calls)
    att.train()
    att.context(q, k, v, mask)
    assert len(calls) == n


@pytest.fixture(scope="module")
def texts():
    rng = random.Random(11)
    return [random_text(rng, 1, 24) for _ in range(2)], [random_text(rng, 1, 70) for _ in range(29)]


@pytest.fixture(scope="module")
def head32_base(tmp_path_factory, minilm_dir) -> Path:
    """A random 3-layer BERT whose heads are 32 wide (hidden 64, 2 heads), as MiniLM's: the kernel's size."""
    return save_tiny_bert(
        tmp_path_factory.mktemp("head32-bert"), minilm_dir, hidden=64, layers=3, heads=2, seed=4321
    )


def _stored_fields(ranker, docs: list[str], stored: str) -> tuple[dict, torch.Tensor]:
    """29 documents' fields as a store of ``stored`` hands them over, and their mask; the ranker's score head
    given random weights (an untrained head with the similarity residual is 0: the score would not read the
    attention)."""
    torch.manual_seed(3)
    torch.nn.init.normal_(ranker.head.weight, std=0.2)
    full, mask = pad_fields(ranker.encode_documents(docs[:29]), "cpu", torch.float32)
    if stored == "int8":
        return {k: QuantizedField.quantize(v) for k, v in full.items()}, mask
    return {k: v.to(getattr(torch, stored)) for k, v in full.items()}, mask


@needs_kernel
@pytest.mark.parametrize(
    "opts", [{"ibs": 1}, {"ibs": 2}, {"ibs": 2, "pooling": "mean"}, {"ibs": 2, "sim": True}], ids=str
)
@pytest.mark.parametrize("stored", ["float16", "bfloat16", "int8"])
def test_mores_s2_scores_equal_the_pytorch_path(head32_base, texts, opts, stored, monkeypatch):
    """MORES Reuse-S2 on stored fields scores the same with the kernel as with PyTorch's attention (1e-5
    relative to the score spread), for every stored dtype and interaction-block layout."""
    ranker = init_ranker("mores", base=head32_base, max_doc_len=48, **opts)
    ranker.strategy = "s2"
    queries, docs = texts
    fields, mask = _stored_fields(ranker, docs, stored)
    calls: list[torch.dtype] = []  # the key dtype of every attention the kernel computed

    def counted(*args):
        out = attend_native(*args)
        if out is not None:
            calls.append(args[1].dtype)
        return out

    monkeypatch.setattr("aheadrank.kernels.attention.native", counted)
    with torch.inference_mode():
        qs = ranker.encode_query(queries[0])
        assert not calls  # the query encoder's layers: one kernel call each (kernels.layer)
        calls.clear()
        fast = ranker.score_batch(qs, fields, mask)
        monkeypatch.setenv("AHEADRANK_NATIVE", "0")
        slow = ranker.score_batch(qs, fields, mask)
    # every IB's cross-attention over the stored fields and every IB's self-attention but the last's ([CLS] only
    # with cls pooling: folded, no keys) took the kernel
    assert sum(dt != torch.float32 for dt in calls) == opts["ibs"]
    self_attention = opts["ibs"] - (opts.get("pooling", "cls") == "cls")
    assert sum(dt == torch.float32 for dt in calls) == self_attention
    spread = (slow.max() - slow.min()).clamp(min=1e-6)
    assert ((fast - slow).abs().max() / spread).item() <= 1e-5


@BOTH_PATHS
@pytest.mark.parametrize("kind", ["float16", "int8", "float32"])
@pytest.mark.parametrize(("dh", "tq"), [(384, 13), (128, 12), (64, 1)])
def test_wide_heads_values_that_are_the_keys_and_log_sum_exps(kind, dh, tq, attend):
    """One head as wide as the states (PreTTR's folded [CLS] rows over ŝ), the values being the keys (one
    tensor, widened once), a given scale, and each row's log-sum-exp of its scores: all as the float64 formula."""
    g = torch.Generator().manual_seed(5)
    k, _, k64, _ = _fields(7, 45, dh, kind)
    q = torch.randn(1, 1, tq, dh, generator=g) * 0.2
    keep = torch.rand(7, 45, generator=g) > 0.25
    keep[:, 0] = True
    keep[3] = False  # no real token: zeros and a log-sum-exp whose exponential is 0
    with torch.inference_mode():
        found = attend(q, k, k, keep[:, None, None, :], 0.7, lse=True)
    assert found is not None
    out, lse = found
    assert lse.shape == (7, 1, tq)
    real = [i for i in range(7) if i != 3]
    scores = 0.7 * (q.double()[0, 0] @ k64.transpose(1, 2))  # [B, tq, T]
    scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
    want_lse = torch.logsumexp(scores, -1)[real]
    assert (lse[real, 0].double() - want_lse).abs().max().item() <= 1e-5 * want_lse.abs().max().item() + 1e-5
    want = scores.softmax(-1)[real] @ k64[real]
    assert ((out[real].double() - want).abs().max() / want.abs().max()).item() <= 1e-5
    assert (out[3] == 0).all() and lse[3].max().item() < -1e29


@BOTH_PATHS
@pytest.mark.parametrize("kind", ["float16", "bfloat16", "int8", "float32"])
@pytest.mark.parametrize("source", ["given", "quad"])
@pytest.mark.parametrize("n", [48, 64])
def test_keys_scaled_per_token_with_an_extra_value(kind, source, n, attend):
    """An extra value per key (PreTTR's folded decompression): the keys, which are the values, are each stored row
    times its token's scale (with int8's own scale) followed by x_j, given (``extra``, with ``key_scale``) or
    computed by the kernel from the row (``quad``: x_j = (max(r·(diag ⊙ r + g2) + bb, 0)/n + ε)^−½, the row scaled
    by it); the query rows are n + 1 wide, so is the output. As the float64 formula, with the log-sum-exps,
    padding holding NaN (float kinds) never read."""
    g = torch.Generator().manual_seed(12)
    b, t = 5, 37
    k, _, k64, _ = _fields(b, t, n, kind, seed=3)
    keep = torch.rand(b, t, generator=g) > 0.3
    keep[:, 0] = True
    keep[2] = False
    if kind != "int8":
        k = k.clone()
        k[~keep] = float("nan")
    r = k64.nan_to_num()
    if source == "given":
        scale = torch.rand(b, t, generator=g).double() + 0.2
        kwargs = {"key_scale": scale.float(), "extra": scale.float()}
        x = scale
    else:
        diag, g2 = torch.rand(n, generator=g) + 0.1, torch.randn(n, generator=g)
        bb, eps = 3.0, 1e-5
        quad = torch.cat([diag, g2, torch.tensor([bb, 1.0 / n, eps])])
        kwargs = {"quad": quad}
        form = (r * (diag.double() * r + g2.double())).sum(-1) + bb
        x = (form.clamp(min=0) / n + eps).rsqrt()
    q = torch.randn(1, 1, 9, n + 1, generator=g) * 0.3
    with torch.inference_mode():
        found = attend(q, k, k, keep[:, None, None, :], 1.0, lse=True, **kwargs)
    assert found is not None
    out, lse = found
    assert out.shape == (b, 9, n + 1)
    keys = torch.cat([r * x[..., None], x[..., None]], -1)  # [b, t, n + 1]
    scores = (q.double()[0, 0] @ keys.transpose(1, 2)).masked_fill(~keep[:, None, :], float("-inf"))
    real = [i for i in range(b) if i != 2]
    want = scores.softmax(-1)[real] @ keys[real]
    assert ((out[real].double() - want).abs().max() / want.abs().max()).item() <= 1e-5
    want_lse = torch.logsumexp(scores, -1)[real]
    assert (lse[real, 0].double() - want_lse).abs().max().item() <= 1e-5 * want_lse.abs().max().item() + 1e-5
    assert (out[2] == 0).all()


@needs_kernel
def test_an_extra_value_declines_outside_its_limits():
    """An extra value needs one head, query rows one wider than the stored rows (a multiple of 16), the values
    being the keys, per-token tensors [B, T], a quadratic form [2n + 3] given alone; otherwise None."""
    k = torch.randn(3, 5, 48)
    ones = torch.ones(3, 5)
    quad = torch.ones(2 * 48 + 3)
    q49, q48, q2 = torch.randn(1, 1, 4, 49), torch.randn(1, 1, 4, 48), torch.randn(1, 2, 4, 25)
    with torch.inference_mode():
        assert attend_native(q49, k, k, None, 1.0, extra=ones) is not None
        assert attend_native(q49, k, k, None, 1.0, quad=quad) is not None
        assert attend_native(q48, k, k, None, 1.0, extra=ones) is None  # no coefficient for the value
        assert attend_native(q2, k, k, None, 1.0, extra=ones) is None
        assert attend_native(q49, k, k.clone(), None, 1.0, extra=ones) is None
        assert attend_native(q49, k, k, None, 1.0, extra=ones[:, :4]) is None
        assert attend_native(q49, k, k, None, 1.0, key_scale=ones[:2]) is None
        assert attend_native(q49, k[..., :40], k[..., :40], None, 1.0, extra=ones) is None
        assert attend_native(q49, k, k, None, 1.0, extra=ones, quad=quad) is None
        assert attend_native(q49, k, k, None, 1.0, quad=quad[:-1]) is None
        assert attend_native(q49, k, k, None, 1.0, quad=quad, key_scale=ones) is None
        assert (
            attend_native(q49.expand(3, -1, -1, -1), k, k, None, 1.0, extra=ones) is None
        )  # rows per document


@needs_kernel
@pytest.mark.parametrize(
    "opts",
    [
        {"compress": 0},
        {"compress": 0, "sim": True},
        {"compress": 16},
        {"compress": 16, "sim": True},
        {"compress": 48},
    ],
    ids=str,
)
@pytest.mark.parametrize("stored", ["float16", "int8"])
def test_prettr_last_layer_scores_equal_the_pytorch_path(head32_base, texts, opts, stored, monkeypatch):
    """PreTTR at l = L − 1 from stored fields: [CLS]'s folded rows over the stored states (no compressor), over
    the folded decompression (e <= n / 2), or over each block's decompressed states (e = 48 > n / 2), through the
    kernel, with the query tokens' part merged after by log-sum-exps, give the scores of the PyTorch blocks (1e-5 relative to the score spread)."""
    ranker = init_ranker("prettr", base=head32_base, max_doc_len=48, layer=2, **opts)
    if opts["compress"]:  # a LayerNorm that is not the identity
        g = torch.Generator().manual_seed(4)
        with torch.no_grad():
            ranker.decompressor_norm.weight.copy_(torch.rand(ranker.config.hidden, generator=g) + 0.5)
            ranker.decompressor_norm.bias.copy_(torch.randn(ranker.config.hidden, generator=g) * 0.1)
    queries, docs = texts
    fields, mask = _stored_fields(ranker, docs, stored)
    mask[5, 1:] = False  # a document of one token
    calls: list[int] = []

    def counted(*args, **kwargs):
        out = attend_native(*args, **kwargs)
        calls.append(out is not None)
        return out

    monkeypatch.setattr("aheadrank.kernels.attention.native", counted)
    with torch.inference_mode():
        qs = ranker.encode_query(queries[1])
        fast = ranker.score_batch(qs, fields, mask)
        assert calls and all(calls)
        monkeypatch.setenv("AHEADRANK_NATIVE", "0")
        slow = ranker.score_batch(qs, fields, mask)
    spread = (slow.max() - slow.min()).clamp(min=1e-6)
    assert ((fast - slow).abs().max() / spread).item() <= 1e-5


def _decompression_not_the_identity(ranker, seed: int = 4) -> None:
    """Wd's outputs offset from each other (rows far from zero mean), bd, γ and β random: what the fold must undo."""
    g = torch.Generator().manual_seed(seed)
    n = ranker.config.hidden
    with torch.no_grad():
        ranker.decompressor.bias.copy_(torch.randn(n, generator=g) * 2 + 3)
        ranker.decompressor.weight.add_(torch.randn(n, 1, generator=g) * 0.5)
        ranker.decompressor_norm.weight.copy_(torch.rand(n, generator=g) + 0.5)
        ranker.decompressor_norm.bias.copy_(torch.randn(n, generator=g) * 0.1)


@pytest.mark.parametrize("sim", [False, True])
@pytest.mark.parametrize("stored", ["float16", "int8"])
@pytest.mark.parametrize("canonical", [False, True])
def test_prettr_decompression_folded_equals_decompressing(
    head32_base, texts, sim, stored, canonical, monkeypatch
):
    """PreTTR at l = L − 1 with e ≤ n/2 scores over r with the decompression folded away (context_folded:
    G's quadratic form for σ — in the kernel where the stored basis makes G diagonal, else by its GEMM —, the
    LayerNorm's centring in the weights, keys [r/σ, 1/σ], the value map folded into the map back); the same
    scores as decompressing each block and attending over ŝ (1e-5 of the spread), with rows far from zero mean,
    by the kernel and by the reference (with the kernels switched off)."""
    ranker = init_ranker("prettr", base=head32_base, max_doc_len=48, layer=2, compress=16, sim=sim)
    _decompression_not_the_identity(ranker)
    if canonical:
        assert ranker.canonicalize_basis()
    queries, docs = texts
    fields, mask = _stored_fields(ranker, docs, stored)
    mask[5, 1:] = False
    folds: list[bool] = []
    real = ranker.context_folded

    def counted(*args, **kwargs):
        out = real(*args, **kwargs)
        folds.append(out is not None)
        return out

    monkeypatch.setattr(ranker, "context_folded", counted)
    with torch.inference_mode():
        qs = ranker.encode_query(queries[0])
        folded = ranker.score_batch(qs, fields, mask)
        assert folds == [True]
        assert (ranker.__dict__["_fold"][1].quad is not None) == canonical
        monkeypatch.setattr(ranker, "folds", lambda n: False)  # decompressing
        decompressed = ranker.score_batch(qs, fields, mask)
    spread = (decompressed.max() - decompressed.min()).clamp(min=1e-6)
    assert ((folded - decompressed).abs().max() / spread).item() <= 1e-5


@needs_kernel
def test_the_decompression_fold_follows_the_weights(head32_base, texts):
    """The fold's constants are made again when Wd, bd, γ or β change in place (an optimiser step, a loaded state
    dict), and a pickled or copied ranker carries none of them."""
    import copy
    import pickle

    ranker = init_ranker("prettr", base=head32_base, max_doc_len=48, layer=2, compress=16, sim=True).eval()
    queries, docs = texts
    fields, mask = _stored_fields(ranker, docs, "float16")
    with torch.inference_mode():
        qs = ranker.encode_query(queries[1])
        before = ranker.score_batch(qs, fields, mask)
    fold = ranker.__dict__["_fold"][1]
    _decompression_not_the_identity(ranker, seed=9)
    with torch.inference_mode():
        after = ranker.score_batch(qs, fields, mask)
        assert ranker.__dict__["_fold"][1] is not fold
        want = ranker.upper(qs["q"], qs.mask, ranker.decompress(fields["doc"].float()), mask, qs["q_pool"])
    assert not torch.allclose(before, after)
    spread = (want.max() - want.min()).clamp(min=1e-6)
    assert ((after - want).abs().max() / spread).item() <= 1e-5
    assert "_fold" not in copy.deepcopy(ranker).__dict__
    assert "_fold" not in pickle.loads(pickle.dumps(ranker)).__dict__


def test_without_the_kernels_the_fold_runs_on_the_reference(head32_base, texts, monkeypatch):
    """With the compiled kernels off, PreTTR takes the same path (the decompression folded away, its attention
    by the reference of ``aheadrank.kernels.attention.attend``) and the scores equal the decompress-then-attend
    formula's."""
    ranker = init_ranker("prettr", base=head32_base, max_doc_len=48, layer=2, compress=16, sim=True).eval()
    queries, docs = texts
    fields, mask = _stored_fields(ranker, docs, "float16")
    monkeypatch.setenv("AHEADRANK_NATIVE", "0")
    with torch.inference_mode():
        qs = ranker.encode_query(queries[0])
        got = ranker.score_batch(qs, fields, mask)
        want = ranker.upper(qs["q"], qs.mask, ranker.decompress(fields["doc"].float()), mask, qs["q_pool"])
    assert "_fold" in ranker.__dict__
    spread = (want.max() - want.min()).clamp(min=1e-6)
    assert ((got - want).abs().max() / spread).item() <= 1e-5


@BOTH_PATHS
@pytest.mark.parametrize("kind", ["float16", "int8"])
@pytest.mark.parametrize("same", [True, False])
def test_heads_of_32_with_more_than_16_rows_give_log_sum_exps(kind, same, attend):
    """Heads of 32 with 19 query rows (two vectors of rows) and each row's log-sum-exp per head, values that are
    the keys (widened once) or apart: all as the float64 formula."""
    g = torch.Generator().manual_seed(11)
    b, h, dh, tq, t = 5, 4, 32, 19, 40
    k, v, k64, v64 = _fields(b, t, h * dh, kind)
    if same:
        v, v64 = k, k64
    q = torch.randn(1, h, tq, dh, generator=g)
    keep = torch.rand(b, t, generator=g) > 0.3
    keep[:, 0] = True
    keep[2, 1:] = False  # a single real token
    with torch.inference_mode():
        found = attend(q, k, v, keep[:, None, None, :], 0.4, lse=True)
    assert found is not None
    out, lse = found
    kh = k64.view(b, t, h, dh).transpose(1, 2)
    scores = (0.4 * q.double() @ kh.transpose(-1, -2)).masked_fill(~keep[:, None, None, :], float("-inf"))
    want_lse = torch.logsumexp(scores, -1)  # [B, h, tq]
    assert (lse.double() - want_lse).abs().max().item() <= 1e-5 * want_lse.abs().max().item() + 1e-5
    want = (scores.softmax(-1) @ v64.view(b, t, h, dh).transpose(1, 2)).transpose(1, 2).reshape(b, tq, h * dh)
    assert ((out.double() - want).abs().max() / want.abs().max()).item() <= 1e-5
