"""The split computes the same function as the unsplit model, for every ranker and option."""

from __future__ import annotations

import random

import pytest
import torch
from aheadrank.rankers import QuantizedField, init_ranker
from aheadrank.rankers.text import pad_fields
from conftest import random_text
from scipy.stats import kendalltau

CASES = [
    ("bert", {}),
    ("mores", {"ibs": 1, "pooling": "cls"}),
    ("mores", {"ibs": 2, "pooling": "cls"}),
    ("mores", {"ibs": 3, "pooling": "mean"}),
    ("mores", {"ibs": 4, "pooling": "cls"}),
    ("mores", {"ibs": 2, "pooling": "mean", "tied": True}),
    ("mores", {"ibs": 1, "pooling": "cls", "tied": True}),
    ("prettr", {"layer": 3, "compress": 8}),  # l = L-1: cached query keys/values path
    ("prettr", {"layer": 2, "compress": 16}),
    ("prettr", {"layer": 1, "compress": 0}),
    ("mores", {"ibs": 2, "pooling": "cls", "sim": True}),  # the similarity residual
    ("mores", {"ibs": 1, "pooling": "mean", "tied": True, "sim": True}),
    ("prettr", {"layer": 3, "compress": 8, "sim": True}),
    ("prettr", {"layer": 1, "compress": 0, "sim": True}),
    ("tk", {"tk_layers": 1, "tk_heads": 4}),
    ("tk", {"tk_layers": 2, "tk_heads": 2}),
    ("tk", {"tk_layers": 2, "tk_base": True}),  # the contextualisation from the base's layers
]
IDS = [f"{k}-" + "-".join(f"{a}{b}" for a, b in o.items()) for k, o in CASES]


def with_sim(kind: str, opts: dict) -> dict:
    """The case's options, the similarity residual off unless the case turns it on (it is on by default)."""
    return {"sim": False, **opts} if kind in ("mores", "prettr") else opts


def assert_close_rel(actual: torch.Tensor, expected: torch.Tensor, rel: float = 1e-4) -> None:
    """|a - e| <= rel * max|e| element-wise: relative to the scale of the scores (scores cross zero)."""
    scale = expected.abs().max().clamp(min=1e-12)
    err = ((actual - expected).abs() / scale).max().item()
    assert err <= rel, f"relative error {err:.2e} > {rel:.0e}"


def near_tie_only_discordance(a: torch.Tensor, b: torch.Tensor, ref: torch.Tensor, tol: float) -> list[tuple]:
    """Pairs ranked differently by a and b whose reference scores differ by more than tol (should be none)."""
    bad = []
    n = len(ref)
    for i in range(n):
        for j in range(i + 1, n):
            if (a[i] - a[j]) * (b[i] - b[j]) < 0 and abs(ref[i] - ref[j]) > tol:
                bad.append((i, j, float(ref[i]), float(ref[j])))
    return bad


@pytest.fixture(scope="module")
def texts():
    rng = random.Random(7)
    queries = [random_text(rng, 1, 24) for _ in range(3)]  # some exceed max_query_len=16
    docs = [random_text(rng, 1, 70) for _ in range(100)]  # mixed lengths, some truncated at 48
    return queries, docs


@pytest.mark.parametrize(("kind", "opts"), CASES, ids=IDS)
def test_split_equals_unsplit(tiny_base, texts, kind, opts):
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=48, **with_sim(kind, opts))
    if opts.get("sim"):  # the head starts at zero: give it weights so both parts of the score are compared
        torch.manual_seed(3)
        torch.nn.init.normal_(ranker.head.weight, std=0.2)
    queries, docs = texts
    for strategy in ranker.strategies:
        ranker.strategy = strategy
        stored = ranker.encode_documents(docs, batch_size=17)  # batches of mixed padding
        assert set(stored[0]) == set(ranker.field_dims())
        for doc, ids in zip(stored, ranker.tokenize_documents(docs), strict=True):
            for name, dim in ranker.field_dims().items():
                assert doc[name].shape == (len(ids), dim)
        for q in queries:
            with torch.no_grad():
                ref = ranker.score_pairs(q, docs, batch_size=23)
            got = ranker.score(ranker.encode_query(q), stored)
            assert got.dtype == torch.float32 and got.shape == (len(docs),)
            assert_close_rel(got, ref)


