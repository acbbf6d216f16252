"""Codebook stores (``book4``, ``book2``): per shard, field and dimension a Lloyd-Max codebook, each value stored
as its nearest level's code, packed 8/bits a byte; fetched back as float16 through the shard's own codebooks."""

from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
import torch
from aheadrank.store import StoreReader, StoreWriter, read_manifest, verify_store
from aheadrank.store.quant import (
    byte_table,
    decode_codebooks,
    decode_packed,
    encode_codebooks,
    fit_codebooks,
    pack_codes,
    sample_rows,
    unpack_codes,
)
from aheadrank.store.shard import read_shard_meta
from store_testkit import build, make_docs, make_spec

from aheadrank.errors import StoreError

BOOK_FIELDS = {"k1": 8, "v1": 4}


def nearest_levels(x: np.ndarray, books: np.ndarray) -> np.ndarray:
    """Brute force: per value the level of its dimension's codebook closest to it. On a tie either level is as
    close, so the tests compare distances to the original value, not the levels themselves."""
    d = np.abs(x[..., :, None] - books[None, :, :])  # [T, dim, levels]
    return np.take_along_axis(books[None], d.argmin(-1)[..., None], axis=-1)[..., 0]


def test_lloyd_max_reaches_the_known_gaussian_optimum():
    """The MSE-optimal 4-level / 16-level quantiser of a unit Gaussian has distortion 0.1175 / 0.009497 (Max 1960);
    a large sample gets within 3 % of it, with each level the mean of the values nearest to it."""
    x = np.random.default_rng(0).standard_normal((200_000, 2)).astype(np.float32) * [1.0, 3.0] + [0.0, 5.0]
    for bits, optimum in ((2, 0.1175), (4, 0.009497)):
        books = fit_codebooks(x, bits)
        assert books.shape == (2, 2**bits) and np.all(np.diff(books, axis=1) > 0)
        codes = encode_codebooks(x, books)
        y = decode_codebooks(codes, books).astype(np.float32)
        mse = ((y - x) ** 2).mean(0) / np.array([1.0, 9.0])
        assert np.all(mse < optimum * 1.03) and np.all(mse > optimum * 0.97), mse
        for d in range(2):
            for level in range(2**bits):
                mine = x[codes[:, d] == level, d]
                assert abs(mine.mean() - books[d, level]) < 1e-3 * x[:, d].std()


def test_few_distinct_values_are_kept_exactly():
    x = np.array([[1.5, -2.0], [0.25, -2.0], [1.5, 7.0], [3.0, 7.0]] * 5, np.float32)
    books = fit_codebooks(x, 2)
    assert np.array_equal(decode_codebooks(encode_codebooks(x, books), books).astype(np.float32), x)


def test_codes_are_the_nearest_levels():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((500, 6)) * 2 + 4).astype(np.float32)
    # fitted on part of the values: the rest includes values beyond the levels
    books = fit_codebooks(x[:100], 4)
    got = decode_codebooks(encode_codebooks(x, books), books).astype(np.float32)
    want = nearest_levels(x, books)
    assert np.allclose(np.abs(got - x), np.abs(want.astype(np.float16).astype(np.float32) - x), atol=2e-3)


