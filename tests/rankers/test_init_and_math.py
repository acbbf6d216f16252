"""BERT-weight-assisted initialisation copies what it claims; PreTTR compressor and TK kernels by hand."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch
from aheadrank.rankers import init_ranker
from aheadrank.rankers.base_model import load_base
from aheadrank.rankers.checkpoint import build_ranker
from aheadrank.rankers.config import RankerConfig
from aheadrank.rankers.tk import (
    KERNEL_MU,
    KERNEL_SIGMA,
    cosines,
    kernel_features,
    kernel_features_reference,
)

from aheadrank.errors import CheckpointError


def assert_copied(module: torch.nn.Module, sd: dict[str, torch.Tensor], prefix: str) -> int:
    """Every tensor of module equals the base tensor at prefix + name; returns how many were checked."""
    n = 0
    for name, value in module.state_dict().items():
        assert torch.equal(value, sd[prefix + name]), f"{name} != base {prefix + name}"
        n += 1
    return n


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("ibs", [1, 2, 4])
def test_mores_initialisation_copies_base_layers(tiny_base, ibs, tied):
    _, sd = load_base(tiny_base)
    r = init_ranker("mores", base=tiny_base, ibs=ibs, tied=tied)
    L = 4
    checked = 0
    emb = {k: v for k, v in sd.items() if k != "embeddings.position_ids"}
    checked += assert_copied(r.doc_encoder.embeddings, emb, "embeddings.")
    for i in range(L):  # document module: copy A, all L layers
        checked += assert_copied(r.doc_encoder.layer[i], sd, f"encoder.layer.{i}.")
    assert len(r.query_encoder.layer) == (L if tied else L - ibs)
    for i in range(L - ibs):  # query module: the first L-K layers
        checked += assert_copied(r.query_encoder.layer[i], sd, f"encoder.layer.{i}.")
    assert (r.query_encoder is r.doc_encoder) == tied
    for k, ib in enumerate(r.ibs):  # IB k: layer L-K+k; cross-attention = that layer's self-attention
        src = f"encoder.layer.{L - ibs + k}."
        checked += assert_copied(ib.layer, sd, src)
        checked += assert_copied(ib.cross, sd, src + "attention.")
        # copies, not shared storage: training the cross-attention must not move the self-attention
        assert ib.cross.self.query.weight.data_ptr() != ib.layer.attention.self.query.weight.data_ptr()
    assert checked > 16 * L


def test_other_rankers_initialisation(tiny_base):
    _, sd = load_base(tiny_base)
    emb = {k: v for k, v in sd.items() if k != "embeddings.position_ids"}
    for kind, opts in (("bert", {}), ("prettr", {"layer": 2, "compress": 8})):
        r = init_ranker(kind, base=tiny_base, **opts)
        assert_copied(r.encoder.embeddings, emb, "embeddings.")
        for i, layer in enumerate(r.encoder.layer):
            assert_copied(layer, sd, f"encoder.layer.{i}.")
    tk = init_ranker("tk", base=tiny_base, tk_heads=4)
    table = sd["embeddings.word_embeddings.weight"]
    scale = tk.embeddings.weight.norm(dim=1).mean() / table.norm(dim=1).mean()
    torch.testing.assert_close(tk.embeddings.weight, table * scale)  # the same table, rescaled to norm √n
    assert tk.embeddings.weight.norm(dim=1).mean().item() == pytest.approx(32**0.5, rel=1e-4)
    tk = init_ranker(
        "tk", base=tiny_base, tk_layers=2, tk_base=True
    )  # the base's own shape, embedding, layers
    bert_cfg, _ = load_base(tiny_base)
    assert (tk.config.tk_heads, tk.config.tk_ffn) == (
        bert_cfg["num_attention_heads"],
        bert_cfg["intermediate_size"],
    )
    assert_copied(tk.embeddings, emb, "embeddings.")
    for i, layer in enumerate(tk.layers):
        assert_copied(layer, sd, f"encoder.layer.{i}.")
    with pytest.raises(CheckpointError, match="tk_base takes the base's layers"):
        init_ranker("tk", base=tiny_base, tk_base=True, tk_heads=2)


def test_mores_on_real_minilm_depth(minilm_dir):
    """L comes from the base (6 for MiniLM), not a hard-coded 12."""
    r = init_ranker("mores", ibs=2)
    assert r.config.n_layers == 6 and len(r.doc_encoder.layer) == 6 and len(r.query_encoder.layer) == 4
    _, sd = load_base(minilm_dir)
    assert_copied(r.ibs[1].cross, sd, "encoder.layer.5.attention.")


def test_prettr_compressor_round_trip_by_hand(tiny_base):
    r = init_ranker("prettr", base=tiny_base, layer=2, compress=2)
    n = r.config.hidden
    wc = np.zeros((2, n), np.float32)
    wc[0, 0], wc[1, 1], wc[1, 2] = 1.0, 2.0, -1.0
    bc = np.array([0.5, 0.0], np.float32)
    wd = np.zeros((n, 2), np.float32)
    wd[0, 0], wd[1, 1], wd[2, 0] = 1.0, 1.0, -3.0
    bd = np.zeros(n, np.float32)
    bd[3] = 0.25
    with torch.no_grad():
        r.compressor.weight.copy_(torch.from_numpy(wc))
        r.compressor.bias.copy_(torch.from_numpy(bc))
        r.decompressor.weight.copy_(torch.from_numpy(wd))
        r.decompressor.bias.copy_(torch.from_numpy(bd))
        r.stored_basis.copy_(torch.eye(2))  # the maps above are written in r's own basis
    s = np.zeros((1, 1, n), np.float32)
    s[0, 0, :3] = [1.0, 0.5, 2.0]
    # r = GELU(s·Wc + bc): pre = [1 + 0.5, 2*0.5 - 2] = [1.5, -1.0]
    gelu = lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    expected_r = np.array([gelu(1.5), gelu(-1.0)], np.float32)
    got_r = r.compress(torch.from_numpy(s))
    np.testing.assert_allclose(got_r[0, 0].detach().numpy(), expected_r, rtol=1e-6)
    # ŝ = LN(r·Wd + bd) with LN weight 1, bias 0
    y = np.zeros(n, np.float64)
    y[0], y[1], y[2], y[3] = expected_r[0], expected_r[1], -3 * expected_r[0], 0.25
    eps = r.config.bert["layer_norm_eps"]
    expected_s = (y - y.mean()) / np.sqrt(y.var() + eps)
    got_s = r.decompress(got_r)
    np.testing.assert_allclose(got_s[0, 0].detach().numpy(), expected_s, rtol=1e-5, atol=1e-6)
    assert r.field_dims() == {"doc": 2}


def test_prettr_without_compressor_stores_hidden_states(tiny_base):
    r = init_ranker("prettr", base=tiny_base, layer=2, compress=0)
    assert not hasattr(r, "compressor") and r.field_dims() == {"doc": r.config.hidden}
    x = torch.randn(2, 3, r.config.hidden)
    assert torch.equal(r.decompress(r.compress(x)), x)


def test_prettr_attention_mse_is_zero_without_loss_and_trains(tiny_base):
    r = init_ranker("prettr", base=tiny_base, layer=2, compress=4).train(False)
    q_ids, q_mask = torch.tensor([[101, 2054, 102]]), torch.ones(1, 3, dtype=torch.bool)
    d_ids, d_mask = torch.tensor([[7592, 2088, 2003, 102]]), torch.ones(1, 4, dtype=torch.bool)
    loss = r.attention_mse(q_ids, q_mask, d_ids, d_mask)
    assert loss.item() > 0
    loss.backward()
    assert r.compressor.weight.grad is not None and r.compressor.weight.grad.abs().sum() > 0
    assert r.encoder.layer[0].attention.self.query.weight.grad is None  # lower layers frozen (eq. 2)


def test_tk_kernels_by_hand():
    # one query term, two document terms (cosines 1.0 and 0.5) plus a padded slot
    match = torch.tensor([[[1.0, 0.5, 0.9]]])
    q_mask = torch.tensor([[True]])
    d_mask = torch.tensor([[True, True, False]])
    mu = torch.tensor(KERNEL_MU)
    log_feat, len_feat = kernel_features(match, q_mask, d_mask, mu, 0.1)
    per = [math.exp(-((1.0 - m) ** 2) / 0.02) + math.exp(-((0.5 - m) ** 2) / 0.02) for m in KERNEL_MU]
    exp_log = [math.log(max(p, 1e-10)) * 0.01 for p in per]
    exp_len = [p / 2 for p in per]
    # the chained stage builds every kernel from the anchor e^{-(m-0.1)²/2σ²}, whose float32 exponent (up to
    # -60) carries a relative error of ~|exponent| · 2^-24 ≈ 4e-6 into Σ_j K: 4e-8 in a 0.01-scaled log
    np.testing.assert_allclose(log_feat[0].numpy(), exp_log, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(len_feat[0].numpy(), exp_len, rtol=1e-5, atol=1e-12)
    # kernel mu=1.0 sees the exact match at full weight; mu=0.5 sees the 0.5 match at full weight
    assert per[0] == pytest.approx(1.0 + math.exp(-12.5))
    assert per[3] == pytest.approx(1.0 + math.exp(-12.5))


def _adversarial_matches(b: int, tq: int, td: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Cosines over [-1, 1] with exact kernel centres, ±1, 0 and values just past ±1 (float32 cosines of unit
    vectors); documents of every length from 0 (all padding) to td, padding holding arbitrary values."""
    g = torch.Generator().manual_seed(11)
    match = torch.rand(b, tq, td, generator=g) * 2 - 1
    special = torch.tensor([*KERNEL_MU, 1.0, -1.0, 0.0, 1.0000001, -1.0000001, 0.95, -0.95])
    match.view(-1)[: special.numel() * 7] = special.repeat(7)
    match[1] = 0.8 + 0.05 * torch.rand(tq, td, generator=g)  # one document concentrated near one kernel
    lengths = torch.arange(b) % (td + 1)
    d_mask = torch.arange(td)[None, :] < lengths[:, None]
    match[~d_mask[:, None, :].expand_as(match)] = 5.0  # garbage in the padding must not count
    q_mask = torch.ones(1, tq, dtype=torch.bool)
    q_mask[0, -3:] = False
    return match, q_mask, d_mask


