"""Text digests: how a document's text is recognised when a client sends it again (the service's ``/rerank``).

``aheadrank index`` writes, per shard, the sha256 of each document's text after :func:`normalise_text`
(dataset ``text_sha256``, uint8 ``[n_docs, 32]``); the reader sorts them once at open, so a request's texts
are found in the store with one vectorised binary search, like docids.

The normalisation (scheme ``TEXT_DIGEST``) is the text the indexer fed the ranker (for a titled collection,
title and body joined by ``indexer.collections.join_title_text``), then Unicode NFC, runs of whitespace (space,
tab, CR, LF and the Unicode space separators, Zs: what BERT's tokenizer splits on) collapsed to one space, and
leading/trailing whitespace dropped. Two texts with the same digest give the same word pieces with the
bundled (uncased) tokenizers, so their stored fields are exactly what encoding the text would give (a cased
tokenizer that does not normalise Unicode could tell NFC and NFD apart: a negligible difference).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable

import numpy as np

TEXT_DIGEST = "sha256/nfc-ws1"  # the scheme name recorded in each shard and the manifest
DATASET = "text_sha256"
DIGEST_BYTES = 32
_WHITESPACE = re.compile("[ \t\n\r\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]+")


def normalise_text(text: str) -> str:
    """The text a digest is taken of: NFC, whitespace runs collapsed to one space, stripped."""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFC", text)).strip(" ")


def text_digest(text: str) -> bytes:
    """sha256 (32 bytes) of the normalised text, utf-8 (lone surrogates kept, as the indexer's source digest)."""
    return hashlib.sha256(normalise_text(text).encode("utf-8", "surrogatepass")).digest()


def text_digests(texts: Iterable[str]) -> np.ndarray:
    """uint8 ``[n, 32]``: the digests of ``texts``, as a shard stores them."""
    raw = b"".join(text_digest(t) for t in texts)
    return np.frombuffer(raw, dtype=np.uint8).reshape(-1, DIGEST_BYTES).copy()
