"""Round trips through the writer and reader, for every compression and value type, and the writer's checks."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
import torch
from aheadrank.store import (
    StoreReader,
    StoreSpec,
    StoreWriter,
    read_manifest,
    verify_store,
    write_manifest,
    write_shard,
)
from store_testkit import COMBOS, FIELDS, build, check_fetch, int8_bound, make_docs, make_spec

from aheadrank.errors import StoreError


@pytest.mark.parametrize(("compression", "dtype"), COMBOS)
def test_round_trip_mixed_lengths(tmp_path, compression, dtype):
    docs = make_docs(23)
    spec = make_spec(compression=compression, dtype=dtype, shard_size=5)
    build(tmp_path, spec, docs)
    manifest = read_manifest(tmp_path)
    assert manifest.complete and [s.n_docs for s in manifest.shards] == [5, 5, 5, 5, 3]
    assert manifest.n_tokens == sum(len(d["k1"]) for d in docs.values())
    assert verify_store(tmp_path) == []
    with StoreReader(tmp_path, expected_fingerprint="fp-test", verify=True) as reader:
        assert len(reader) == 23 and reader.docids() == list(docs)
        assert "d7" in reader and "nope" not in reader
        assert reader.spec == spec
        every = list(docs)
        check_fetch(reader.fetch(every), docs, every, dtype)
        request = ["d22", "missing", "d0", "d11", "d0", "", "d3\x00"]
        check_fetch(reader.fetch(request), docs, request, dtype)
        check_fetch(reader.fetch(request, pad_to=16), docs, request, dtype, pad_to=16)


def test_int8_error_is_bounded_and_small():
    from aheadrank.store.quant import dequantize_int8, quantize_int8

    x = np.random.default_rng(0).standard_normal((50, 64)).astype(np.float32) * 5
    x[3] = 0.0
    q, scale = quantize_int8(x)
    y = dequantize_int8(q, scale).astype(np.float32)
    assert np.all(np.abs(y - x) <= int8_bound(x))
    assert not y[3].any()
    assert np.abs(y - x).max() < np.abs(x).max() / 100


def test_fetch_edge_cases(tmp_path):
    docs = make_docs(6)
    build(tmp_path, make_spec(), docs)
    with StoreReader(tmp_path) as reader:
        empty = reader.fetch([])
        assert empty.docids == [] and empty.unknown == [] and empty.fields["k1"].shape == (0, 0, 8)
        none_known = reader.fetch(["x", "y"], pad_to=4)
        assert none_known.unknown == ["x", "y"] and none_known.fields["v1"].shape == (0, 4, 5)
        longest = max(len(d["k1"]) for d in docs.values())
        with pytest.raises(StoreError, match="pad_to"):
            reader.fetch(list(docs), pad_to=longest - 1)
        with pytest.raises(StoreError, match="list of docids"):
            reader.fetch("d1")
        with pytest.raises(StoreError, match="strings"):
            reader.fetch([1, 2])


def test_fetch_torch_gives_tensors_and_mask(tmp_path):
    docs = make_docs(9)
    build(tmp_path, make_spec(dtype="int8"), docs)
    with StoreReader(tmp_path) as reader:
        batch = reader.fetch_torch(["d8", "zz", "d1"], device="cpu")
        plain = reader.fetch(["d8", "zz", "d1"])
    assert batch.docids == ["d8", "d1"] and batch.unknown == ["zz"]
    assert batch.fields["k1"].dtype == torch.float16 and batch.mask.dtype == torch.bool
    assert torch.equal(batch.mask, torch.from_numpy(plain.mask))
    assert torch.equal(batch.lengths, torch.from_numpy(plain.lengths))
    for name in FIELDS:
        assert np.array_equal(batch.fields[name].numpy(), plain.fields[name])


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_fetch_torch_int8_as_stored(tmp_path, compression):
    """dequantize=False: int8 values and per-token scales as stored (0 at padding); their product is the
    dequantised field that fetch() gives (in float32, before fetch's float16 rounding)."""
    docs = make_docs(9)
    build(tmp_path, make_spec(dtype="int8", compression=compression), docs)
    with StoreReader(tmp_path) as reader:
        raw = reader.fetch_torch(["d8", "zz", "d1", "d4"], device="cpu", dequantize=False)
        plain = reader.fetch(["d8", "zz", "d1", "d4"])
    assert raw.docids == ["d8", "d1", "d4"] and set(raw.scales) == set(FIELDS)
    for name in FIELDS:
        values, scales = raw.fields[name], raw.scales[name]
        assert values.dtype == torch.int8 and scales.dtype == torch.float32
        assert scales.shape == values.shape[:2] and not scales[~raw.mask].any()
        widened = values.float() * scales[..., None]
        assert np.array_equal(widened.half().numpy(), plain.fields[name])


def test_torch_and_bfloat16_inputs(tmp_path):
    spec = make_spec(fields={"doc": 4}, shard_size=2)
    values = torch.randn(3, 4)
    with StoreWriter(tmp_path, spec) as writer:
        writer.add("a", {"doc": values})
        writer.add("b", {"doc": values.to(torch.bfloat16)})
        writer.add("c", {"doc": values.double().numpy()})
    with StoreReader(tmp_path) as reader:
        out = reader.fetch(["a", "b", "c"]).fields["doc"]
    assert np.array_equal(out[0], values.numpy().astype(np.float16))
    assert np.array_equal(out[1], values.to(torch.bfloat16).float().numpy().astype(np.float16))
    assert np.array_equal(out[2], out[0])


def test_writer_rejects_bad_documents(tmp_path):
    good = {"k1": np.zeros((3, 8)), "v1": np.zeros((3, 5))}
    with StoreWriter(tmp_path, make_spec()) as writer:
        writer.add("a", good)
        with pytest.raises(StoreError, match="duplicate docid 'a'"):
            writer.add("a", good)
        with pytest.raises(StoreError, match="missing \\['v1'\\], unexpected \\['x'\\]"):
            writer.add("b", {"k1": good["k1"], "x": good["v1"]})
        with pytest.raises(StoreError, match="'v1': shape \\(3, 6\\)"):
            writer.add("b", {"k1": good["k1"], "v1": np.zeros((3, 6))})
        with pytest.raises(StoreError, match="different lengths"):
            writer.add("b", {"k1": good["k1"], "v1": np.zeros((2, 5))})
        with pytest.raises(StoreError, match="max_doc_len=16"):
            writer.add("b", {"k1": np.zeros((17, 8)), "v1": np.zeros((17, 5))})
        with pytest.raises(StoreError, match="0 tokens"):
            writer.add("b", {"k1": np.zeros((0, 8)), "v1": np.zeros((0, 5))})
        with pytest.raises(StoreError, match="NaN"):
            writer.add("b", {"k1": np.full((3, 8), np.nan), "v1": good["v1"]})
        with pytest.raises(StoreError, match="float16 range"):
            writer.add("b", {"k1": np.full((3, 8), 1e6), "v1": good["v1"]})
        with pytest.raises(StoreError, match="expected floats"):
            writer.add("b", {"k1": np.zeros((3, 8), dtype=np.int64), "v1": good["v1"]})
        with pytest.raises(StoreError, match="non-empty string"):
            writer.add("", good)
        with pytest.raises(StoreError, match="2 docids but 1"):
            writer.add_many(["b", "c"], [good])
        writer.add("b", good)  # the failures above left nothing behind
    with StoreReader(tmp_path) as reader:
        assert reader.docids() == ["a", "b"]


def test_spec_validation_and_compatibility():
    spec = make_spec()
    assert StoreSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec
    assert spec.compatible_with(make_spec())
    other = make_spec(dtype="int8", config={"ibs": 2})
    assert not spec.compatible_with(other)
    assert len(spec.differences(other)) == 2
    for bad in (
        {"compression": "gzip"},
        {"dtype": "float32"},
        {"shard_size": 0},
        {"fields": {}},
        {"fields": {"a/b": 3}},
        {"fields": {"a": 0}},
        {"fingerprint": ""},
        {"config": {"x": object()}},
    ):
        with pytest.raises(StoreError):
            make_spec(**bad)


def test_reopen_with_other_spec_is_refused(tmp_path):
    with StoreWriter(tmp_path, make_spec()) as writer:
        for docid, fields in make_docs(5).items():
            writer.add(docid, fields)
        writer.abort()  # leaves an incomplete store with one finished shard
    with pytest.raises(StoreError, match="different spec.*dtype: 'int8' != 'float16'"):
        StoreWriter(tmp_path, make_spec(dtype="int8"))


def test_complete_store_resume_and_rebuild(tmp_path):
    docs = make_docs(10)
    build(tmp_path, make_spec(), docs)
    writer = StoreWriter(tmp_path, make_spec())  # resume=True on a complete store: nothing to do
    assert writer.num_done == 10
    with pytest.raises(StoreError, match="complete"):
        writer.add("new", docs["d0"])
    writer.close()
    assert verify_store(tmp_path) == []
    with StoreWriter(tmp_path, make_spec(), resume=False) as writer:  # start over
        assert writer.num_done == 0
        writer.add("only", docs["d0"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "shard-00000.h5"]
    with StoreReader(tmp_path) as reader:
        assert reader.docids() == ["only"]


def test_distributed_shards_and_manifest(tmp_path):
    docs = make_docs(10)
    spec = make_spec(shard_size=4)
    ids = list(docs)
    infos = [
        write_shard(tmp_path, i, spec, ids[4 * i : 4 * i + 4], [docs[d] for d in ids[4 * i : 4 * i + 4]])
        for i in (2, 0)
    ]  # out of order, shard 1 not yet done
    write_manifest(tmp_path, spec, infos, complete=False)  # a partial build may have gaps
    assert [s.index for s in read_manifest(tmp_path).shards] == [0, 2]
    with pytest.raises(StoreError, match="incomplete"):
        StoreReader(tmp_path)
    with pytest.raises(StoreError, match="0..1"):
        write_manifest(tmp_path, spec, infos, complete=True)
    infos.append(write_shard(tmp_path, 1, spec, ids[4:8], [docs[d] for d in ids[4:8]]))
    write_manifest(tmp_path, spec, infos, complete=True)
    with StoreReader(tmp_path) as reader:
        check_fetch(reader.fetch(ids[::-1]), docs, ids[::-1], "float16")
    # a docid in two shards is caught when the manifest is merged
    dup = write_shard(tmp_path, 2, spec, ["d0", "x1"], [docs["d0"], docs["d1"]])
    with pytest.raises(StoreError, match="duplicate docid 'd0'"):
        write_manifest(tmp_path, spec, [*infos[1:], dup], complete=True)
    with pytest.raises(StoreError, match="1..shard_size=4"):
        write_shard(tmp_path, 3, spec, ids[:5], [docs[d] for d in ids[:5]])


def test_same_input_gives_same_shard_bytes(tmp_path):
    docs = make_docs(4)
    spec = make_spec()
    a = write_shard(tmp_path / "a", 0, spec, list(docs), list(docs.values()))
    b = write_shard(tmp_path / "b", 0, spec, list(docs), list(docs.values()))
    assert a.sha256 == b.sha256 and a.bytes == b.bytes


def test_int8_dequantize_numpy_fallback_equals_torch(monkeypatch):
    import aheadrank.store.quant as quant

    x = np.random.default_rng(1).standard_normal((3, 300, 40)).astype(np.float32)
    q, scale = quant.quantize_int8(x.reshape(-1, 40))
    q, scale = q.reshape(3, 300, 40), scale.reshape(3, 300)
    with_torch = quant.dequantize_int8(q, scale)
    monkeypatch.setattr(quant, "load_torch", lambda: None)
    assert np.array_equal(quant.dequantize_int8(q, scale), with_torch)
    assert np.array_equal(with_torch, (q * scale[..., None]).astype(np.float16))


@pytest.mark.parametrize(("compression", "dtype"), COMBOS)
def test_gather_in_small_windows(tmp_path, monkeypatch, compression, dtype):
    from aheadrank.store import reader as store_reader

    monkeypatch.setattr(store_reader, "_STITCH", False)  # the per-shard path (platforms without it)
    monkeypatch.setattr(store_reader, "_SCRATCH_BYTES", 1)  # one document per window and shard
    docs = make_docs(17)
    build(tmp_path, make_spec(compression=compression, dtype=dtype, shard_size=3), docs)
    request = ["d16", "d0", "nope", "d5", "d5", "d9", "d1", "d12"]
    with StoreReader(tmp_path) as reader:
        assert not reader._stitched
        check_fetch(reader.fetch(request), docs, request, dtype)
        check_fetch(reader.fetch(request, pad_to=20), docs, request, dtype, pad_to=20)


@pytest.mark.skipif(sys.platform not in ("linux", "darwin"), reason="POSIX mmap")
def test_uncompressed_shards_are_stitched_into_one_array(tmp_path):
    docs = make_docs(11)
    build(tmp_path, make_spec(dtype="int8", shard_size=4), docs)
    reader = StoreReader(tmp_path)
    assert set(reader._stitched) == {("fields", "k1"), ("fields", "v1"), ("scales", "k1"), ("scales", "v1")}
    assert reader._stitched["fields", "k1"].row_start.tolist()[0] == 0
    request = ["d10", "d0", "d5"]
    before = reader.fetch(request)
    check_fetch(before, docs, request, "int8")
    reader.close()
    with pytest.raises(StoreError, match="closed"):
        reader.fetch(request)


def test_casts_without_torch_match(monkeypatch):
    import aheadrank.store.quant as quant

    x = np.random.default_rng(2).standard_normal((70, 600)).astype(np.float32) * 100
    x[0, 0] = 1e6  # overflows float16
    with_torch = quant.cast(x, np.float16)
    monkeypatch.setattr(quant, "load_torch", lambda: None)
    assert np.array_equal(quant.cast(x, np.float16), with_torch)
    assert not quant.all_finite_float16(with_torch)
    assert quant.all_finite_float16(with_torch[1:])