@pytest.mark.parametrize(
    ("b", "tq", "td"), [(40, 18, 33), (7, 5, 300), (3000, 4, 20)]
)  # 1 and several blocks
def test_tk_fused_kernels_equal_the_formula(b, tq, td):
    """The fused, blocked kernel stage against the formula (float64): every feature within 1e-4 relative to
    the feature's scale."""
    match, q_mask, d_mask = _adversarial_matches(b, tq, td)
    mu = torch.tensor(KERNEL_MU)
    with torch.inference_mode():
        fused = kernel_features(match, q_mask, d_mask, mu, KERNEL_SIGMA)
        ref = kernel_features_reference(match.double(), q_mask, d_mask, mu.double(), KERNEL_SIGMA)
    for got, want in zip(fused, ref, strict=True):
        assert got.dtype == torch.float32
        scale = want.abs().amax(0).clamp(min=1e-6)  # per kernel feature: scores are linear in them
        err = ((got.double() - want).abs() / scale).max().item()
        assert err <= 1e-4, err


def test_tk_fused_kernels_keep_scores_and_gradients(tiny_base):
    """Scores of the fused stage equal the reference formula's within 1e-4 relative; with gradients
    (training) the differentiable reference runs."""
    r = init_ranker("tk", base=tiny_base, tk_heads=4)
    torch.manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(1, 6, r.config.hidden), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(50, 40, r.config.hidden) + q[:, :1], dim=-1)
    d_mask = torch.arange(40)[None, :] < torch.randint(1, 41, (50,))[:, None]
    q_mask = torch.ones(1, 6, dtype=torch.bool)
    with torch.inference_mode():
        fast = r.kernel_score(q, q_mask, d, d_mask)
        match = q[0] @ d.transpose(1, 2)
        feats = kernel_features_reference(match, q_mask, d_mask, r.mu, KERNEL_SIGMA)
        both = torch.cat([r.dense_log(feats[0]), r.dense_len(feats[1])], -1)
        ref = r.dense_comb(both).squeeze(-1)
    assert ((fast - ref).abs().max() / ref.abs().max()).item() <= 1e-4
    m = match.clone().requires_grad_(True)
    log_feat, _ = kernel_features(m, q_mask, d_mask, r.mu, KERNEL_SIGMA)
    log_feat.sum().backward()
    assert m.grad is not None and m.grad.abs().sum() > 0


