"""MORES / EARL: document module, query module and K Interaction Blocks (IB).

* Document module: all L layers of copy A of the base over ``[CLS] d [SEP]`` (token type 1).
* Query module: the first L−K layers of copy B over ``[CLS] q [SEP]`` (token type 0); with ``tied`` (EARL
  "Tied") it is the first L−K layers of the document module itself.
* IB k (k = 0..K−1) is initialised from base layer L−K+k: its self-attention and FFN are that layer's, its
  cross-attention a copy of that layer's self-attention.
* Score = w·CLS of the last IB (``pooling="cls"``, only the [CLS] row of the last IB is computed) or
  w·mean over query tokens (``pooling="mean"``).
* With ``sim`` the score adds ``α·cos(A(q̄), mean_d V)``: V = the last IB's cross-attention values of the
  document (D·Wv + bv, what S2 stores), q̄ = the query states carried through the IBs' own layers without
  the cross-attention (query-only, once per query), mean-pooled, and A the same value map. mean_d V =
  A(mean_d D), so before training (w = 0) the score is the base bi-encoder's similarity seen through A.
  mean_d V is read off the last IB's cross-attention pass itself (one zero query row more, whose weights
  are uniform over the document's tokens: ``InteractionBlock(mean_values=True)``), not a second pass over V.

Strategies (what the store keeps): ``s1`` the document states D (field ``doc``); ``s2`` per IB k the
cross-attention projections D·Wk+bk and D·Wv+bv (fields ``k{k}``, ``v{k}``, k from 1), so the online path
never multiplies D by an n×n matrix. Both are the same function. S1 online does not project D either: per head
and query row the key map is folded into the query and the value map applied after the weighted sum of D's
rows (``Attention.folded_context``; 12 heads × 19 query rows = 228 dot products per token instead of 2·384).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
from aheadrank.rankers.base import QueryState, Ranker, masked_mean
from aheadrank.rankers.base_model import base_embeddings, base_layer
from aheadrank.rankers.blocks import (
    Encoder,
    SimilarityResidual,
    key_mask,
    make_interaction_block,
    zero_head,
)
from aheadrank.rankers.spec import RankerSpec, Variant, option
from aheadrank.rankers.text import positions
from torch import Tensor, nn

from aheadrank.kernels.stored import QuantizedField


def as_stored(x: Tensor | QuantizedField, dtype: torch.dtype) -> Tensor | QuantizedField:
    """A stored field narrower than the model's float32 (float16, bfloat16, int8 + scales) as it is, for the
    attention to widen a block at a time; else in ``dtype``."""
    narrow = isinstance(x, QuantizedField) or x.dtype in (torch.float16, torch.bfloat16)
    return x if narrow and dtype == torch.float32 else x.to(dtype)


class MoresRanker(Ranker):
    kind = "mores"
    strategies = ("s2", "s1")

    def __init__(self, config, text=None, strategy=None):
        super().__init__(config, text, strategy)
        L, K = config.n_layers, config.ibs
        self.doc_encoder = Encoder(config.bert, L)
        self.query_encoder = self.doc_encoder if config.tied else Encoder(config.bert, L - K)
        self.ibs = nn.ModuleList(make_interaction_block(config.bert) for _ in range(K))
        self.head = nn.Linear(config.hidden, 1)
        if config.sim:
            self.sim = SimilarityResidual()
            zero_head(self.head)

    @property
    def n_query_layers(self) -> int:
        return self.config.n_layers - self.config.ibs

    def field_dims(self) -> dict[str, int]:
        n = self.config.hidden
        if self.strategy == "s1":
            return {"doc": n}
        return {f"{kv}{k}": n for k in range(1, self.config.ibs + 1) for kv in ("k", "v")}

    def doc_ids(self, pieces: list[int]) -> list[int]:
        return [self._text().cls, *pieces, self._text().sep]

    def doc_states(self, ids: Tensor, mask: Tensor) -> Tensor:
        x = self.doc_encoder.embeddings(ids, 1, positions(mask))
        return self.doc_encoder.run(x, key_mask(mask))

    def query_states(self, ids: Tensor, mask: Tensor) -> Tensor:
        x = self.query_encoder.embeddings(ids, 0, positions(mask))
        return self.query_encoder.run(x, key_mask(mask), 0, self.n_query_layers)

    def doc_kv(self, d_states: Tensor) -> list[tuple[Tensor, Tensor]]:
        return [ib.cross.project_kv(d_states) for ib in self.ibs]

    def document_fields(self, ids: Tensor, mask: Tensor) -> dict[str, Tensor]:
        d = self.doc_states(ids, mask)
        if self.strategy == "s1":
            return {"doc": d}
        out = {}
        for k, (key, value) in enumerate(self.doc_kv(d), start=1):
            out[f"k{k}"], out[f"v{k}"] = key, value
        return out

    def query_state(self, ids: Tensor, mask: Tensor) -> QueryState:
        q = self.query_states(ids, mask)
        # the first IB's cross-attention query projection depends on the query only: computed once
        data = {"q": q, "q_proj": self.ibs[0].cross.project_q(q)}
        if self.config.sim:
            data["q_sim"] = self.query_sim(q, mask)
        return QueryState(data, mask)

    def query_sim(self, q: Tensor, q_mask: Tensor) -> Tensor:
        """A(q̄): the query states through the IBs' own layers without cross-attention, mean-pooled, mapped
        by the last IB's value projection ([B, n])."""
        x = q
        for ib in self.ibs:
            x = ib.layer(x, key_mask(q_mask))
        return self.ibs[-1].cross.self.value(masked_mean(x, q_mask))

    def interact(
        self,
        q: Tensor,
        q_mask: Tensor,
        kv: list[tuple[Tensor, Tensor] | Tensor],
        d_mask: Tensor,
        q_proj: Tensor | None = None,
        q_sim: Tensor | None = None,
    ) -> Tensor:
        cls_pool = self.config.pooling == "cls"
        x, mean_v = q, None
        for k, ib in enumerate(self.ibs):
            last = k == len(self.ibs) - 1
            how = {"q_proj": q_proj if k == 0 else None, "cls_only": last and cls_pool}
            if last and self.config.sim:  # the residual's mean_d V, from the last IB's cross-attention pass
                x, mean_v = ib(x, q_mask, kv[k], d_mask, mean_values=True, **how)
            else:
                x = ib(x, q_mask, kv[k], d_mask, **how)
        pooled = x[:, 0] if cls_pool else masked_mean(x, q_mask)
        score = self.head(pooled).squeeze(-1)
        if self.config.sim:
            score = score + self.sim(q_sim, mean_v)
        return score

    def stored_kv(self, fields: dict[str, Tensor]) -> list[tuple[Tensor, Tensor] | Tensor]:
        """Per IB what its cross-attention reads: S2's stored keys and values, or S1's stored document states D,
        from which each IB's cross-attention computes its context without projecting D to keys and values where
        that is cheaper (``Attention.context_of``). Stored float16/bfloat16/int8 fields are passed on as they
        are: the attention widens them a block of documents at a time (``Attention.context``)."""
        dt = self.dtype
        if "k1" in fields:
            return [
                (as_stored(fields[f"k{k}"], dt), as_stored(fields[f"v{k}"], dt))
                for k in range(1, self.config.ibs + 1)
            ]
        if "doc" in fields:
            return [as_stored(fields["doc"], dt)] * self.config.ibs
        raise KeyError(
            f"MORES needs fields 'doc' (s1) or 'k1..v{self.config.ibs}' (s2), got {sorted(fields)}"
        )

    def score_batch(self, qs: QueryState, fields: dict[str, Tensor], mask: Tensor) -> Tensor:
        q_sim = qs["q_sim"] if self.config.sim else None
        return self.interact(qs["q"], qs.mask, self.stored_kv(fields), mask, qs["q_proj"], q_sim)

    def forward_pairs(self, q_ids: Tensor, q_mask: Tensor, d_ids: Tensor, d_mask: Tensor) -> Tensor:
        q = self.query_states(q_ids, q_mask)
        q_sim = self.query_sim(q, q_mask) if self.config.sim else None
        return self.interact(q, q_mask, self.doc_kv(self.doc_states(d_ids, d_mask)), d_mask, q_sim=q_sim)

    def init_from_base(self, sd: dict[str, Tensor]) -> None:
        L, K = self.config.n_layers, self.config.ibs
        self.doc_encoder.embeddings.load_state_dict(base_embeddings(sd))  # copy A
        for i, layer in enumerate(self.doc_encoder.layer):
            layer.load_state_dict(base_layer(sd, i))
        if not self.config.tied:  # copy B: the first L-K layers
            self.query_encoder.embeddings.load_state_dict(base_embeddings(sd))
            for i, layer in enumerate(self.query_encoder.layer):
                layer.load_state_dict(base_layer(sd, i))
        for k, ib in enumerate(self.ibs):  # copy B: layers L-K .. L-1
            src = base_layer(sd, L - K + k)
            ib.layer.load_state_dict(src)
            ib.cross.load_state_dict(
                {n[len("attention.") :]: v for n, v in src.items() if n.startswith("attention.")}
            )


