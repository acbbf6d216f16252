"""The cross-encoder baseline: ``[CLS] q [SEP] d [SEP]`` through all L layers, score = w·CLS + b.

Its "document side" is only the position-free input embedding ``word[d] + type[1]`` (field ``emb``): nothing
expensive can be computed ahead for a cross-encoder, so every layer runs online. It is the speed and
effectiveness reference for the split rankers. In the last layer only [CLS] is computed (the score reads
nothing else), so the baseline is not slowed by work it throws away.
"""

from __future__ import annotations

import torch
from aheadrank.rankers.base import QueryState, Ranker
from aheadrank.rankers.base_model import base_embeddings, base_layer
from aheadrank.rankers.blocks import Encoder, key_mask
from aheadrank.rankers.spec import RankerSpec
from aheadrank.rankers.text import positions
from torch import Tensor, nn


class BertRanker(Ranker):
    kind = "bert"

    def __init__(self, config, text=None, strategy=None):
        super().__init__(config, text, strategy)
        self.encoder = Encoder(config.bert, config.n_layers)
        self.head = nn.Linear(config.hidden, 1)

    def field_dims(self) -> dict[str, int]:
        return {"emb": self.config.hidden}

    def doc_ids(self, pieces: list[int]) -> list[int]:
        return [*pieces, self._text().sep]

    def document_fields(self, ids: Tensor, mask: Tensor) -> dict[str, Tensor]:
        return {"emb": self.encoder.embeddings.tokens(ids, 1)}

    def query_state(self, ids: Tensor, mask: Tensor) -> QueryState:
        return QueryState({"emb": self.encoder.embeddings.tokens(ids, 0)}, mask)

    def joint(self, q_tok: Tensor, q_mask: Tensor, d_tok: Tensor, d_mask: Tensor, cls_only: bool) -> Tensor:
        b = d_tok.shape[0]
        q_tok, q_mask = q_tok.expand(b, -1, -1), q_mask.expand(b, -1)
        q_len = q_mask.sum(1, keepdim=True)
        pos = torch.cat([positions(q_mask), q_len + positions(d_mask)], 1)
        mask = key_mask(torch.cat([q_mask, d_mask], 1))
        x = self.encoder.embeddings.finish(torch.cat([q_tok, d_tok], 1), pos)
        x = self.encoder.run(x, mask, 0, self.config.n_layers - 1)
        x = self.encoder.layer[-1](x, mask, rows=slice(0, 1) if cls_only else None)
        return self.head(x[:, 0]).squeeze(-1)

    def score_batch(self, qs: QueryState, fields: dict[str, Tensor], mask: Tensor) -> Tensor:
        return self.joint(qs["emb"], qs.mask, fields["emb"].to(self.dtype), mask, cls_only=True)

    def forward_pairs(self, q_ids: Tensor, q_mask: Tensor, d_ids: Tensor, d_mask: Tensor) -> Tensor:
        emb = self.encoder.embeddings
        return self.joint(emb.tokens(q_ids, 0), q_mask, emb.tokens(d_ids, 1), d_mask, cls_only=False)

    def init_from_base(self, sd: dict[str, Tensor]) -> None:
        self.encoder.embeddings.load_state_dict(base_embeddings(sd))
        for i, layer in enumerate(self.encoder.layer):
            layer.load_state_dict(base_layer(sd, i))


SPEC = RankerSpec("bert", BertRanker)  # no options of its own; one variant, "bert"
