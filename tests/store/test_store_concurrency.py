"""Concurrent fetches from many threads give exactly the serial results."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from aheadrank.store import StoreReader
from store_testkit import COMBOS, build, make_docs, make_spec


@pytest.mark.parametrize(("compression", "dtype"), COMBOS)
def test_threads_equal_serial(tmp_path, compression, dtype):
    docs = make_docs(120)
    build(tmp_path, make_spec(compression=compression, dtype=dtype, shard_size=16), docs)
    rng = random.Random(7)
    ids = list(docs)
    requests = [rng.sample(ids, rng.randint(1, 60)) + ["unknown-" + str(i)] for i in range(48)]
    with StoreReader(tmp_path) as reader:
        serial = [reader.fetch(r) for r in requests]
        with ThreadPoolExecutor(max_workers=8) as pool:
            for _ in range(2):
                parallel = list(pool.map(reader.fetch, requests))
                for want, got in zip(serial, parallel, strict=True):
                    assert got.docids == want.docids and got.unknown == want.unknown
                    assert np.array_equal(got.lengths, want.lengths)
                    for name in want.fields:
                        assert np.array_equal(got.fields[name], want.fields[name])
