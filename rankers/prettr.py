"""PreTTR: one joint L-layer encoder over ``[CLS] q [SEP] d [SEP]`` whose query and document halves may not
attend to each other in layers 1..l.

Document positions start at the fixed offset ``max_query_len + 2``, so the document's layer-l states do not
depend on the query and are computed at index time, compressed ``r = GELU(s_l·Wc + bc)`` to e dims and
stored (field ``doc``). Online: the query through layers 1..l, ``ŝ = LN(r·Wd + bd)``, layers l+1..L over the
joined sequence, and in layer L only [CLS]. ``compress = 0`` stores s_l itself (no compressor).

With ``sim`` the score adds ``α·cos(mean_q q_l, mean_d ŝ)`` (the layer-l query states and the decompressed
layer-l document states, mean-pooled) and the score head starts at zero, so that before training the
ranker orders by the base model's layer-l bi-encoder similarity.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from aheadrank.rankers.base import QueryState, Ranker, masked_mean
from aheadrank.rankers.base_model import base_embeddings, base_layer
from aheadrank.rankers.blocks import Encoder, SimilarityResidual, key_mask, widened, zero_head
from aheadrank.rankers.text import positions
from torch import Tensor, nn


class PrettrRanker(Ranker):
    kind = "prettr"

    def __init__(self, config, text=None, strategy=None):
        super().__init__(config, text, strategy)
        n, e = config.hidden, config.compress
        self.encoder = Encoder(config.bert, config.n_layers)
        self.head = nn.Linear(n, 1)
        if e:
            self.compressor = nn.Linear(n, e)
            self.decompressor = nn.Linear(e, n)
            self.decompressor_norm = nn.LayerNorm(n, eps=config.bert["layer_norm_eps"])
        if config.sim:
            self.sim = SimilarityResidual()
            zero_head(self.head)

    @property
    def doc_offset(self) -> int:
        return self.config.max_query_len + 2

    def field_dims(self) -> dict[str, int]:
        return {"doc": self.config.compress or self.config.hidden}

    def doc_ids(self, pieces: list[int]) -> list[int]:
        return [*pieces, self._text().sep]

    def compress(self, s: Tensor) -> Tensor:
        return F.gelu(self.compressor(s)) if self.config.compress else s

    def decompress(self, r: Tensor) -> Tensor:
        return self.decompressor_norm(self.decompressor(r)) if self.config.compress else r

    def lower(self, ids: Tensor, mask: Tensor, token_type: int, offset: int) -> Tensor:
        """One segment alone through layers 1..l."""
        x = self.encoder.embeddings(ids, token_type, positions(mask, offset))
        return self.encoder.run(x, key_mask(mask), 0, self.config.layer)

    def document_fields(self, ids: Tensor, mask: Tensor) -> dict[str, Tensor]:
        return {"doc": self.compress(self.lower(ids, mask, 1, self.doc_offset))}

    def query_state(self, ids: Tensor, mask: Tensor) -> QueryState:
        return QueryState({"q": self.lower(ids, mask, 0, 0)}, mask)

    def with_sim(self, score: Tensor, q: Tensor, q_mask: Tensor, d_pooled: Tensor | None) -> Tensor:
        """The head's score plus, with ``sim``, α·cos of the mean-pooled layer-l query states and ``d_pooled``,
        the mean-pooled decompressed document states (None without ``sim``)."""
        if not self.config.sim:
            return score
        return score + self.sim(masked_mean(q, q_mask), d_pooled)

    def pooled_docs(self, s: Tensor, d_mask: Tensor) -> Tensor | None:
        """What :meth:`with_sim` pools of the decompressed document states (nothing without ``sim``)."""
        return masked_mean(s, d_mask) if self.config.sim else None

    def upper(self, q: Tensor, q_mask: Tensor, s: Tensor, d_mask: Tensor) -> Tensor:
        """Layers l+1..L over [query states; decompressed document states]; only [CLS] in layer L."""
        L, split = self.config.n_layers, self.config.layer
        b = s.shape[0]
        mask = key_mask(torch.cat([q_mask.expand(b, -1), d_mask], 1))
        last = self.encoder.layer[L - 1]
        if split == L - 1 and q.shape[0] == 1:
            # the query half is the same for every document: its keys/values and the [CLS] row are computed once
            kq, vq = last.attention.project_kv(q)
            kd, vd = last.attention.project_kv(s)
            kv = (torch.cat([kq.expand(b, -1, -1), kd], 1), torch.cat([vq.expand(b, -1, -1), vd], 1))
            x = last.ffn(last.attention(q[:, :1], mask, kv=kv))
        else:
            x = torch.cat([q.expand(b, -1, -1), s], 1)
            x = self.encoder.run(x, mask, split, L - 1)
            x = last(x, mask, rows=slice(0, 1))
        return self.with_sim(self.head(x[:, 0]).squeeze(-1), q, q_mask, self.pooled_docs(s, d_mask))

    def score_batch(self, qs: QueryState, fields: dict[str, Tensor], mask: Tensor) -> Tensor:
        r, q = fields["doc"], qs["q"]
        last_only = self.config.layer == self.config.n_layers - 1 and q.shape[0] == 1
        if last_only and r.dtype != q.dtype and r.device.type == "cpu":
            return self.upper_from_stored(q, qs.mask, r, mask)
        return self.upper(q, qs.mask, self.decompress(r.to(self.dtype)), mask)

    def upper_from_stored(self, q: Tensor, q_mask: Tensor, r: Tensor, d_mask: Tensor) -> Tensor:
        """:meth:`upper` for l = L−1 from the stored field (float16, or int8 + scales): a block of documents
        at a time is widened, decompressed and projected to layer L's keys/values, written straight into the
        [query; document] key/value buffers (no float32 copy of the field, of ŝ, or a concatenation)."""
        last = self.encoder.layer[self.config.n_layers - 1]
        b, td = r.shape[:2]
        tq, n = q.shape[1], q.shape[2]
        kq, vq = last.attention.project_kv(q)
        k, v = q.new_empty(b, tq + td, n), q.new_empty(b, tq + td, n)
        k[:, :tq], v[:, :tq] = kq, vq
        pooled = []
        for rows, block in widened(r, q.dtype):
            s = self.decompress(block)
            k[rows, tq:], v[rows, tq:] = last.attention.project_kv(s)
            pooled.append(self.pooled_docs(s, d_mask[rows]))
        mask = key_mask(torch.cat([q_mask.expand(b, -1), d_mask], 1))
        score = self.head(last.ffn(last.attention(q[:, :1], mask, kv=(k, v)))[:, 0]).squeeze(-1)
        return self.with_sim(score, q, q_mask, torch.cat(pooled) if self.config.sim else None)

    def joint_lower(
        self, q_ids: Tensor, q_mask: Tensor, d_ids: Tensor, d_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The joint sequence through layers 1..l with the query/document block mask -> (states, key mask)."""
        tq = q_ids.shape[1]
        ids = torch.cat([q_ids, d_ids], 1)
        valid = torch.cat([q_mask, d_mask], 1)
        types = torch.cat([torch.zeros_like(q_ids), torch.ones_like(d_ids)], 1)
        pos = torch.cat([positions(q_mask), positions(d_mask, self.doc_offset)], 1)
        segment = torch.arange(ids.shape[1], device=ids.device) >= tq  # False: query, True: document
        same = segment[:, None] == segment[None, :]  # [T, T]
        block = same[None, None] & valid[:, None, None, :]
        x = self.encoder.embeddings(ids, types, pos)
        return self.encoder.run(x, block, 0, self.config.layer), valid

    def forward_pairs(self, q_ids: Tensor, q_mask: Tensor, d_ids: Tensor, d_mask: Tensor) -> Tensor:
        tq = q_ids.shape[1]
        x, valid = self.joint_lower(q_ids, q_mask, d_ids, d_mask)
        q, s = x[:, :tq], self.decompress(self.compress(x[:, tq:]))
        x = self.encoder.run(torch.cat([q, s], 1), key_mask(valid), self.config.layer)  # l+1..L, all rows
        return self.with_sim(self.head(x[:, 0]).squeeze(-1), q, q_mask, self.pooled_docs(s, d_mask))

    def attention_mse(self, q_ids: Tensor, q_mask: Tensor, d_ids: Tensor, d_mask: Tensor) -> Tensor:
        """Eq. 2 of the paper: mean over layers l+1..L of the MSE between the attention maps computed with
        the compressed-then-decompressed document states and with the original ones (lower layers frozen)."""
        tq = q_ids.shape[1]
        with torch.no_grad():
            x, valid = self.joint_lower(q_ids, q_mask, d_ids, d_mask)
        mask = key_mask(valid)
        ref = x
        hat = torch.cat([x[:, :tq], self.decompress(self.compress(x[:, tq:]))], 1)
        losses = []
        for layer in self.encoder.layer[self.config.layer :]:
            att = layer.attention
            with torch.no_grad():
                p_ref = att.probs(att.project_q(ref), att.project_kv(ref)[0], mask)
                ref = layer(ref, mask)
            p_hat = att.probs(att.project_q(hat), att.project_kv(hat)[0], mask)
            losses.append(F.mse_loss(p_hat, p_ref))
            hat = layer(hat, mask)
        return torch.stack(losses).mean()

    def init_from_base(self, sd: dict[str, Tensor]) -> None:
        self.encoder.embeddings.load_state_dict(base_embeddings(sd))
        for i, layer in enumerate(self.encoder.layer):
            layer.load_state_dict(base_layer(sd, i))
