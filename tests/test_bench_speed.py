"""bench/speed.py's FLOP floor counts the work each path really does, the similarity residual's included: the
query alone through the layers the residual runs, and per document its pooled mean and (PreTTR) the pool map."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from aheadrank.rankers import init_ranker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import speed  # noqa: E402


@pytest.mark.parametrize(
    ("kind", "opts"),
    [
        ("prettr", {"layer": 1, "compress": 0}),
        ("prettr", {"layer": 1, "compress": 16}),
        ("mores", {"ibs": 1}),
    ],
)
def test_the_similarity_residual_is_counted(tiny_base, kind, opts):
    with_sim = init_ranker(kind, base=tiny_base, sim=True, **opts)
    without = init_ranker(kind, base=tiny_base, sim=False, **opts)
    if kind == "mores":
        with_sim.strategy = without.strategy = "s2"
    c = with_sim.config
    n, f, L = c.hidden, int(c.bert["intermediate_size"]), c.n_layers
    tq, td = 10, 40
    a, b = (speed.count_flops(r, tq, td, n_docs=7, n_chunks=2) for r in (with_sim, without))
    layer = speed.layer_flops(tq, n, f)
    if kind == "mores":
        assert a["query_side"] - b["query_side"] == c.ibs * layer + speed.lin(1, n, n)
        assert a["per_doc"] - b["per_doc"] == 2 * td * n + speed.lin(1, n, n)
    else:
        assert a["query_side"] - b["query_side"] == (L - c.layer) * layer
        e = c.compress
        width = -(-(e + 1) // 64) * 64
        folded = c.layer == L - 1 and e and e <= 0.5 * n
        mean = 2 * td * width + speed.lin(1, e, n) if folded else 2 * td * n
        assert a["per_doc"] - b["per_doc"] == mean + speed.lin(1, n, n)
    assert a["total"] == a["query_side"] + 2 * a["per_chunk"] + 7 * a["per_doc"]


def test_the_memory_floor_counts_the_real_tokens_stored_bytes():
    """bytes_read: float16 2 bytes a value, int8 1 byte a value and a 4-byte scale per token, over the real
    tokens only; finish_rows' memory floor is those bytes at the read rate, and × roofline is against the larger
    floor."""
    import torch
    from aheadrank.rankers import QuantizedField

    mask = torch.tensor([[True, True, False], [True, False, False]])  # 3 real tokens
    half = {"k1": torch.zeros(2, 3, 8, dtype=torch.float16), "v1": torch.zeros(2, 3, 8, dtype=torch.float16)}
    assert speed.bytes_read(half, mask) == 3 * 2 * (2 * 8)
    quant = {k: QuantizedField.quantize(v.float() + 1) for k, v in half.items()}
    assert speed.bytes_read(quant, mask) == 3 * 2 * (8 + 4)
    row = {
        "kind": "mores",
        "d_pieces": 128,
        "ms_median": 30.0,
        "ms_min": 29.0,
        "query_ms_median": 3.0,
        "bytes_read_per_query": 2_000_000_000,  # 2 GB at 20 GB/s: a 100 ms memory floor
        "flops": {"total": 10**9, "query_side": 10**8, "per_chunk": 0, "per_doc": 0, "exp_per_query": 0},
    }
    speed.finish_rows([row], gflops=100.0, exp_rate=1.0, read_gbps=20.0)
    assert row["floor_ms"] == pytest.approx(10.0) and row["memory_floor_ms"] == pytest.approx(100.0)
    assert row["x_roofline"] == pytest.approx(0.3)
