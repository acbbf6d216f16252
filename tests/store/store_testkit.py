"""Helpers shared by the store tests: deterministic random documents, small specs, fetch checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from aheadrank.store import FetchResult, StoreSpec, StoreWriter

FIELDS = {"k1": 8, "v1": 5}
COMBOS = [("none", "float16"), ("none", "int8"), ("zstd", "float16"), ("zstd", "int8")]


def make_spec(**overrides) -> StoreSpec:
    values = {
        "fields": dict(FIELDS),
        "fingerprint": "fp-test",
        "ranker_kind": "mores",
        "strategy": "s2",
        "max_doc_len": 16,
        "compression": "none",
        "dtype": "float16",
        "shard_size": 4,
        "config": {"ibs": 1},
    }
    values.update(overrides)
    return StoreSpec(**values)


def doc_fields(seed: int, fields: dict[str, int] = FIELDS, max_len: int = 16) -> dict[str, np.ndarray]:
    """One document (float32 fields of a random length in 1..max_len), a pure function of ``seed``."""
    rng = np.random.default_rng(seed)
    length = int(rng.integers(1, max_len + 1))
    return {name: (rng.standard_normal((length, dim)) * 3).astype(np.float32) for name, dim in fields.items()}


def make_docs(n: int, fields: dict[str, int] = FIELDS, max_len: int = 16, prefix: str = "d") -> dict:
    return {f"{prefix}{i}": doc_fields(1000 + i, fields, max_len) for i in range(n)}


def build(path: Path, spec: StoreSpec, docs: dict) -> Path:
    with StoreWriter(path, spec) as writer:
        for docid, fields in docs.items():
            writer.add(docid, fields)
    return path


def int8_bound(values: np.ndarray) -> np.ndarray:
    """Largest error int8 storage may make per token: half a quantisation step plus float16 rounding."""
    absmax = np.abs(values).max(axis=-1, keepdims=True)
    return absmax / 254 + np.abs(values) * 2e-3 + 1e-6


def check_fetch(
    result: FetchResult, docs: dict, request: list, dtype: str, pad_to: int | None = None
) -> None:
    """``result`` holds exactly the known requested docids, in order, with their values and zero padding."""
    known = [d for d in request if d in docs]
    assert result.docids == known
    assert result.unknown == [d for d in request if d not in docs]
    lengths = [len(next(iter(docs[d].values()))) for d in known]
    assert result.lengths.dtype == np.int64
    assert result.lengths.tolist() == lengths
    width = pad_to if pad_to is not None else max(lengths, default=0)
    mask = result.mask
    assert mask.shape == (len(known), width)
    assert mask.sum(axis=1).tolist() == lengths
    for name, array in result.fields.items():
        assert array.dtype == np.float16
        assert array.shape == (len(known), width, next(iter(docs.values()))[name].shape[1])
        for row, docid in enumerate(known):
            want = docs[docid][name]
            got = array[row, : len(want)]
            if dtype == "float16":
                assert np.array_equal(got, want.astype(np.float16)), (docid, name)
            else:
                assert np.all(np.abs(got.astype(np.float32) - want) <= int8_bound(want)), (docid, name)
            assert not array[row, len(want) :].any(), f"padding of {docid} is not zero"