@pytest.mark.parametrize("bq", [1, 5])
def test_tk_cosines_layout_and_out(bq):
    """``cosines`` is q·dᵀ as [B, Tq, Td] (a view of [B, Td, Tq] storage), for one query broadcast over the
    documents and for one query per document, into a given buffer or a new one, with gradients when no
    buffer is given; the kernel features of that view equal those of a contiguous copy."""
    g = torch.Generator().manual_seed(3)
    q = torch.nn.functional.normalize(torch.randn(bq, 7, 24, generator=g), dim=-1)
    d = torch.nn.functional.normalize(torch.randn(5, 11, 24, generator=g), dim=-1)
    want = torch.einsum("bqn,btn->bqt", q.expand(5, -1, -1), d)
    buf = torch.empty(5, 11, 7)
    for got in (cosines(q, d), cosines(q, d, out=buf)):
        assert got.shape == (5, 7, 11) and got.stride() == (77, 1, 7)
        torch.testing.assert_close(got, want)
    assert cosines(q.clone().requires_grad_(True), d).requires_grad
    d_mask = torch.arange(11)[None, :] < torch.tensor([11, 3, 7, 1, 9])[:, None]
    q_mask = torch.ones(1, 7, dtype=torch.bool)
    mu = torch.tensor(KERNEL_MU)
    view = kernel_features(buf.transpose(1, 2), q_mask, d_mask, mu, KERNEL_SIGMA)
    dense = kernel_features(want.contiguous(), q_mask, d_mask, mu, KERNEL_SIGMA)
    for a, b in zip(view, dense, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_tk_document_vectors_are_unit_norm(tiny_base):
    r = init_ranker("tk", base=tiny_base, tk_heads=4)
    (doc,) = r.encode_documents(["insulin glucose liver"])
    np.testing.assert_allclose(doc["doc"].norm(dim=-1).numpy(), 1.0, rtol=1e-5)


@pytest.mark.parametrize(("kind", "opts"), [("mores", {"ibs": 2}), ("prettr", {"layer": 5, "compress": 0})])
def test_similarity_residual_starts_at_the_base_similarity(minilm_dir, kind, opts):
    """With ``sim`` the score head starts at zero, so an untrained split ranker orders documents by the
    base's own (mean-pooled) similarity: the on-topic document of each query first."""
    ranker = init_ranker(kind, base=minilm_dir, max_doc_len=64, sim=True, **opts)
    assert not ranker.head.weight.any() and ranker.sim.scale.item() > 0
    queries = ["aspirin lowers the risk of heart attacks", "how do yeast proteins fold"]
    docs = [
        "Daily aspirin reduced myocardial infarction in adults at high cardiovascular risk.",
        "Chaperones assist protein folding in Saccharomyces cerevisiae.",
        "The central bank raised interest rates again this quarter.",
    ]
    with torch.no_grad():
        for i, q in enumerate(queries):
            scores = ranker.score_pairs(q, docs)
            assert int(scores.argmax()) == i, (q, scores.tolist())


def test_similarity_residual_is_for_split_rankers_and_off_in_older_configs(tiny_base):
    for kind in ("bert", "tk"):
        with pytest.raises(CheckpointError, match="sim"):
            init_ranker(kind, base=tiny_base, sim=True)
    ranker = init_ranker("mores", base=tiny_base, ibs=1, sim=False)
    data = json.loads(ranker.config.to_json())
    del data["sim"]  # a config.json written before the option existed
    old = RankerConfig.from_dict(data)
    assert not old.sim and not hasattr(build_ranker(old, None), "sim")


def test_prettr_pool_map_is_fitted_to_the_bi_encoder_embedding(tiny_base):
    """fit_pool_map maps the mean of the decompressed layer-l states to the base bi-encoder's document embedding
    (least squares): after the fit the mapped vectors are closer to that embedding than before, the reported
    R² is the fit's, and the fitted map is what the split and unsplit scores use."""
    from aheadrank.rankers.base import masked_mean
    from aheadrank.rankers.text import pad

    rng = random.Random(5)
    docs = [
        " ".join(
            rng.choice(["insulin", "liver", "yeast", "protein", "fold", "bank", "rate", "heart"])
            for _ in range(rng.randint(3, 30))
        )
        for _ in range(200)
    ]
    r = init_ranker("prettr", base=tiny_base, layer=1, compress=8, max_doc_len=32, sim=True)

    def mapped_and_target():
        with torch.no_grad():
            toks = r.tokenize_documents(docs)
            ids, mask = pad(toks, "cpu")
            s = r.decompress(r.compress(r.lower(ids, mask, 1, r.doc_offset)))
            return r.pool_map(masked_mean(s, mask)).double(), r.bi_encoder_embedding(toks).double()

    before, target = mapped_and_target()
    record = r.fit_pool_map(docs)
    after, _ = mapped_and_target()
    err = lambda p: float(((p - target) ** 2).sum() / ((target - target.mean(0)) ** 2).sum())  # noqa: E731
    assert record["documents"] == 200 and record["r2"] == pytest.approx(1 - err(after), abs=1e-3)
    assert err(after) < 0.5 * err(before)
    assert r.pool_map.weight.requires_grad  # fine-tuned with the rest afterwards
    torch.nn.init.normal_(r.head.weight, std=0.2)
    with torch.no_grad():
        split = r.score(r.encode_query("insulin liver"), r.encode_documents(docs[:20]))
        np.testing.assert_allclose(
            split.numpy(), r.score_pairs("insulin liver", docs[:20]).numpy(), rtol=1e-4, atol=1e-5
        )


def test_prettr_compressor_pca_init_reconstructs_the_states(tiny_base):
    """After init_compressor_pca, decompress(compress(s)) is close to s (GELU kept in its linear range), far
    closer than a random compressor; with e = n the reconstruction is near exact."""
    from aheadrank.rankers.text import pad

    rng = random.Random(2)
    words = ["insulin", "liver", "yeast", "protein", "fold", "bank", "rate", "heart", "cell", "acid"]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 30))) for _ in range(80)]
    n = init_ranker("prettr", base=tiny_base, layer=1, compress=8).config.hidden

    def rel_error(r) -> float:
        with torch.no_grad():
            ids, mask = pad(r.tokenize_documents(docs), "cpu")
            s = r.lower(ids, mask, 1, r.doc_offset)[mask]
            return float((r.decompress(r.compress(s)) - s).norm() / s.norm())

    for e, bound in ((n // 2, 0.5), (n, 0.02)):
        r = init_ranker("prettr", base=tiny_base, layer=1, compress=e, max_doc_len=32)
        before = rel_error(r)
        record = r.init_compressor_pca(docs)
        after = rel_error(r)
        assert after < bound and after < 0.5 * before, (e, before, after)
        assert record["kind"] == "pca" and 0 < record["explained"] <= 1.0 + 1e-9
        assert r.config.extra["compressor_init"] == record


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_attention_reads_the_mean_of_the_values_off_its_own_pass(dtype, monkeypatch):
    """context_and_mean = [context; masked mean of v]: the zero query row weighs every unmasked key alike and
    no padded one, also from float16 values widened a few documents at a time and with garbage in the padding."""
    from aheadrank.rankers import blocks
    from aheadrank.rankers.base import masked_mean

    from aheadrank.kernels import stored

    monkeypatch.setattr(stored, "STORED_BLOCK_MIN_DOCS", 2)
    monkeypatch.setattr(stored, "STORED_BLOCK_VALUES", 1)
    torch.manual_seed(0)
    attn = blocks.Attention(32, 4, 1e-12, 0.0, 0.0).eval()
    b, tq, td = 5, 3, 7
    mask = torch.arange(td)[None, :] < torch.tensor([7, 1, 4, 6, 2])[:, None]
    k, v = torch.randn(b, td, 32), torch.randn(b, td, 32)
    k[~mask], v[~mask] = 1e3, -1e3  # padding the mean must not see
    k, v = k.to(dtype), v.to(dtype)
    q = attn.project_q(torch.randn(1, tq, 32))
    with torch.no_grad():
        both = attn.context_and_mean(q, (k, v), blocks.key_mask(mask))
        ctx, mean_v = both[:, :-1], both[:, -1]
        want_ctx = attn.context(q, k, v, blocks.key_mask(mask))
    assert ctx.shape == (b, tq, 32) and mean_v.shape == (b, 32)
    torch.testing.assert_close(ctx, want_ctx, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mean_v, masked_mean(v.float(), mask), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="same for every query row"):
        attn.context_and_mean(q, (k, v), torch.ones(b, 1, tq, td, dtype=torch.bool))


def test_one_row_attention_folds_the_projections_exactly():
    """A layer's [CLS]-only pass (keys and values folded into the query: Attention.one_row_context) = row 0 of
    the full layer, with padding, one query row per sequence or one broadcast over all, and the same gradients."""
    from aheadrank.rankers import blocks

    torch.manual_seed(0)
    layer = blocks.TransformerLayer(32, 4, 64, 1e-12, 0.0, 0.0).double().eval()
    x = torch.randn(3, 6, 32, dtype=torch.float64, requires_grad=True)
    mask = blocks.key_mask(torch.arange(6)[None, :] < torch.tensor([6, 2, 4])[:, None])
    full = layer(x, mask)[:, :1]
    one = layer(x, mask, rows=slice(0, 1))
    torch.testing.assert_close(one, full, rtol=1e-10, atol=1e-10)
    (g_full,) = torch.autograd.grad(full.square().sum(), x)
    (g_one,) = torch.autograd.grad(one.square().sum(), x)
    torch.testing.assert_close(g_one, g_full, rtol=1e-10, atol=1e-10)
    att = layer.attention
    row = torch.randn(1, 1, 32, dtype=torch.float64)  # one query row broadcast over the three sequences
    want = att.context(att.project_q(row), *att.project_kv(x), mask)
    torch.testing.assert_close(att.one_row_context(row, x, mask), want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("broadcast", [True, False])
def test_cross_attention_from_states_folds_the_projections_exactly(broadcast, monkeypatch):
    """MORES S1's cross-attention from the document states (Attention.folded_context: the key map folded into
    each query row, the value map after the weighted sum) = the attention over D projected to keys and values:
    several query rows, one query broadcast over all documents or one per document, padding holding garbage;
    also from float16 states widened two documents at a time, and through context_of, which projects instead
    when heads·Tq ≥ n."""
    from aheadrank.rankers import blocks

    from aheadrank.kernels import stored

    monkeypatch.setattr(stored, "STORED_BLOCK_MIN_DOCS", 2)
    monkeypatch.setattr(stored, "STORED_BLOCK_VALUES", 1)
    torch.manual_seed(0)
    att = blocks.Attention(32, 4, 1e-12, 0.0, 0.0).double().eval()
    b, tq, td = 5, 3, 7
    lengths = torch.tensor([7, 1, 4, 6, 2])
    mask = blocks.key_mask(torch.arange(td)[None, :] < lengths[:, None])
    x = torch.randn(b, td, 32, dtype=torch.float64)
    x[~mask[:, 0, 0]] = 1e3  # padding the context must not see
    q = att.project_q(torch.randn(1 if broadcast else b, tq, 32, dtype=torch.float64))
    want = att.context(q, *att.project_kv(x), mask)
    torch.testing.assert_close(att.folded_context(q, x, mask), want, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(att.context_of(q, x, mask), want, rtol=1e-10, atol=1e-10)  # 4·3 < 32: folded
    long_q = att.project_q(torch.randn(1, 9, 32, dtype=torch.float64))  # 4·9 ≥ 32: projected
    torch.testing.assert_close(
        att.context_of(long_q, x, mask), att.context(long_q, *att.project_kv(x), mask), rtol=1e-10, atol=1e-10
    )
    att32, x16 = att.float(), x.half()
    want16 = att32.context(q.float(), *att32.project_kv(x16.float()), mask)
    torch.testing.assert_close(att32.folded_context(q.float(), x16, mask), want16, rtol=1e-5, atol=1e-5)
    # a long query over float16 states: projected a block of two documents at a time, the same context
    long16 = long_q.float() if broadcast else att32.project_q(torch.randn(b, 9, 32))
    seen = []
    monkeypatch.setattr(
        blocks, "widened", lambda x, dt: (seen.append(rows) or (rows, w) for rows, w in stored.widened(x, dt))
    )
    torch.testing.assert_close(
        att32.context_of(long16, x16, mask),
        att32.context(long16, *att32.project_kv(x16.float()), mask),
        rtol=1e-5,
        atol=1e-5,
    )
    assert [r.start for r in seen] == [0, 2, 4]  # never the five documents widened at once


def test_tk_specials_reads_a_text_between_cls_and_sep_and_keeps_its_own_pieces(tiny_base, tmp_path):
    from aheadrank.rankers.checkpoint import load_ranker, save_checkpoint
    from aheadrank.rankers.text import pad

    plain = init_ranker("tk", base=tiny_base, tk_layers=2, tk_base=True)
    wrapped = init_ranker("tk", base=tiny_base, tk_layers=2, tk_base=True, tk_specials=True)
    wrapped.load_state_dict(plain.state_dict())
    text = plain._text()
    seqs = [[2000, 2001, 2002, 2003], [2004, 2005]]
    ids, mask = pad(seqs, "cpu", text.pad)
    got = wrapped.contextualize(ids, mask)
    assert got.shape == ids.shape + (plain.config.hidden,)
    assert not torch.allclose(got, plain.contextualize(ids, mask))
    assert torch.all(got[1, 2:] == 0)  # padding stays zero
    for row, seq in enumerate(seqs):
        # each row is the plain pass over [CLS] text [SEP], those two cut off
        wide, wide_mask = pad([[text.cls, *seq, text.sep]], "cpu", text.pad)
        want = plain.contextualize(wide, wide_mask)[0, 1:-1]
        torch.testing.assert_close(got[row, : len(seq)], want, rtol=1e-5, atol=1e-6)
    # the option travels with the checkpoint; off, config.json is what it was before the option existed
    save_checkpoint(wrapped, tmp_path / "on")
    save_checkpoint(plain, tmp_path / "off")
    assert json.loads((tmp_path / "on" / "config.json").read_text())["tk_specials"] is True
    assert "tk_specials" not in json.loads((tmp_path / "off" / "config.json").read_text())
    loaded = load_ranker(tmp_path / "on")
    assert loaded.config.tk_specials
    torch.testing.assert_close(loaded.contextualize(ids, mask), got)
    assert not load_ranker(tmp_path / "off").config.tk_specials
    with pytest.raises(CheckpointError, match="tk_specials reads .* it needs tk_base"):
        init_ranker("tk", base=tiny_base, tk_heads=4, tk_specials=True)
    # a document of the base's every position leaves no room for [CLS] and [SEP]
    positions = plain.config.bert["max_position_embeddings"]
    init_ranker("tk", base=tiny_base, tk_layers=2, tk_base=True, max_doc_len=positions)
    with pytest.raises(CheckpointError, match=r"\[CLS\] d \[SEP\] needs"):
        init_ranker("tk", base=tiny_base, tk_layers=2, tk_base=True, tk_specials=True, max_doc_len=positions)
