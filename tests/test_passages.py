"""Long documents split into passages (aheadrank/passages.py): windows of word pieces cut at word boundaries."""

from __future__ import annotations

import random

import pytest

from aheadrank.passages import PassageOptions, flatten, max_per_document, split_passages


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from transformers import BertTokenizerFast

    return BertTokenizerFast.from_pretrained(str(minilm_dir), local_files_only=True)


def pieces(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def long_text(seed: int, words: int) -> str:
    from conftest import WORDS

    rng = random.Random(seed)
    extra = ["immunohistochemistry", "non-small-cell", "(p<0.05)", "IL-6,", "TNF-α"]
    return " ".join(rng.choice(WORDS + extra) for _ in range(words))


def test_a_text_that_fits_is_one_passage(tokenizer):
    text = "Smoking and lung cancer: a cohort study."
    assert split_passages(tokenizer, [text], PassageOptions(window=64)) == [[text]]


@pytest.mark.parametrize(("window", "overlap"), [(16, 4), (64, None), (32, 0)])
def test_passages_fit_the_window_overlap_and_cover_the_text(tokenizer, window, overlap):
    opts = PassageOptions(window=window, overlap=overlap, max_passages=None)
    for seed in range(5):
        text = long_text(seed, 300)
        [passages] = split_passages(tokenizer, [text], opts)
        assert len(passages) > 1
        ids = pieces(tokenizer, text)
        at, prev = 0, -1
        for p in passages:
            got = pieces(tokenizer, p)  # a passage tokenizes to the document's own pieces
            assert 0 < len(got) <= window
            start = next(i for i in range(prev + 1, len(ids)) if ids[i : i + len(got)] == got)
            assert start <= at  # consecutive passages overlap (or touch): no piece is left out
            at, prev = start + len(got), start
            assert p in text
        assert at == len(ids)  # the last passage ends the document
        assert text.startswith(passages[0]) and text.endswith(passages[-1])


def test_max_passages_and_max_pieces(tokenizer):
    text = long_text(7, 400)
    [capped] = split_passages(tokenizer, [text], PassageOptions(window=32, max_passages=3))
    [every] = split_passages(tokenizer, [text], PassageOptions(window=32, max_passages=None))
    assert capped == every[:3] and len(every) > 3
    [head] = split_passages(tokenizer, [text], PassageOptions(window=256, max_pieces=20))
    assert len(head) == 1 and text.startswith(head[0]) and len(pieces(tokenizer, head[0])) <= 20
    with pytest.raises(ValueError):
        PassageOptions(window=16, overlap=16)


def test_max_per_document():
    flat, owner = flatten([["a", "b"], ["c"], ["d", "e", "f"]])
    assert flat == list("abcdef") and owner == [0, 0, 1, 2, 2, 2]
    assert max_per_document([0.1, 0.5, -1.0, 0.3, 0.9, 0.2], owner, 3) == [0.5, -1.0, 0.9]


def test_aggregations():
    from aheadrank.passages import aggregate

    owner = [0, 0, 0, 1]
    scores = [0.2, 0.8, 0.5, -1.0]
    assert aggregate(scores, owner, 2, "maxp") == [0.8, -1.0]
    assert aggregate(scores, owner, 2, "meanp") == pytest.approx([0.5, -1.0])
    assert aggregate(scores, owner, 2, "first+max") == pytest.approx([0.5, -1.0])
    with pytest.raises(ValueError, match="unknown passage aggregation"):
        aggregate(scores, owner, 2, "sum")


def test_the_head_options_cut_as_the_split_does_and_do_not_split():
    """What a long text's dense prior reads under max_tokens_per_doc: the cut text, whole."""
    assert PassageOptions(128).head() is None
    assert PassageOptions(128, 32, 10, 300).head() == PassageOptions(300, 0, 1, 300)
