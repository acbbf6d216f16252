"""bench/quant_effect.py's simulated 4-bit stores: the values a 4-bit store would give back (levels −7..7 times
the token's float16 scale, or the dimension's clipped one), written as a float16 store that the scoring paths read
as any other, and the bytes per token such a store would take."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from aheadrank.store import StoreReader, StoreSpec, StoreWriter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import quant_effect  # noqa: E402


def test_int4_token_values_are_levels_of_the_tokens_scale():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(50, 32, generator=g) * torch.linspace(0.1, 10, 50)[:, None]
    got = quant_effect.int4_values(x, "int4-token", None).float()
    scale = (x.abs().amax(-1, keepdim=True) / 7).half().float()
    levels = got / scale
    assert (levels.abs() <= 7 + 1e-2).all()
    assert (levels - levels.round()).abs().max() < 2e-2  # the float16 rounding of level × scale
    assert ((got - x).abs() <= scale / 2 * 1.01 + 1e-6).all()  # within half a step of the value


def test_int4_dim_values_clip_to_the_dimensions_scale():
    x = torch.tensor([[1.0, -4.0], [20.0, 2.0], [-3.0, 0.5]])
    scale = torch.tensor([0.5, 0.5])  # levels of 0.5, clipped at ±3.5
    got = quant_effect.int4_values(x, "int4-dim", scale).float()
    assert torch.equal(got, torch.tensor([[1.0, -3.5], [3.5, 2.0], [-3.0, 0.5]]))


def test_simulated_stores_hold_the_values_and_count_4_bit_bytes(tmp_path):
    spec = StoreSpec(fields={"doc": 32}, fingerprint="f" * 16, ranker_kind="prettr")
    rng = np.random.default_rng(0)
    docs = {f"d{i}": (rng.normal(size=(3 + i % 17, 32)) * (1 + i % 3)).astype(np.float16) for i in range(40)}
    with StoreWriter(tmp_path / "src", spec) as writer:
        for docid, v in docs.items():
            writer.add(docid, {"doc": v})
    for mode, per_token in (("int4-token", 32 / 2 + 2), ("int4-dim", 32 / 2)):
        seconds, got_per_token = quant_effect.simulate_int4(tmp_path / "src", tmp_path / mode, mode)
        assert got_per_token == per_token and seconds > 0
        with StoreReader(tmp_path / mode) as reader:
            assert sorted(reader.docids()) == sorted(docs)
            fetched = reader.fetch(["d5"])
            v = fetched.fields["doc"][0, : int(fetched.lengths[0])]
        assert v.shape == docs["d5"].shape and v.dtype == np.float16
        if mode == "int4-token":
            want = quant_effect.int4_values(torch.as_tensor(docs["d5"]), mode, None).numpy()
            assert np.array_equal(v, want)
        assert quant_effect.simulate_int4(tmp_path / "src", tmp_path / mode, mode) == (0.0, per_token)  # kept


def test_more_bits_per_dimension_give_finer_levels_and_count_their_bytes(capsys):
    """intB-dim: levels ±(2^(B-1) - 1) of the dimension's scale, dim·B/8 bytes per token; anything but 2-7 bits
    and token / dim is refused."""
    assert quant_effect.mode_bits("int6-dim") == (6, 31, False)
    assert quant_effect.mode_bits("int4-token") == (4, 7, True)
    assert quant_effect.sim_bytes_per_token({"doc": 128}, "int6-dim") == 96
    assert quant_effect.sim_bytes_per_token({"doc": 128, "k": 64}, "int5-token") == 80 + 2 + 40 + 2
    for bad in ("int8-dim", "int4-row", "int1-dim"):
        with pytest.raises(ValueError):
            quant_effect.mode_bits(bad)
    x = torch.tensor([[0.26, -4.0], [0.74, 0.1]])
    scale = torch.tensor([0.1, 0.1])  # 6 bits: 31 levels of 0.1, clipped at ±3.1
    got = quant_effect.int4_values(x, "int6-dim", scale).float()
    want = torch.tensor([[0.3, -3.1], [0.7, 0.1]]).half().float()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-3)
    with pytest.raises(SystemExit):
        quant_effect.parse_args(["--case", "a", "b", "c", "--collection", "x", "--candidates", "y", "--work", "w",
                                 "--dim-bits", "8"])  # fmt: skip
    assert "argument --dim-bits: invalid choice: 8" in capsys.readouterr().err


def test_codebook_settings_give_back_each_values_nearest_level(tmp_path, capsys):
    """intB-book: per dimension 2^B levels fitted to the sample (store.quant.fit_codebooks), dim·B/8 bytes per
    token; the simulated store holds each value's nearest level, and a real codebook store (requantise with
    dtype=book4) gives back the same values when its one shard fits the same sample."""
    assert quant_effect.mode_bits("int3-book") == (3, 8, False)
    assert quant_effect.sim_bytes_per_token({"doc": 128}, "int2-book") == 32
    rng = np.random.default_rng(0)
    docs = {
        f"d{i}": (rng.standard_normal((int(rng.integers(1, 9)), 8)) * 2 + 5).astype(np.float32)
        for i in range(30)
    }
    spec = StoreSpec(fields={"doc": 8}, fingerprint="f", ranker_kind="prettr", max_doc_len=8, shard_size=64)
    with StoreWriter(tmp_path / "src", spec) as writer:
        for docid, x in docs.items():
            writer.add(docid, {"doc": x})
    _, per_token = quant_effect.simulate_int4(tmp_path / "src", tmp_path / "sim", "int4-book")
    assert per_token == 4
    quant_effect.requantise(tmp_path / "src", tmp_path / "real", dtype="book4")
    with StoreReader(tmp_path / "src") as src:
        books = quant_effect.calibration(src, "int4-book")["doc"].numpy()
    with StoreReader(tmp_path / "sim") as sim, StoreReader(tmp_path / "real") as real:
        assert real.spec.dtype == "book4"
        a, b = sim.fetch(list(docs)), real.fetch(list(docs))
    for i, docid in enumerate(docs):
        n = len(docs[docid])
        x = docs[docid].astype(np.float16).astype(np.float32)
        levels = books.astype(np.float16).astype(np.float32)  # the store holds the level rounded to float16
        nearest = np.abs(x[:, :, None] - books[None]).argmin(-1)
        want = np.take_along_axis(levels[None], nearest[..., None], axis=-1)[..., 0]
        assert np.allclose(np.abs(a.fields["doc"][i, :n].astype(np.float32) - x), np.abs(want - x), atol=1e-6)
        assert np.array_equal(a.fields["doc"][i, :n], b.fields["doc"][i, :n])
    args = ["--case", "a", "b", "c", "--collection", "x", "--candidates", "y", "--work", "w"]
    assert quant_effect.parse_args([*args, "--book-bits", "2", "4", "--store-dtypes", "book2"]).book_bits == [
        2,
        4,
    ]
    with pytest.raises(SystemExit):
        quant_effect.parse_args([*args, "--store-dtypes", "int8"])
    assert "argument --store-dtypes: invalid choice: 'int8'" in capsys.readouterr().err
