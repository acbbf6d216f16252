"""Long documents split into passages (aheadrank/passages.py): windows of word pieces cut at word boundaries."""

from __future__ import annotations

import random

import pytest

from aheadrank.passages import PassageOptions, flatten, max_per_document, sentence_passages, split_passages


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


def test_sentence_passages_are_overlapping_windows_of_sentences_with_the_title():
    body = "Cats purr. Dogs bark loudly! Do fish sleep? Birds sing."
    assert sentence_passages("Pets", body, size=2) == [
        "Pets. Cats purr. Dogs bark loudly!",
        "Pets. Dogs bark loudly! Do fish sleep?",
        "Pets. Do fish sleep? Birds sing.",
    ]
    assert sentence_passages("", body, size=3) == [
        "Cats purr. Dogs bark loudly! Do fish sleep?",
        "Dogs bark loudly! Do fish sleep? Birds sing.",
    ]
    # lower-case sentences (Cranfield) are split too; a title ending in a stop gets no second one
    assert sentence_passages("On flow:", "the flow is slow. the wing is thin. it holds.", size=2) == [
        "On flow: the flow is slow. the wing is thin.",
        "On flow: the wing is thin. it holds.",
    ]


def test_a_short_body_is_one_passage_the_whole_document():
    assert sentence_passages("Title", "One sentence. Two.", size=2) == ["Title. One sentence. Two."]
    assert sentence_passages("", "no stop at all", size=1) == ["no stop at all"]
    with pytest.raises(ValueError, match="at least 1 sentence"):
        sentence_passages("t", "b", size=0)