@pytest.mark.parametrize("bits", [2, 4])
def test_packing_round_trip_and_layout(bits):
    codes = np.random.default_rng(2).integers(0, 2**bits, (7, 16)).astype(np.uint8)
    packed = pack_codes(codes, bits)
    assert packed.shape == (7, 16 * bits // 8) and packed.dtype == np.uint8
    assert np.array_equal(unpack_codes(packed, bits), codes)
    first = sum(int(codes[0, i]) << (i * bits) for i in range(8 // bits))  # low bits first
    assert packed[0, 0] == first


@pytest.mark.parametrize("bits", [2, 4])
def test_byte_table_decoding_equals_the_codebook_lookup(bits):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((300, 16)) * 3).astype(np.float32)
    books = fit_codebooks(x, bits)
    codes = encode_codebooks(x, books)
    got = decode_packed(pack_codes(codes, bits).reshape(10, 30, -1), byte_table(books, bits))
    assert got.dtype == np.float16 and got.shape == (10, 30, 16)
    assert np.array_equal(got.reshape(300, 16), decode_codebooks(codes, books))


def test_sample_rows_spreads_over_every_part():
    parts = [np.full((n, 2), i, np.float16) for i, n in enumerate([5, 1, 30, 4])]
    assert len(sample_rows(parts, limit=100)) == 40
    sample = sample_rows(parts, limit=8)
    assert sample.dtype == np.float32 and len(sample) == 8
    assert sample[0, 0] == 0 and sample[-1, 0] == 3 and 2 in sample[:, 0]


@pytest.mark.parametrize("dtype", ["book4", "book2"])
def test_store_round_trip_through_each_shards_codebooks(tmp_path, dtype):
    docs = make_docs(11, BOOK_FIELDS)
    spec = make_spec(fields=dict(BOOK_FIELDS), dtype=dtype, shard_size=4)
    build(tmp_path, spec, docs)
    bits = spec.book_bits
    manifest = read_manifest(tmp_path)
    assert [s.n_docs for s in manifest.shards] == [4, 4, 3] and verify_store(tmp_path) == []
    entry = json.loads((tmp_path / "manifest.json").read_text())["fields"][0]
    assert entry["dtype"] == "uint8" and entry["codebook"] == f"float32 [8, {2**bits}] per shard (books/k1)"
    metas = [read_shard_meta(tmp_path / s.file, spec) for s in manifest.shards]
    assert metas[0].fields["k1"].shape == (metas[0].n_tokens, 8 * bits // 8)
    assert not np.array_equal(metas[0].books["k1"], metas[1].books["k1"])  # each shard fits its own
    request = ["d10", "d0", "nope", "d5", "d3"]
    with StoreReader(tmp_path) as reader:
        got = reader.fetch(request)
        batch = reader.fetch_torch(request[:2])
    assert got.unknown == ["nope"]
    for row, docid in enumerate(got.docids):
        shard = list(docs).index(docid) // 4
        for name in BOOK_FIELDS:
            want = docs[docid][name].astype(np.float16).astype(np.float32)  # the values the writer coded
            n = len(want)
            value = got.fields[name][row, :n].astype(np.float32)
            nearest = nearest_levels(want, metas[shard].books[name]).astype(np.float16).astype(np.float32)
            assert np.allclose(np.abs(value - want), np.abs(nearest - want), atol=1e-6), (docid, name)
            assert not got.fields[name][row, n:].any()
    assert batch.fields["k1"].dtype == torch.float16
    assert torch.equal(
        batch.fields["k1"], torch.from_numpy(got.fields["k1"][:2, : batch.fields["k1"].shape[1]])
    )


def test_codebook_stores_shrink_the_bytes_per_value(tmp_path):
    docs = make_docs(200, {"k1": 64, "v1": 64}, max_len=16)
    files = {}
    for dtype in ("float16", "book4", "book2"):
        spec = make_spec(fields={"k1": 64, "v1": 64}, dtype=dtype, shard_size=200)
        build(tmp_path / dtype, spec, docs)
        m = read_manifest(tmp_path / dtype)
        meta = read_shard_meta(tmp_path / dtype / m.shards[0].file, spec)
        per_token = sum(np.prod(loc.shape) * loc.dtype.itemsize for loc in meta.fields.values()) / m.n_tokens
        assert per_token == {"float16": 256, "book4": 64, "book2": 32}[dtype]
        files[dtype] = m.n_bytes
    tokens = read_manifest(tmp_path / "book4").n_tokens
    # the files shrink by that much, less a shard's fixed costs: the codebooks (2 x 64 x 16 float32: 8 KB), each
    # dataset's page alignment (4 KB) and HDF5 headers, well under 64 KB a shard
    assert files["float16"] - files["book4"] > tokens * (256 - 64) - 64 * 1024
    assert files["book4"] - files["book2"] > tokens * (64 - 32) - 64 * 1024


def test_spec_refuses_what_a_codebook_store_cannot_hold():
    with pytest.raises(StoreError, match="not a multiple of 2"):
        make_spec(fields={"k1": 8, "v1": 5}, dtype="book4")
    with pytest.raises(StoreError, match="not a multiple of 4"):
        make_spec(fields={"k1": 6}, dtype="book2")
    with pytest.raises(StoreError, match="compression='none'"):
        make_spec(fields=dict(BOOK_FIELDS), dtype="book4", compression="zstd")
    assert make_spec(fields=dict(BOOK_FIELDS), dtype="book2").stored_width("k1") == 2


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda h5: h5["books/k1"].__setitem__((0, 0), 1e9), "not ascending"),
        (lambda h5: h5["books/k1"].__setitem__((1, 3), np.nan), "corrupt"),
        (lambda h5: h5.__delitem__("books/v1"), "without its codebooks"),
    ],
)
def test_a_shard_with_broken_codebooks_is_refused(tmp_path, damage, message):
    spec = make_spec(fields=dict(BOOK_FIELDS), dtype="book4", shard_size=8)
    build(tmp_path / "s", spec, make_docs(5, BOOK_FIELDS))
    file = next((tmp_path / "s").glob("shard-*.h5"))
    broken = tmp_path / file.name
    shutil.copy(file, broken)
    with h5py.File(broken, "r+") as h5:
        damage(h5)
    with pytest.raises(StoreError, match=message):
        read_shard_meta(broken, spec)


def test_a_book_store_is_not_continued_as_another_dtype(tmp_path):
    build(tmp_path, make_spec(fields=dict(BOOK_FIELDS), dtype="book4"), make_docs(3, BOOK_FIELDS))
    with pytest.raises(StoreError, match="dtype: 'book2' != 'book4'"):
        StoreWriter(tmp_path, make_spec(fields=dict(BOOK_FIELDS), dtype="book2"))


@pytest.mark.parametrize("bits", [2, 4])
def test_compiled_decode_equals_torchs(bits, monkeypatch):
    """store/native.py's decode (when this machine compiles it) gives the bits torch.take gives; with
    AHEADRANK_NATIVE=0 torch runs."""
    from aheadrank.store import native

    rng = np.random.default_rng(4)
    books = np.sort(rng.standard_normal((24, 2**bits)).astype(np.float32), axis=1)
    packed = rng.integers(0, 256, (5, 37, 24 * bits // 8)).astype(np.uint8)
    table = byte_table(books, bits)
    if native.library() is None:
        pytest.skip("no compiled decode on this machine")
    got = decode_packed(packed, table)
    monkeypatch.setenv("AHEADRANK_NATIVE", "0")
    assert native.library() is None
    want = decode_packed(packed, table)
    assert np.array_equal(got, want)
    assert np.array_equal(
        want.reshape(-1, 24), decode_codebooks(unpack_codes(packed, bits).reshape(-1, 24), books)
    )
