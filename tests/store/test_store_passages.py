"""The passage docids of ``passages/`` (store/passages.py): ``<docid>#p<k>``, read back whatever the docid holds."""

from __future__ import annotations

import pytest
from aheadrank.store.passages import passage_counts, passage_docid, split_passage_docid

from aheadrank.errors import StoreError


@pytest.mark.parametrize("docid", ["d1", "a#p1", "x#p", "#p0", "p#p#p12", "naïve doc"])
def test_a_passage_docid_reads_back_to_its_document(docid):
    for k in (0, 1, 12):
        assert split_passage_docid(passage_docid(docid, k)) == (docid, k)


def test_passages_must_be_consecutive_and_in_order():
    ids = [passage_docid(d, k) for d, n in (("a#p1", 3), ("b", 2)) for k in range(n)]
    assert passage_counts(ids) == {"a#p1": 3, "b": 2}
    for broken in (ids[1:], [ids[0], ids[2]], [*ids, ids[0]], [ids[0], ids[3], ids[1]]):
        with pytest.raises(StoreError, match="out of order"):
            passage_counts(broken)
    for bad in ("plain", "a#p", "a#px", "a#p01", "#p1"):
        with pytest.raises(StoreError, match="not a passage docid"):
            split_passage_docid(bad)