@dataclass
class MoresOptions:
    ibs: int = option(2, "interaction blocks K (1..4)")
    pooling: str = option("cls", "cls (ClsPool) or mean (AvePool)", choices=("cls", "mean"))
    tied: bool = option(False, "query and document modules share weights (EARL Tied)", flag="--tied/--untied")
    # on by default for new rankers: without it MORES barely learns from a bi-encoder base (docs/rankers.md,
    # "The similarity residual"); checkpoints written before it existed load as they were (None: off)
    sim: bool = option(
        True,
        "add α·cos(pooled query, pooled document) with a zero-initialised head (starts from the base's "
        "bi-encoder similarity; what makes MORES learn, docs/rankers.md)",
    )


def parse_mores(name: str) -> Variant | None:
    """``mores-<K>ib-s1`` / ``-s2`` (ClsPool, Reuse-S1 / S2: one checkpoint, two stores), ``mores-<K>ib-mean``
    (EARL AvePool), ``mores-<K>ib-tied`` (EARL Tied)."""
    if not (m := re.fullmatch(r"mores-(\d+)ib-(s1|s2|mean|tied)", name)):
        return None
    ibs, what = int(m.group(1)), m.group(2)
    options = {"ibs": ibs, "pooling": "mean" if what == "mean" else "cls", "tied": what == "tied"}
    model = f"mores-{ibs}ib" if what in ("s1", "s2") else name
    return Variant(name, model, "mores", options, what if what in ("s1", "s2") else "s2")


SPEC = RankerSpec(
    "mores",
    MoresRanker,
    MoresOptions,
    variants=tuple(f"mores-{k}" for k in ("1ib-s1", "1ib-s2", "2ib-s1", "2ib-s2", "2ib-mean", "2ib-tied")),
    parse=parse_mores,
    default_variant="mores-2ib-s2",
    grammar="mores-<K>ib-s1|s2|mean|tied",
)
