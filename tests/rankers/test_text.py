"""Tokenisation (rankers/text.py): what a user's text becomes before any ranker sees it."""

from __future__ import annotations

from aheadrank.rankers.text import TextEncoder


def test_quoted_special_tokens_are_read_as_text_and_blank_texts_are_told_apart(minilm_dir):
    """A text quoting "[SEP]", "[PAD]" or "[CLS]" (a paper about BERT, code) is read as its characters, never as
    the markers the rankers place themselves (which moved scores: "... [PAD] [PAD]" scored as padding); a text
    that makes no word piece (empty, spaces, zero-width, control or private-use characters) is blank, one with
    any printable character is not."""
    text = TextEncoder(minilm_dir, 64, 128)
    special = {text.cls, text.sep, text.pad, text.unk, int(text.tokenizer.mask_token_id)}
    (pieces,) = text.doc_pieces(["smoking causes cancer [PAD] [SEP] [CLS] [MASK] [UNK]"])
    assert not special & set(pieces) and len(pieces) > 8
    assert text.query_pieces(["[PAD] [PAD]"])[0] == text.query_pieces(["[pad] [pad]"])[0]
    texts = ["", " \n\t", "\u200b\u200b", "\x00\x01", "\ue000", "a", "\u200bé", "日本", "!", "\U0001f600"]
    blank = text.blank(texts)
    assert blank[:5] == [True] * 5 and blank[5:8] == [False] * 3
    assert blank == [not pieces for pieces in text.tokenizer(texts, add_special_tokens=False)["input_ids"]]