@pytest.mark.parametrize(("kind", "opts"), CASES, ids=IDS)
def test_float16_fields_rank_the_same(tiny_base, texts, kind, opts, record_property):
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=48, **with_sim(kind, opts))
    queries, docs = texts
    stored = ranker.encode_documents(docs)
    half = [{k: v.half() for k, v in d.items()} for d in stored]
    for q in queries:
        qs = ranker.encode_query(q)
        full, rounded = ranker.score(qs, stored), ranker.score(qs, half)
        tau = kendalltau(full.numpy(), rounded.numpy())[0]
        record_property(f"kendall_tau[{q[:20]}]", float(tau))  # a plain float: xdist sends it
        # every swapped pair must be a near-tie at float16's resolution; otherwise the rankings are identical
        tol = 2e-3 * full.abs().max().item()
        assert near_tie_only_discordance(full, rounded, full, tol) == []
        assert tau > 0.99


@pytest.mark.parametrize("sim", [False, True])
def test_mores_s1_and_s2_give_the_same_scores(tiny_base, texts, sim):
    queries, docs = texts
    ranker = init_ranker("mores", base=tiny_base, ibs=3, max_doc_len=48, sim=sim)
    by_strategy = {}
    for strategy in ("s1", "s2"):
        ranker.strategy = strategy
        stored = ranker.encode_documents(docs)
        by_strategy[strategy] = torch.stack([ranker.score(ranker.encode_query(q), stored) for q in queries])
    assert set(ranker.field_dims()) == {"k1", "v1", "k2", "v2", "k3", "v3"}
    assert_close_rel(by_strategy["s1"], by_strategy["s2"], 1e-5)


@pytest.mark.parametrize("kind", ["bert", "mores", "prettr", "tk"])
def test_padding_does_not_change_scores(tiny_base, kind):
    """A short document scores the same alone and in a batch padded by a long one."""
    opts = {"tk": {"tk_heads": 4}, "prettr": {"layer": 2, "compress": 8}}.get(kind, {})
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=48, **opts)
    short, long = "insulin glucose", " ".join(["protein binding receptor"] * 20)
    qs = ranker.encode_query("insulin levels")
    alone = ranker.score(qs, ranker.encode_documents([short]))
    together = ranker.score(qs, ranker.encode_documents([short, long]))
    assert_close_rel(together[:1], alone, 1e-5)


def test_real_minilm_split_equals_unsplit_and_float16_ranks_the_same(record_property):
    """The real packaged all-MiniLM-L6-v2 base (L = 6, n = 384): MORES 2×IB s2 and PreTTR l = 5 e = 128."""
    rng = random.Random(3)
    q = "does smoking increase the risk of lung cancer"
    docs = [random_text(rng, 5, 120) for _ in range(100)]
    for kind, opts in (("mores", {"ibs": 2}), ("prettr", {"layer": 5, "compress": 128})):
        ranker = init_ranker(kind, **opts)
        stored = ranker.encode_documents(docs)
        with torch.no_grad():
            ref = ranker.score_pairs(q, docs)
        got = ranker.score(ranker.encode_query(q), stored)
        assert_close_rel(got, ref)
        half = ranker.score(ranker.encode_query(q), [{k: v.half() for k, v in d.items()} for d in stored])
        tau = kendalltau(got.numpy(), half.numpy())[0]
        record_property(f"kendall_tau_minilm_{kind}", float(tau))
        assert near_tie_only_discordance(got, half, got, 2e-3 * got.abs().max().item()) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu(tiny_base, texts):
    queries, docs = texts
    for kind, opts in CASES[::3]:
        ranker = init_ranker(kind, base=tiny_base, max_doc_len=48, **opts)
        cpu = ranker.score(ranker.encode_query(queries[0]), ranker.encode_documents(docs))
        ranker.to("cuda")
        gpu = ranker.score(ranker.encode_query(queries[0]), ranker.encode_documents(docs))
        assert_close_rel(gpu, cpu, 1e-3)


