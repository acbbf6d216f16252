"""The one contract every ranker implements (DESIGN.md "One contract for every ranker").

Text level (stable surface): ``encode_documents``, ``encode_query``, ``score``, ``score_pairs``.
Tensor level (padded batches + boolean masks, used by the indexer, the service and training):
``document_fields``, ``query_state``, ``score_batch``, ``forward_pairs``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from aheadrank.rankers.config import RankerConfig
from aheadrank.rankers.graphs import QueryGraphs, query_lengths
from aheadrank.rankers.text import TextEncoder, pad, pad_fields
from torch import Tensor, nn

from aheadrank.errors import CheckpointError
from aheadrank.kernels.stored import widened

# documents per score_batch call wherever stored fields are scored: the public score and the rerank core's
# score_stored (rerank-run, the service, whose --batch-size defaults to the same 256), so all score alike
SCORE_BATCH = 256
# the stored dtypes the scoring paths read as they are (widened a block at a time), never copied to float32
STORED_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class QueryState:
    """What ``encode_query`` computes once per request; ``mask`` is [1, Tq] bool."""

    tensors: dict[str, Tensor]
    mask: Tensor
    text: str = ""
    extra: dict = field(default_factory=dict)

    def __getitem__(self, name: str) -> Tensor:
        return self.tensors[name]


class Ranker(nn.Module):
    kind: ClassVar[str]
    strategies: ClassVar[tuple[str, ...]] = ("default",)
    fingerprint: str = ""  # set by load_ranker (sha256 over config + weights)
    priors: dict | None = None  # the checkpoint's priors.json, set by load_ranker (aheadrank/priors.py)
    query_graphs: QueryGraphs | None = None  # use_cuda_graphs

    def __init__(self, config: RankerConfig, text: TextEncoder | None = None, strategy: str | None = None):
        super().__init__()
        self.config = config.validate()
        self.text = text
        strategy = strategy or self.strategies[0]
        if strategy not in self.strategies:
            raise ValueError(f"{self.kind} ranker has strategies {self.strategies}, not {strategy!r}")
        self.strategy = strategy

    # attributes derived from the weights or the last query (caches holding weak references or opaque oneDNN
    # tensors): dropped when the ranker is pickled or deep-copied, made again on use
    derived_caches: ClassVar[tuple[str, ...]] = ()

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        for name in self.derived_caches:
            state.pop(name, None)
        return state

    def canonicalize(self) -> bool:
        """Bring a reparametrisation that leaves every score unchanged to its canonical form (PreTTR: the stored
        basis, :meth:`PrettrRanker.canonicalize_basis`); True when something changed. New rankers and saved
        checkpoints are canonical; none by default."""
        return False

    def canonical_copy(self) -> Ranker | None:
        """A canonical deep copy when this ranker is not canonical (what :func:`save_checkpoint` writes, leaving
        a model in training as it is), else None."""
        return None

    # ---- what each ranker defines -------------------------------------------------------------
    # the submodules that start from scratch rather than from the base's weights (TrainConfig.fresh_lr)
    fresh_modules: ClassVar[tuple[str, ...]] = ("head", "sim")

    def fresh_parameter_names(self) -> list[str]:
        """Names of the parameters in :attr:`fresh_modules` (those this ranker has)."""
        return [n for n, _ in self.named_parameters() if n.split(".")[0] in self.fresh_modules]

    def field_dims(self) -> dict[str, int]:
        """Stored field name -> dim for the current strategy."""
        raise NotImplementedError

    def query_ids(self, pieces: list[int]) -> list[int]:
        """The query's token ids with this ranker's special tokens (default ``[CLS] q [SEP]``)."""
        return [self._text().cls, *pieces, self._text().sep]

    def doc_ids(self, pieces: list[int]) -> list[int]:
        """The document's token ids with this ranker's special tokens."""
        raise NotImplementedError

    def document_fields(self, ids: Tensor, mask: Tensor) -> dict[str, Tensor]:
        """Padded documents [B, T] -> named fields [B, T, dim] (query-independent)."""
        raise NotImplementedError

    def query_state(self, ids: Tensor, mask: Tensor) -> QueryState:
        raise NotImplementedError

    def score_batch(self, qs: QueryState, fields: dict[str, Tensor], mask: Tensor) -> Tensor:
        """One query against B documents given as padded stored fields [B, T, dim] + mask [B, T] -> [B]."""
        raise NotImplementedError

    def forward_pairs(self, q_ids: Tensor, q_mask: Tensor, d_ids: Tensor, d_mask: Tensor) -> Tensor:
        """The full, unsplit model on B (query, document) pairs -> scores [B] (training and reference)."""
        raise NotImplementedError

    def init_from_base(self, sd: dict[str, Tensor]) -> None:
        """BERT-weight-assisted initialisation from a base BertModel state dict."""
        raise NotImplementedError

    # ---- shared machinery ---------------------------------------------------------------------
    def _text(self) -> TextEncoder:
        if self.text is None:
            raise RuntimeError("this ranker was built without a tokenizer")
        return self.text

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def limit_doc_len(self, max_doc_len: int) -> None:
        """Read documents up to ``max_doc_len`` word pieces (at most the checkpoint's ``max_doc_len``)."""
        if not 1 <= max_doc_len <= self.config.max_doc_len:
            raise CheckpointError(
                f"max_doc_len {max_doc_len} is outside 1..{self.config.max_doc_len} (the checkpoint's max_doc_len)"
            )
        self._text().max_doc_len = max_doc_len

    def query_len_limit(self) -> int:
        """The most query word pieces this ranker can read: PreTTR its checkpoint's ``max_query_len`` (the
        stored documents' positions start after it); BERT what the base's positions leave beside the document
        (``[CLS] q [SEP] d [SEP]``); MORES and TK the base's positions less ``[CLS]`` and ``[SEP]``."""
        c = self.config
        positions = int(c.bert["max_position_embeddings"])
        if c.kind == "prettr":
            return c.max_query_len
        if c.kind == "bert":
            return positions - self._text().max_doc_len - 3
        return positions - 2

    def read_queries_up_to(self, max_query_len: int) -> int:
        """Read queries up to ``max_query_len`` word pieces where :meth:`query_len_limit` allows (a ranker
        trained on shorter queries reads longer ones with the same weights); returns the length now read."""
        n = max(1, min(max_query_len, self.query_len_limit()))
        self._text().max_query_len = n
        return n

    def max_doc_tokens(self) -> int:
        """The most tokens a stored document can have (word pieces plus this ranker's special tokens)."""
        return len(self.doc_ids([0] * self._text().max_doc_len))

    def tokenize_documents(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.doc_ids(p) for p in self._text().doc_pieces(texts)]

    def tokenize_queries(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.query_ids(p) for p in self._text().query_pieces(texts)]

    @torch.inference_mode()
    def encode_documents(self, texts: Sequence[str], batch_size: int = 64) -> list[dict[str, Tensor]]:
        """One dict of fields ([doc_len, dim] each, on the CPU) per document: exactly what the store keeps."""
        out: list[dict[str, Tensor]] = []
        seqs = self.tokenize_documents(texts)
        for start in range(0, len(seqs), batch_size):
            ids, mask = pad(seqs[start : start + batch_size], self.device, self._text().pad)
            fields = self.document_fields(ids, mask)
            lengths = mask.sum(1).tolist()
            cpu = {k: v.float().cpu() for k, v in fields.items()}
            out.extend({k: v[i, :n] for k, v in cpu.items()} for i, n in enumerate(lengths))
        return out

    @torch.inference_mode()
    def encode_query(self, text: str) -> QueryState:
        ids, mask = pad(self.tokenize_queries([text]), self.device, self._text().pad)
        qs = self.query_graphs(ids, mask) if self.query_graphs is not None else self.query_state(ids, mask)
        qs.text = text
        return qs

    def use_cuda_graphs(self, on: bool = True) -> QueryGraphs | None:
        """On a GPU, ``encode_query`` replays ``query_state`` from a CUDA graph per query shape (captured on first
        use, :class:`~aheadrank.rankers.graphs.QueryGraphs`; a no-op elsewhere). Returns the graphs, or None."""
        lengths = len(query_lengths(self._text().max_query_len)) if self.text is not None else 64
        self.query_graphs = QueryGraphs(self, max(64, lengths)) if on else None  # every length read
        return self.query_graphs

    @torch.inference_mode()
    def score(
        self, query_state: QueryState, docs: Sequence[dict[str, Tensor]], batch: int = SCORE_BATCH
    ) -> Tensor:
        """Scores [n_docs] (float32, CPU) from stored fields, as the service scores the store's candidates
        (:func:`aheadrank.rerank.score_stored`): ``batch`` documents a :meth:`score_batch`, float16 and
        bfloat16 fields (what the store keeps) in their own dtype, anything else (``encode_documents``'
        float32) in the model's."""
        docs = list(docs)
        if not docs:
            raise ValueError("no documents to score")
        out = []
        for start in range(0, len(docs), batch):
            fields, mask = pad_fields(docs[start : start + batch], self.device, self.dtype, STORED_DTYPES)
            out.append(self.score_batch(query_state, fields, mask).float().cpu())
        return torch.cat(out)

    def score_pairs(self, query: str, texts: Sequence[str], batch_size: int = 64) -> Tensor:
        """The full, unsplit model: scores [n_docs] (float32, CPU). Gradients flow unless the caller disables them."""
        q = self.tokenize_queries([query])[0]
        docs = self.tokenize_documents(texts)
        scores = []
        for start in range(0, len(docs), batch_size):
            chunk = docs[start : start + batch_size]
            q_ids, q_mask = pad([q] * len(chunk), self.device, self._text().pad)
            d_ids, d_mask = pad(chunk, self.device, self._text().pad)
            scores.append(self.forward_pairs(q_ids, q_mask, d_ids, d_mask))
        return torch.cat(scores).float().cpu()

    def describe(self) -> dict:
        """Kind, strategy and options (for /v1/info, benchmarks, store manifests)."""
        c = self.config
        opts = {
            k: getattr(c, k)
            for k in ("ibs", "pooling", "tied", "layer", "compress", "tk_layers", "sim")
            if getattr(c, k) is not None
        }
        return {
            "kind": self.kind,
            "strategy": self.strategy,
            "max_query_len": c.max_query_len,
            "max_doc_len": c.max_doc_len,
            "fields": self.field_dims(),
            **opts,
        }


def masked_mean(x: Tensor, mask: Tensor, dtype: torch.dtype | None = None) -> Tensor:
    """Mean of x [B, T, n] over the rows where mask [B or 1, T] is True, in ``dtype`` (default x's).

    A float16/bfloat16 x (stored fields) with ``dtype=float32`` is widened a block of documents at a time
    (``aheadrank.kernels.stored.widened``), not copied whole."""
    if dtype is not None and x.dtype != dtype:
        if x.device.type != "cpu" or x.shape[0] == 0:
            return masked_mean(x.to(dtype), mask)
        parts = [masked_mean(w, mask if mask.shape[0] == 1 else mask[r]) for r, w in widened(x, dtype)]
        return torch.cat(parts)
    m = mask[..., None].to(x.dtype)
    return (x * m).sum(1) / m.sum(1).clamp(min=1.0)
