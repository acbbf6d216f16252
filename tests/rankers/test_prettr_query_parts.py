"""PreTTR at l = L − 1 scoring stored candidates in chunks: what depends on the query alone ([CLS]'s folded rows,
its scores over the query's tokens, the folded path's constants from them) is computed once per query state and
reused by its later chunks, and computed again when a weight it was made from changes."""

from __future__ import annotations

import random

import pytest
import torch
from aheadrank.rankers import init_ranker
from aheadrank.rankers.base import QueryState
from aheadrank.rankers.text import pad_fields
from conftest import random_text


@pytest.fixture(scope="module")
def case(tiny_base):
    rng = random.Random(11)
    query, docs = random_text(rng, 2, 20), [random_text(rng, 1, 60) for _ in range(24)]
    return query, docs


def stored_chunks(ranker, docs):
    """The documents' stored fields as the store hands them over (float16), in two chunks."""
    fields = ranker.encode_documents(docs)
    return [pad_fields(part, torch.device("cpu"), torch.float16) for part in (fields[:15], fields[15:])]


def fresh(qs: QueryState) -> QueryState:
    return QueryState(qs.tensors, qs.mask)  # the same query states, nothing kept yet


# the folded path (e ≤ n / 2, a multiple of 16) and the compiled attention over the stored states
@pytest.mark.parametrize("compress", [16, 0])
def test_query_parts_are_kept_per_query_and_remade_when_weights_change(tiny_base, case, compress):
    query, docs = case
    torch.manual_seed(2)
    ranker = init_ranker("prettr", base=tiny_base, layer=3, compress=compress, sim=False, max_doc_len=64)
    torch.nn.init.normal_(ranker.head.weight, std=0.3)
    chunks = stored_chunks(ranker, docs)
    att = ranker.encoder.layer[-1].attention
    calls = []
    folded_query = att.folded_query
    att.folded_query = lambda x: calls.append(1) or folded_query(x)
    with torch.inference_mode():
        qs = ranker.encode_query(query)
        kept = [ranker.score_batch(qs, f, m) for f, m in chunks]
        assert len(calls) == 1 and "prettr_query_parts" in qs.extra  # the second chunk reused the first's
        # and the path meant ran: the folded one, or the attention over the stored states
        assert ("folded" if compress else "rows") in qs.extra["prettr_query_parts"][1]
        unkept = [ranker.score_batch(fresh(qs), f, m) for f, m in chunks]
    for a, b in zip(kept, unkept, strict=True):
        assert torch.equal(a, b)

    # a weight the parts come from changes in place (an optimiser step, a load): the same query state's next
    # chunk sees it, as a new request does
    changes = [att.self.query.weight, att.self.value.bias]
    if compress:
        changes.append(ranker.decompressor.weight)  # the folded path's constants (decompression_fold)
    for param in changes:
        with torch.no_grad():
            param.add_(0.05 * torch.randn(param.shape, generator=torch.Generator().manual_seed(3)))
        with torch.inference_mode():
            before = len(calls)
            again = ranker.score_batch(qs, *chunks[1])
            want = ranker.score_batch(fresh(qs), *chunks[1])
        assert torch.equal(again, want)
        assert not torch.equal(again, kept[1])  # the change moved the scores: the check above can fail
        # remade, not reused (the decompression's weights: only the fold's constants, not [CLS]'s rows)
        assert len(calls) == before + (1 if compress and param is ranker.decompressor.weight else 2)
        kept[1] = again
