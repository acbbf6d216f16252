"""Tokenisation shared by every ranker: word pieces, special tokens, padding to a batch with a mask."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

_ASCII_VISIBLE = re.compile("[!-~]")  # a printable ASCII character is always at least one word piece


class TextEncoder:
    """Wraps the checkpoint's WordPiece tokenizer; truncates queries and documents to their maximum lengths."""

    def __init__(self, path: str | Path, max_query_len: int, max_doc_len: int):
        from transformers import BertTokenizerFast

        self.path = Path(path)
        # a text quoting "[SEP]" or "[PAD]" (a paper on BERT, code) is read as its characters, not as the marker
        self.tokenizer = BertTokenizerFast.from_pretrained(
            str(path), local_files_only=True, split_special_tokens=True
        )
        self.max_query_len = max_query_len
        self.max_doc_len = max_doc_len
        self.cls = int(self.tokenizer.cls_token_id)
        self.sep = int(self.tokenizer.sep_token_id)
        self.pad = int(self.tokenizer.pad_token_id)
        self.unk = int(self.tokenizer.unk_token_id)

    def pieces(self, texts: Sequence[str], max_len: int) -> list[list[int]]:
        """Word-piece ids without special tokens, truncated; a text with no pieces becomes ``[UNK]``."""
        if isinstance(texts, str):
            raise TypeError("expected a list of texts, got one string")
        enc = self.tokenizer(
            list(texts),
            add_special_tokens=False,
            truncation=True,
            max_length=max_len,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        return [ids or [self.unk] for ids in enc]

    def blank(self, texts: Sequence[str]) -> list[bool]:
        """Whether each text makes no word piece at all: empty, spaces, or only characters the tokenizer drops
        (zero-width and other format or control characters, private-use ones...). Such a text is not scored as
        ``[UNK]``: the service refuses a blank query and ranks a blank document last. A text holding a printable
        ASCII character is not blank, without tokenizing it."""
        out = [_ASCII_VISIBLE.search(t) is None for t in texts]
        check = [i for i, maybe in enumerate(out) if maybe]
        for i, ids in zip(check, self.all_pieces([texts[i] for i in check]), strict=True):
            out[i] = not ids
        return out

    def all_pieces(self, texts: Sequence[str]) -> list[list[int]]:
        """Every word piece of each text, not truncated (to count them; no warning for a text longer than the
        model reads: saying so is the caller's business)."""
        if not texts:
            return []
        return self.tokenizer(
            list(texts),
            add_special_tokens=False,
            return_attention_mask=False,
            return_token_type_ids=False,
            verbose=False,
        )["input_ids"]

    def query_pieces(self, texts: Sequence[str]) -> list[list[int]]:
        return self.pieces(texts, self.max_query_len)

    def doc_pieces(self, texts: Sequence[str]) -> list[list[int]]:
        return self.pieces(texts, self.max_doc_len)


def pad(
    seqs: Sequence[Sequence[int]], device: torch.device | str = "cpu", value: int = 0
) -> tuple[Tensor, Tensor]:
    """Right-pad id lists into (ids [B, T] int64, mask [B, T] bool)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), value, dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.as_tensor(s, dtype=torch.long)
    mask = torch.arange(width)[None, :] < torch.tensor([len(s) for s in seqs])[:, None]
    return ids.to(device), mask.to(device)


def positions(mask: Tensor, offset: int = 0) -> Tensor:
    """Position ids 0..T-1 (+offset) for every row of a [B, T] batch."""
    return (torch.arange(mask.shape[1], device=mask.device) + offset).expand(mask.shape[0], -1)


def pad_fields(
    docs: Sequence[dict[str, Tensor]],
    device: torch.device | str,
    dtype: torch.dtype,
    keep: tuple[torch.dtype, ...] = (),
) -> tuple[dict[str, Tensor], Tensor]:
    """A list of per-document field dicts ([len, dim] each, tensors or arrays) -> padded fields [B, T, dim] +
    mask [B, T], one copy per document and field (``pad_sequence``). A field whose documents all come in one
    of the ``keep`` dtypes stays in it (the stored float16 as the store hands it over); others are in ``dtype``."""
    if not docs:
        raise ValueError("no documents to score")
    names = list(docs[0])
    for i, d in enumerate(docs):
        if set(d) != set(names):
            raise ValueError(f"document {i} has fields {sorted(d)}, expected {sorted(names)}")
    lengths: list[int] = []
    out = {}
    for name in names:
        rows = [torch.as_tensor(d[name]) for d in docs]
        if not lengths:
            lengths = [int(r.shape[0]) for r in rows]
        elif [int(r.shape[0]) for r in rows] != lengths:
            raise ValueError(f"field {name!r} has other lengths than field {names[0]!r}")
        same = all(r.dtype == rows[0].dtype for r in rows)
        want = rows[0].dtype if same and rows[0].dtype in keep else dtype
        out[name] = pad_sequence([r.to(want) for r in rows], batch_first=True).to(device)
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    return out, mask.to(device)
