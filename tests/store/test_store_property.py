"""Property test: any document lengths, docids, shard sizes and batch compositions round-trip."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from aheadrank.store import StoreReader, StoreWriter
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_testkit import COMBOS, check_fetch, make_spec

MAX_LEN = 12
docid_text = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), min_size=1, max_size=6
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, MAX_LEN), min_size=1, max_size=20),
    shard_size=st.integers(1, 7),
    combo=st.sampled_from(COMBOS),
    data=st.data(),
)
def test_any_lengths_and_batches_round_trip(lengths, shard_size, combo, data):
    compression, dtype = combo
    docids = data.draw(st.lists(docid_text, min_size=len(lengths), max_size=len(lengths), unique=True))
    rng = np.random.default_rng(len(lengths) * 31 + shard_size)
    docs = {
        d: {
            "k1": rng.standard_normal((n, 8)).astype(np.float32),
            "v1": rng.standard_normal((n, 5)).astype(np.float32),
        }
        for d, n in zip(docids, lengths, strict=True)
    }
    spec = make_spec(max_doc_len=MAX_LEN, shard_size=shard_size, compression=compression, dtype=dtype)
    with tempfile.TemporaryDirectory() as tmp:
        with StoreWriter(Path(tmp), spec) as writer:
            writer.add_many(docids, [docs[d] for d in docids])
        with StoreReader(Path(tmp)) as reader:
            assert reader.docids() == docids
            for _ in range(3):
                request = data.draw(st.lists(st.sampled_from(docids) | docid_text | st.just(""), max_size=25))
                longest = max((len(docs[d]["k1"]) for d in request if d in docs), default=0)
                pad_to = data.draw(st.none() | st.integers(longest, MAX_LEN + 3))
                check_fetch(reader.fetch(request, pad_to=pad_to), docs, request, dtype, pad_to=pad_to)