def _on(fields: dict, device: str) -> dict:
    return {
        k: QuantizedField(v.values.to(device), v.scale.to(device))
        if isinstance(v, QuantizedField)
        else v.to(device)
        for k, v in fields.items()
    }


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize(("kind", "opts"), CASES, ids=IDS)
def test_cuda_scores_stored_dtype_fields_as_the_cpu(tiny_base, texts, kind, opts):
    """float16 and int8 (QuantizedField) fields handed to score_batch as the store hands them over, every
    strategy: on CUDA the CPU's scores (float32 compute on both, 1e-3 relative)."""
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=48, **opts)
    queries, docs = texts
    for strategy in ranker.strategies:
        ranker.strategy = strategy
        ranker.to("cpu")
        full, mask = pad_fields(ranker.encode_documents(docs[:37]), "cpu", torch.float32)
        stored = [
            {k: v.half() for k, v in full.items()},
            {k: QuantizedField.quantize(v) for k, v in full.items()},
        ]
        with torch.inference_mode():
            qs = ranker.encode_query(queries[0])
            cpu = [ranker.score_batch(qs, fields, mask) for fields in stored]
        ranker.to("cuda")
        with torch.inference_mode():
            qs = ranker.encode_query(queries[0])
            gpu = [ranker.score_batch(qs, _on(fields, "cuda"), mask.to("cuda")) for fields in stored]
        for got, want in zip(gpu, cpu, strict=True):
            assert got.device.type == "cuda"
            assert_close_rel(got.cpu(), want, 1e-3)


@pytest.mark.parametrize(("kind", "opts"), CASES, ids=IDS)
@pytest.mark.parametrize("block_values", [1, 5000, 1 << 30])  # one document a block, a few, all at once
def test_stored_dtype_fields_score_as_widened_ones(tiny_base, texts, kind, opts, block_values, monkeypatch):
    """score_batch on float16 fields as the store hands them over (computed from the stored dtype, widened
    a block at a time) = score_batch on the same values widened to float32 up front."""
    monkeypatch.setattr("aheadrank.kernels.stored.STORED_BLOCK_VALUES", block_values)
    monkeypatch.setattr("aheadrank.kernels.stored.STORED_BLOCK_MIN_DOCS", 1)  # blocks of 1 document too
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=48, **opts)
    if opts.get("sim"):
        torch.manual_seed(3)
        torch.nn.init.normal_(ranker.head.weight, std=0.2)
    queries, docs = texts
    for strategy in ranker.strategies:
        ranker.strategy = strategy
        half, mask = pad_fields(ranker.encode_documents(docs[:37]), "cpu", torch.float16)
        widened = {k: v.float() for k, v in half.items()}
        with torch.inference_mode():
            qs = ranker.encode_query(queries[0])
            got, want = ranker.score_batch(qs, half, mask), ranker.score_batch(qs, widened, mask)
        assert got.dtype == torch.float32
        assert_close_rel(got, want, 1e-5)


@pytest.mark.parametrize(("kind", "opts"), CASES, ids=IDS)
def test_int8_fields_score_as_their_dequantised_values_read_a_block_at_a_time(
    tiny_base, texts, kind, opts, monkeypatch
):
    """int8 + scales handed to score_batch as stored (QuantizedField) give the scores of the same values
    dequantised to float32 up front. Where the attention reads the stored fields themselves (MORES S2, TK,
    PreTTR at l = L-1) or projects them a block at a time (MORES S1, folded or not) they are widened a block of
    documents at a time, never all at once; where a ranker transforms the whole field first (bert's joint input,
    PreTTR's decompression) it is widened whole, once."""
    monkeypatch.setattr("aheadrank.kernels.stored.STORED_BLOCK_VALUES", 5000)
    monkeypatch.setattr("aheadrank.kernels.stored.STORED_BLOCK_MIN_DOCS", 1)
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=48, **opts)
    queries, docs = texts
    for strategy in ranker.strategies:
        ranker.strategy = strategy
        full, mask = pad_fields(ranker.encode_documents(docs[:37]), "cpu", torch.float32)
        quantized = {k: QuantizedField.quantize(v) for k, v in full.items()}
        dequantized = {k: v.to(torch.float32) for k, v in quantized.items()}
        rows_widened: list[int] = []  # the documents each widening of a QuantizedField covered, while scoring
        real = QuantizedField.widen_into

        def recorded(self, out, real=real, rows_widened=rows_widened):
            rows_widened.append(out.shape[0])
            return real(self, out)

        with torch.inference_mode():
            qs = ranker.encode_query(queries[0])
            with monkeypatch.context() as patch:
                patch.setattr(QuantizedField, "widen_into", recorded)
                got = ranker.score_batch(qs, quantized, mask)
            want = ranker.score_batch(qs, dequantized, mask)
        assert_close_rel(got, want, 1e-5)
        in_place = kind in ("tk", "mores") or (
            kind == "prettr" and ranker.config.layer == ranker.config.n_layers - 1
        )
        whole = rows_widened.count(37)
        if in_place:
            # none at all where the compiled kernels read the int8 values in place (TK with AVX-512)
            assert max(rows_widened, default=0) < 37, rows_widened
        else:
            assert whole == 1, rows_widened
