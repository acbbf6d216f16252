"""Every caller scores stored fields one way: the public ``Ranker.score`` (the Python API) gives the scores of
the rerank core's ``score_stored`` (``rerank-run``, the service) for the same stored fields, bit for bit: the
stored float16 as it is, the same batches of ``SCORE_BATCH`` documents."""

from __future__ import annotations

import random

import pytest
import torch
from aheadrank.rankers import init_ranker
from aheadrank.rankers.base import SCORE_BATCH
from aheadrank.rankers.text import pad_fields
from aheadrank.store import StoreReader, StoreSpec, StoreWriter
from conftest import random_text

from aheadrank.rerank import score_stored

CASES = [
    ("bert", {}),
    ("mores", {"ibs": 2, "pooling": "cls"}),
    ("prettr", {"layer": 3, "compress": 8}),
    ("prettr", {"layer": 1, "compress": 0}),
    ("tk", {"tk_layers": 2, "tk_heads": 2}),
]
IDS = [f"{k}-" + "-".join(f"{a}{b}" for a, b in o.items()) for k, o in CASES]
N_DOCS = SCORE_BATCH + 44  # two batches, as 300 candidates are scored


@pytest.fixture(scope="module")
def texts():
    rng = random.Random(11)
    return random_text(rng, 3, 12), [random_text(rng, 1, 70) for _ in range(N_DOCS)]


def write_store(ranker, path, docids, encoded) -> None:
    spec = StoreSpec(
        fields=ranker.field_dims(),
        fingerprint="test",
        ranker_kind=ranker.kind,
        strategy=ranker.strategy,
        max_doc_len=ranker.max_doc_tokens(),
        shard_size=128,
    )
    with StoreWriter(path, spec) as writer:
        for docid, fields in zip(docids, encoded, strict=True):
            writer.add(docid, {k: v.numpy() for k, v in fields.items()})


@pytest.mark.parametrize(("kind", "opts"), CASES, ids=IDS)
def test_public_score_equals_score_stored_on_the_same_stored_fields(tiny_base, texts, tmp_path, kind, opts):
    query, docs = texts
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=48, **opts)
    if opts.get("sim", True) and kind in ("mores", "prettr"):
        torch.manual_seed(3)  # the residual's zero head would leave the interaction unread
        torch.nn.init.normal_(ranker.head.weight, std=0.2)
    docids = [f"d{i}" for i in range(len(docs))]
    for strategy in ranker.strategies:
        ranker.strategy = strategy
        path = tmp_path / f"store-{strategy}"
        write_store(ranker, path, docids, ranker.encode_documents(docs))
        with StoreReader(path) as reader:
            qs = ranker.encode_query(query)
            served, unknown = score_stored(ranker, reader, qs, docids, {"fetch": 0.0, "score": 0.0})
            fetched = reader.fetch(docids)  # the same stored fields, one dict a document (the Python API)
        stored = [
            {k: torch.from_numpy(v[row, :n]) for k, v in fetched.fields.items()}
            for row, n in enumerate(fetched.lengths.tolist())
        ]
        assert not unknown and stored[0][next(iter(stored[0]))].dtype == torch.float16
        public = ranker.score(qs, stored)
        assert public.dtype == torch.float32 and public.shape == (len(docs),)
        assert public.tolist() == [s for _, s in served], strategy


def test_public_score_hands_stored_fields_over_as_they_are(tiny_base, texts, monkeypatch):
    """float16 fields reach score_batch in float16 (no float32 copy of every candidate), in batches of
    SCORE_BATCH; float32 fields (encode_documents') in the model's float32."""
    _, docs = texts
    ranker = init_ranker("mores", base=tiny_base, max_doc_len=48, ibs=2, pooling="cls")
    calls = []
    original = ranker.score_batch

    def recording(qs, fields, mask):
        calls.append(({v.dtype for v in fields.values()}, mask.shape[0]))
        return original(qs, fields, mask)

    monkeypatch.setattr(ranker, "score_batch", recording)
    full = ranker.encode_documents(docs)
    qs = ranker.encode_query("a query")
    ranker.score(qs, [{k: v.half() for k, v in d.items()} for d in full])
    assert calls == [({torch.float16}, SCORE_BATCH), ({torch.float16}, N_DOCS - SCORE_BATCH)]
    calls.clear()
    ranker.score(qs, full)
    assert calls == [({torch.float32}, SCORE_BATCH), ({torch.float32}, N_DOCS - SCORE_BATCH)]


def test_pad_fields_refuses_documents_that_do_not_match():
    a = {"k": torch.ones(3, 4), "v": torch.ones(3, 2)}
    with pytest.raises(ValueError, match="expected"):
        pad_fields([a, {"k": torch.ones(2, 4)}], "cpu", torch.float32)
    with pytest.raises(ValueError, match="other lengths"):
        pad_fields([a, {"k": torch.ones(2, 4), "v": torch.ones(3, 2)}], "cpu", torch.float32)
    with pytest.raises(ValueError, match="no documents"):
        pad_fields([], "cpu", torch.float32)
    fields, mask = pad_fields([a, {"k": torch.ones(1, 4), "v": torch.ones(1, 2)}], "cpu", torch.float32)
    assert fields["k"].shape == (2, 3, 4) and mask.tolist() == [[True] * 3, [True, False, False]]
    assert float(fields["k"][1, 1:].abs().sum()) == 0.0


def test_prettr_scores_float32_fields_on_the_stored_path(tiny_base, texts, monkeypatch):
    """PreTTR at l = L-1 scores encode_documents' float32 fields on the path it scores stored float16 on
    (upper_from_stored) when no gradient is wanted, as MORES and TK read float32 with their stored paths."""
    from aheadrank.rankers.prettr import PrettrRanker

    query, docs = texts
    ranker = init_ranker("prettr", base=tiny_base, max_doc_len=48, layer=3, compress=8)
    used = []
    original = PrettrRanker.upper_from_stored
    monkeypatch.setattr(
        PrettrRanker, "upper_from_stored", lambda self, *a, **k: used.append(1) or original(self, *a, **k)
    )
    full = ranker.encode_documents(docs[:40])
    ranker.score(ranker.encode_query(query), full)
    assert used == [1]
    fields, mask = pad_fields(full, "cpu", torch.float32)
    with torch.enable_grad():  # training: the plain layers, which autograd can go through
        ranker.score_batch(ranker.query_state(*_query(ranker, query)), fields, mask)
    assert used == [1]


def _query(ranker, text: str):
    from aheadrank.rankers.text import pad

    return pad(ranker.tokenize_queries([text]), ranker.device, ranker._text().pad)
