"""The dense prior's encoder: the base model as a plain bi-encoder (mean-pooled, unit-normalised).

This is what a user would build in twenty lines with all-MiniLM-L6-v2; aheadrank uses it as a cheap prior
beside every ranker's neural score (DESIGN.md "Priors: the served score"). The document embedding is one
small stored field (``dense``, one row of ``n`` dims per document, in the store's ``dense/`` sub-store); the
query embedding is one forward of at most ``max_query_len`` pieces per request.

It exposes the few members a store build needs (``tokenize_documents``, ``document_fields``,
``field_dims``, ``fingerprint``...), so the indexer writes its field with the same code as a ranker's.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from aheadrank.rankers.base import masked_mean
from aheadrank.rankers.base_model import load_base, resolve_base
from aheadrank.rankers.blocks import Encoder, key_mask
from aheadrank.rankers.config import RankerConfig
from aheadrank.rankers.graphs import ShapeGraphs, query_lengths
from aheadrank.rankers.text import TextEncoder, pad, positions
from torch import Tensor, nn

DENSE_FIELD = "dense"
DEFAULT_MAX_LEN = 256  # word pieces per document (sentence-transformers' limit for all-MiniLM-L6-v2)
DEFAULT_QUERY_LEN = 64


class DenseEncoder(nn.Module):
    """``normalise(mean(BERT(text)))`` with the base model's weights, unchanged."""

    kind = "dense"
    strategy = None
    query_graphs: ShapeGraphs | None = None  # use_cuda_graphs

    def __init__(
        self,
        base: str | Path | None = None,
        max_len: int = DEFAULT_MAX_LEN,
        max_query_len: int = DEFAULT_QUERY_LEN,
    ):
        super().__init__()
        base_dir = resolve_base(base)
        bert_cfg, sd = load_base(base_dir)
        self.base_dir = base_dir
        self.bert = bert_cfg
        room = int(bert_cfg["max_position_embeddings"]) - 2  # [CLS] text [SEP]
        self.max_len = min(max_len, room)
        self.max_query_len = min(max_query_len, room)
        self.encoder = Encoder(bert_cfg, int(bert_cfg["num_hidden_layers"]))
        from aheadrank.rankers.base_model import base_embeddings, base_layer

        self.encoder.embeddings.load_state_dict(base_embeddings(sd))
        for i, layer in enumerate(self.encoder.layer):
            layer.load_state_dict(base_layer(sd, i))
        self.text = TextEncoder(base_dir, self.max_query_len, self.max_len)
        self.fingerprint = self._fingerprint(sd)
        self.eval()

    def _fingerprint(self, sd: dict[str, Tensor]) -> str:
        """sha256 over the settings and the weights: what a store's dense field and a checkpoint's priors
        record, so a dense field is never paired with another encoder's query embeddings."""
        h = hashlib.sha256(json.dumps(self.settings(), sort_keys=True).encode())
        for name in sorted(sd):
            h.update(name.encode())
            h.update(sd[name].float().contiguous().numpy().tobytes())
        return h.hexdigest()

    def settings(self) -> dict:
        return {
            "kind": "dense",
            "pooling": "mean",
            "normalise": True,
            "max_len": self.max_len,
            "max_query_len": self.max_query_len,
            "bert": self.bert,
        }

    # ---- what a store build uses (the same members as a ranker's) ----------------------------------
    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def _text(self) -> TextEncoder:
        return self.text

    def field_dims(self) -> dict[str, int]:
        return {DENSE_FIELD: int(self.bert["hidden_size"])}

    def max_doc_tokens(self) -> int:
        return 1  # one row per document

    def describe(self) -> dict:
        return {**self.settings(), "fields": self.field_dims(), "base": str(self.base_dir)}

    def tokenize_documents(self, texts: Sequence[str]) -> list[list[int]]:
        t = self.text
        return [[t.cls, *p, t.sep] for p in t.pieces(texts, self.max_len)]

    def tokenize_queries(self, texts: Sequence[str]) -> list[list[int]]:
        t = self.text
        return [[t.cls, *p, t.sep] for p in t.pieces(texts, self.max_query_len)]

    def embed(self, ids: Tensor, mask: Tensor) -> Tensor:
        """Padded ids [B, T] -> unit vectors [B, n] (float32)."""
        x = self.encoder.embeddings(ids, 0, positions(mask))
        h = self.encoder.run(x, key_mask(mask))
        return nn.functional.normalize(masked_mean(h.float(), mask), dim=-1)

    def document_fields(self, ids: Tensor, mask: Tensor) -> dict[str, Tensor]:
        """[B, 1, n]: one row per document (the build keeps ``min(len, 1)`` rows: exactly this one)."""
        return {DENSE_FIELD: self.embed(ids, mask)[:, None, :]}

    # ---- direct use -------------------------------------------------------------------------------
    def use_cuda_graphs(self, on: bool = True) -> ShapeGraphs | None:
        """On a GPU, one text at a time (a request's query) is embedded by replaying a CUDA graph per length
        (:class:`~aheadrank.rankers.graphs.ShapeGraphs`; a no-op elsewhere). Returns the graphs, or None."""
        self.query_graphs = (
            ShapeGraphs(self, self.embed, max_graphs=len(query_lengths(self.max_query_len))) if on else None
        )
        return self.query_graphs

    @torch.inference_mode()
    def encode(self, seqs: list[list[int]], batch_size: int = 64) -> np.ndarray:
        out = np.zeros((len(seqs), int(self.bert["hidden_size"])), dtype=np.float32)
        order = np.argsort([-len(s) for s in seqs], kind="stable")
        one = self.query_graphs if self.query_graphs is not None and len(seqs) == 1 else None
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids, mask = pad([seqs[i] for i in idx], self.device, self.text.pad)
            out[idx] = (one or self.embed)(ids, mask).cpu().numpy()
        return out

    def encode_documents(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Unit vectors [N, n] float32, in input order."""
        return self.encode(self.tokenize_documents(texts), batch_size)

    def encode_queries(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        return self.encode(self.tokenize_queries(texts), batch_size)


_CACHE: dict[tuple, DenseEncoder] = {}


def dense_encoder(
    base: str | Path | None = None, max_len: int = DEFAULT_MAX_LEN, device: str = "cpu"
) -> DenseEncoder:
    """One encoder per (base, length, device) per process."""
    key = (str(resolve_base(base)), max_len, str(device))
    if key not in _CACHE:
        _CACHE[key] = DenseEncoder(base, max_len).to(device)
    return _CACHE[key]


def base_of(config: RankerConfig) -> str | None:
    """The base a ranker was initialised from, when that folder still exists (else the packaged one)."""
    return config.base if config.base and Path(config.base).is_dir() else None
