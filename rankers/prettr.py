"""PreTTR: one joint L-layer encoder over ``[CLS] q [SEP] d [SEP]`` whose query and document halves may not
attend to each other in layers 1..l.

Document positions start at the fixed offset ``max_query_len + 2``, so the document's layer-l states do not
depend on the query and are computed at index time, compressed ``r = GELU(s_l·Wc + bc)`` to e dims and
stored (field ``doc``). Online: the query through layers 1..l, ``ŝ = LN(r·Wd + bd)``, layers l+1..L over the
joined sequence, and in layer L only [CLS]. ``compress = 0`` stores s_l itself (no compressor).

With ``sim`` the score adds ``α·cos(q̄, P(mean_d ŝ))`` and the score head starts at zero. q̄ is the query
alone through all L layers, mean-pooled (the base bi-encoder's query embedding, computed once per query);
P is a linear map from the mean of the decompressed layer-l document states to the base bi-encoder's
document embedding, fitted by ridge regression on the collection's documents before fine-tuning
(:meth:`PrettrRanker.fit_pool_map`). Why a map: mean-pooled layer-l states are a poor bi-encoder (SciFact
test, BM25 top-100: 0.18 nDCG@10 at l = 5, against 0.61 for the final layer), and the final layer of the
document is what PreTTR never computes; P recovers most of it (0.50) for one n×n product per document.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from aheadrank.rankers.base import QueryState, Ranker, masked_mean
from aheadrank.rankers.base_model import base_embeddings, base_layer
from aheadrank.rankers.blocks import (
    Encoder,
    Linear,
    SimilarityResidual,
    key_mask,
    matmul_t,
    pack_weight,
    weights_key,
    zero_head,
)
from aheadrank.rankers.spec import RankerSpec, Variant, option
from aheadrank.rankers.text import positions
from torch import Tensor, nn

from aheadrank.kernels import attention
from aheadrank.kernels.stored import widened

# context_folded runs where e is at most this fraction of n (a rule of the shapes, not a switch): G's quadratic
# form (e per token in a canonical basis, else e²) and the attention over [r/σ, 1/σ] (e + 1 values) against
# decompressing (n·e) and attending over ŝ (n wide): the fold is 1.27-1.50x the whole path at e = 128, n = 384
# (bench/results/kernels-prettrfold.json), only 1.06x at e = 256
FOLD_DECOMPRESSION = 0.5


@dataclass(frozen=True)
class DecompressionFold:
    """PreTTR's decompression ŝ = LN(r·Wdᵀ + bd) and layer L's value map as :meth:`PrettrRanker.context_folded`
    reads them: Wd and bd centred over the n outputs (w [n, e], b [n]), G = wᵀw [e, e], g2 = 2·wᵀb, bb = |b|², the
    LayerNorm's γ, β and ε; ``out`` maps the weighted sums over [r/σ, 1/σ] back to ŝ and ``values`` on to each
    head's value vector; G and the output map packed for oneDNN where that applies."""

    w: Tensor
    gram: Tensor
    packed_gram: Tensor | None
    g2: Tensor
    bb: float
    b: Tensor
    gamma: Tensor
    beta: Tensor
    eps: float
    out: Tensor  # [n, e + 1]: γ ⊙ [w, b], the weighted sums' map back to ŝ (β: its bias)
    packed_out: Tensor | None
    values: Tensor  # [H, e + 1, dh]: per head (W_vh·out)ᵀ, the weighted sums' map to the head's value vector
    value_bias: Tensor  # [H, dh]: W_vh·β + b_vh
    diagonal: Tensor | None = None  # G's diagonal [e] when G is diagonal (canonicalize_basis): σ_j in O(e)
    quad: Tensor | None = None  # [2e + 3] (diag G, g2, bb, 1/n, ε): the kernel's σ_j where G is diagonal


# G counts as diagonal when dropping its off-diagonal part moves r·G·r by at most this much relative to
# max G_ii·|r|² (e·max|G_ij| bounds it): a canonical basis rounded to float32 reads ~1e-6 here
GRAM_OFF_DIAGONAL = 1e-5


def gram_is_diagonal(gram: Tensor) -> bool:
    off = gram - torch.diag_embed(torch.diagonal(gram))
    bound = gram.shape[0] * off.abs().max()
    return bool(bound <= GRAM_OFF_DIAGONAL * torch.diagonal(gram).abs().max().clamp(min=1e-30))


def merge_weights(lse_d: Tensor, q_scores: Tensor, lse_q: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The shares of a document's tokens and of the query's tokens in [CLS]'s softmax over both, from the rows'
    log-sum-exps over the document's tokens lse_d [B, H] and the scores over the query's q_scores [H, tq] (−inf at
    padding; or their log-sum-exps lse_q [H], given): (e^(lse_d − total), e^(lse_q − total)) with total =
    log(e^lse_d + e^lse_q), each [B, H]."""
    if lse_q is None:
        lse_q = torch.logsumexp(q_scores, -1)  # [H]
    total = torch.logaddexp(lse_d, lse_q)
    return (lse_d - total).exp_(), (lse_q - total).exp_()


class PrettrRanker(Ranker):
    kind = "prettr"
    derived_caches = ("_fold",)  # derived from the weights, with opaque oneDNN tensors
    fresh_modules = ("head", "sim", "compressor", "decompressor", "decompressor_norm", "pool_map")

    def __init__(self, config, text=None, strategy=None):
        super().__init__(config, text, strategy)
        n, e = config.hidden, config.compress
        self.encoder = Encoder(config.bert, config.n_layers)
        self.head = nn.Linear(n, 1)
        if e:
            self.compressor = Linear(n, e)
            self.decompressor = Linear(e, n)
            self.decompressor_norm = nn.LayerNorm(n, eps=config.bert["layer_norm_eps"])
            # the stored r in the basis that makes the decompression's Gram matrix diagonal (canonicalize_basis):
            # saved with the weights; a checkpoint without it (before commit b82bca7) reads as the identity
            self.register_buffer("stored_basis", torch.eye(e))
        if config.sim:
            self.sim = SimilarityResidual()
            self.pool_map = Linear(n, n)  # identity until fit_pool_map
            nn.init.eye_(self.pool_map.weight)
            nn.init.zeros_(self.pool_map.bias)
            zero_head(self.head)

    @property
    def doc_offset(self) -> int:
        return self.config.max_query_len + 2

    def field_dims(self) -> dict[str, int]:
        return {"doc": self.config.compress or self.config.hidden}

    def doc_ids(self, pieces: list[int]) -> list[int]:
        return [*pieces, self._text().sep]

    def compress(self, s: Tensor) -> Tensor:
        if not self.config.compress:
            return s
        r = F.gelu(self.compressor(s))
        return r @ self.stored_basis.to(r.dtype)

    def canonicalize(self) -> bool:
        return self.canonicalize_basis()

    def canonical_copy(self) -> PrettrRanker | None:
        if not self.config.compress or gram_is_diagonal(self.decompression_gram()):
            return None
        import copy

        twin = copy.deepcopy(self)
        twin.canonicalize_basis()
        return twin

    def decompression_gram(self) -> Tensor:
        """G = W̃ᵀW̃ in float64 (W̃: the decompressor's weight less its mean output)."""
        w = self.decompressor.weight.detach().double()
        w_c = w - w.mean(0, keepdim=True)
        return w_c.T @ w_c

    @torch.no_grad()
    def canonicalize_basis(self) -> bool:
        """Rotate the stored space so that the decompression's Gram matrix G = W̃ᵀW̃ (W̃: the decompressor's weight
        less its mean output) is diagonal: with W̃ = U·S·Vᵀ, the stored r becomes r·V (``stored_basis`` ← B·V) and
        the decompressor's weight Wd·V, so decompress(compress(s)) is unchanged (float64, rounded once to float32),
        and :meth:`context_folded` computes the LayerNorm's σ_j in O(e) a token instead of e². V's columns are
        signed so that each one's largest entry is positive (deterministic). Nothing is done (False) without a
        compressor or when G is diagonal already, so canonicalising twice changes nothing."""
        if not self.config.compress:
            return False
        if gram_is_diagonal(self.decompression_gram()):
            return False
        w = self.decompressor.weight.detach().double()
        _, _, vh = torch.linalg.svd(w - w.mean(0, keepdim=True), full_matrices=False)
        v = vh.T  # [e, e]
        top = v.abs().argmax(0)
        v = v * torch.sign(v[top, torch.arange(v.shape[1])])[None, :]
        basis = self.stored_basis.double() @ v
        self.stored_basis.copy_(basis.to(self.stored_basis.dtype))
        self.decompressor.weight.copy_((w @ v).to(self.decompressor.weight.dtype))
        return True

    def decompress(self, r: Tensor) -> Tensor:
        return self.decompressor_norm(self.decompressor(r)) if self.config.compress else r

    def lower(self, ids: Tensor, mask: Tensor, token_type: int, offset: int) -> Tensor:
        """One segment alone through layers 1..l."""
        x = self.encoder.embeddings(ids, token_type, positions(mask, offset))
        return self.encoder.run(x, key_mask(mask), 0, self.config.layer)

    def document_fields(self, ids: Tensor, mask: Tensor) -> dict[str, Tensor]:
        return {"doc": self.compress(self.lower(ids, mask, 1, self.doc_offset))}

    def query_state(self, ids: Tensor, mask: Tensor) -> QueryState:
        q = self.lower(ids, mask, 0, 0)
        tensors = {"q": q, "q_pool": self.query_pool(q, mask)} if self.config.sim else {"q": q}
        return QueryState(tensors, mask)

    def query_pool(self, q: Tensor, q_mask: Tensor) -> Tensor:
        """The query's layer-l states alone through layers l+1..L, mean-pooled: q̄ of the residual."""
        x = self.encoder.run(q, key_mask(q_mask), self.config.layer, self.config.n_layers)
        return masked_mean(x, q_mask)

    def with_sim(self, score: Tensor, q_pool: Tensor | None, d_pooled: Tensor | None) -> Tensor:
        """The head's score plus, with ``sim``, α·cos(q̄, P(d_pooled)): ``q_pool`` from :meth:`query_pool`,
        ``d_pooled`` the mean-pooled decompressed document states (both None without ``sim``)."""
        if not self.config.sim:
            return score
        return score + self.sim(q_pool, self.pool_map(d_pooled))

    def pooled_docs(self, s: Tensor, d_mask: Tensor) -> Tensor | None:
        """What :meth:`with_sim` pools of the decompressed document states (nothing without ``sim``)."""
        return masked_mean(s, d_mask) if self.config.sim else None

    def upper(self, q: Tensor, q_mask: Tensor, s: Tensor, d_mask: Tensor, q_pool: Tensor | None) -> Tensor:
        """Layers l+1..L over [query states; decompressed document states]; only [CLS] in layer L."""
        L, split = self.config.n_layers, self.config.layer
        b = s.shape[0]
        mask = key_mask(torch.cat([q_mask.expand(b, -1), d_mask], 1))
        last = self.encoder.layer[L - 1]
        if split == L - 1 and q.shape[0] == 1:
            # [CLS] is the query's own row, the same for every document: its query, with layer L's key map
            # folded into it (Attention.one_row_context), is computed once; no token is projected to a key or value
            x = last.ffn(last.attention(q[:, :1], mask, source=torch.cat([q.expand(b, -1, -1), s], 1)))
        else:
            x = torch.cat([q.expand(b, -1, -1), s], 1)
            x = self.encoder.run(x, mask, split, L - 1)
            x = last(x, mask, rows=slice(0, 1))
        return self.with_sim(self.head(x[:, 0]).squeeze(-1), q_pool, self.pooled_docs(s, d_mask))

    def score_batch(self, qs: QueryState, fields: dict[str, Tensor], mask: Tensor) -> Tensor:
        r, q = fields["doc"], qs["q"]
        q_pool = qs["q_pool"] if self.config.sim else None
        last_only = self.config.layer == self.config.n_layers - 1 and q.shape[0] == 1
        # the stored path for a narrower stored dtype, and for float32 fields (encode_documents') wherever no
        # gradient is wanted, so the public score takes the service's path (tests/test_score_paths.py)
        if last_only and r.device.type == "cpu" and (r.dtype != q.dtype or not torch.is_grad_enabled()):
            return self.upper_from_stored(q, qs.mask, r, mask, q_pool, qs.extra)
        return self.upper(q, qs.mask, self.decompress(r.to(self.dtype)), mask, q_pool)

    def upper_from_stored(
        self,
        q: Tensor,
        q_mask: Tensor,
        r: Tensor,
        d_mask: Tensor,
        q_pool: Tensor | None,
        cache: dict | None = None,
    ) -> Tensor:
        """:meth:`upper` for l = L−1 from the stored field (float16, or int8 + scales), a block of documents at
        a time while it is in cache: widened, decompressed, scored by [CLS]'s folded query and summed
        (``Attention.one_row_context``, written out here so that the query tokens' part, the same for every
        document, is computed once and never copied beside each document's; the residual's mean of ŝ is one
        more row of the same sum). No float32 copy of every candidate's field, of ŝ or of a [query; document]
        concatenation, and no keys or values. What depends on the query alone ([CLS]'s folded rows, its scores over
        the query's tokens and what the paths below derive from them) is computed on the first call and kept in
        ``cache`` (the query state's ``extra``: one request's chunks of candidates share it) while the weights it
        was computed from are unchanged."""
        last = self.encoder.layer[self.config.n_layers - 1]
        att = last.attention
        parts = self.query_parts(q, q_mask, cache)
        u, q_scores = parts["u"], parts["q_scores"]
        if self.folds(q.shape[2]):
            context, pooled = self.context_folded(q, u, q_scores, r, d_mask, parts)
        else:
            weighted, pooled = self.weighted_sums(q, u, q_scores, r, d_mask, parts)
            context = att.folded_values(weighted)
        score = self.head(last.ffn(att.output(context, q[:, :1]))[:, 0]).squeeze(-1)
        return self.with_sim(score, q_pool, pooled)

    def query_parts(self, q: Tensor, q_mask: Tensor, cache: dict | None) -> dict:
        """[CLS]'s folded rows u [H, n] (:meth:`Attention.folded_query`) and its scores over the query's own tokens
        q_scores [H, tq] (−inf at padding), in a dict that :meth:`context_folded` and :meth:`weighted_sums` add
        their own query-only tensors to; taken from ``cache`` where it holds them for the same query states and
        unchanged weights (the layer's query, key and value maps, the decompression's fold: version counters and
        storage), else computed and stored there."""
        att = self.encoder.layer[self.config.n_layers - 1].attention
        params = (
            att.self.query.weight,
            att.self.query.bias,
            att.self.key.weight,
            att.self.value.weight,
            att.self.value.bias,
        )
        if any(p.is_inference() for p in params):  # no version counters to tell a change by: not kept
            cache = None
        key = None if cache is None else (id(self), id(q), q.data_ptr(), weights_key(*params))
        if cache is not None:
            found = cache.get("prettr_query_parts")
            if found is not None and found[0] == key:
                return found[1]
        u = att.folded_query(q[:, :1])[0]  # [H, n]
        parts = {"u": u, "q_scores": (q[0] @ u.T).T.masked_fill(~q_mask[0], float("-inf"))}  # [H, tq]
        if cache is not None:
            cache["prettr_query_parts"] = (key, parts)
        return parts

    def folds(self, n: int) -> bool:
        """Whether :meth:`upper_from_stored` folds the decompression away (:meth:`context_folded`): a compressor
        of e ≤ FOLD_DECOMPRESSION·n dims (a rule of the shapes)."""
        e = self.config.compress
        return bool(e) and e <= FOLD_DECOMPRESSION * n

    def kernel_rows(self, u: Tensor) -> Tensor:
        """The attention's query rows [R, n]: [CLS]'s folded rows u [H, n] (carrying the 1/√dh), and with
        ``sim`` a zero row more, whose weights are uniform over the document's tokens (the mean the residual
        pools)."""
        return torch.cat([u, u.new_zeros(1, u.shape[1])]) if self.config.sim else u

    def weighted_sums(
        self, q: Tensor, u: Tensor, q_scores: Tensor, r: Tensor, d_mask: Tensor, parts: dict | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """[CLS]'s per-head weighted sums over [query; document] tokens [B, H, n] (and, with ``sim``, the mean of
        ŝ over each document's tokens [B, n]) by the kernels' attention (``aheadrank.kernels.attention.attend``):
        the H folded rows (and a zero row more for ``sim``, whose weights are uniform over the document's tokens:
        the mean of ŝ) as the query rows of one head as wide as the states, over the stored states themselves
        (l5/e0: float16 or int8 read in place) or over each block's decompressed ŝ. The query tokens' part, the
        same for every document, is merged in after by the rows' log-sum-exps (:func:`merge_weights`).
        ``parts`` (:meth:`query_parts`) keeps the query-only rows."""
        n_heads = u.shape[0]
        parts = {} if parts is None else parts
        if "rows" not in parts:
            parts["rows"] = self.kernel_rows(u)
        rows = parts["rows"][None, None]
        if self.config.compress:
            out = q.new_empty(r.shape[0], rows.shape[2], q.shape[2])
            lse = q.new_empty(r.shape[0], 1, rows.shape[2])
            for sl, block in widened(r, q.dtype):
                s = self.decompress(block)  # ŝ
                out[sl], lse[sl] = attention.attend(rows, s, s, key_mask(d_mask[sl]), 1.0, lse=True)
        else:
            out, lse = attention.attend(rows, r, r, key_mask(d_mask), 1.0, lse=True)
        weighted = out[:, :n_heads]  # [B, R, n]
        weights = merge_weights(lse[:, 0, :n_heads], q_scores)
        # in place over the attention's output: two passes, no [B, H, n] temporaries (fresh pages cost here)
        weighted.mul_(weights[0].unsqueeze(-1))
        weighted.addcmul_(weights[1].unsqueeze(-1), q_scores.softmax(-1) @ q[0])
        return weighted, out[:, n_heads] if self.config.sim else None

    def context_folded(
        self, q: Tensor, u: Tensor, q_scores: Tensor, r: Tensor, d_mask: Tensor, parts: dict | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """[CLS]'s attention context in layer L [B, 1, n] (and, with ``sim``, the mean of ŝ over each document's
        tokens [B, n]) straight from the stored r, without decompressing. Per head h (u_h: its folded query,
        :meth:`Attention.folded_query`) the kernel computes the softmax-weighted sums of the keys k_j = [r_j/σ_j,
        1/σ_j] (the values being the keys) under query rows [a_h, c_h]: with ŝ_j = γ ⊙ ỹ_j/σ_j + β, ỹ_j = W̃·r_j +
        b̃ (W̃, b̃: Wd and bd less their mean over the n outputs, so ỹ_j is y_j − mean(y_j)) and σ_j² = |ỹ_j|²/n + ε
        = (r_jᵀ·G·r_j + 2·g·r_j + |b̃|²)/n + ε (G = W̃ᵀW̃, g = W̃ᵀb̃: :meth:`decompression_fold`), u_h·ŝ_j =
        (a_h·r_j + c_h)/σ_j + u_h·β with a_h = W̃ᵀ(u_h ⊙ γ), c_h = (u_h ⊙ γ)·b̃, and Σ_j p_hj·ŝ_j = γ ⊙ (W̃·Σ_j
        p_hj r_j/σ_j + b̃·Σ_j p_hj/σ_j) + β. Where G is diagonal (a canonical basis) the attention computes σ_j itself
        from each row it widens (``attention.attend``'s quad); otherwise 1/σ_j comes from G's GEMM a block of
        documents at a time. The value map is folded into the map back (``DecompressionFold.values``: W_vh·γ ⊙
        [W̃, b̃] per head): the head's value vector is read off the e + 1 sums, and ŝ is never formed, not even
        as the weighted sum. The query tokens' part (the same for every document) is merged in by the rows'
        log-sum-exps. Per token e + 2·R·(e + 1) multiply-adds (σ, scores, sums) instead of the n·e of the
        decompression and 2·R·n of the attention over ŝ. ``parts`` (:meth:`query_parts`) keeps what depends
        on the query alone: the attention's rows, u_h·β, the query tokens'
        log-sum-exps and their part of each head's value vector."""
        n_heads, n = u.shape
        fold = self.decompression_fold(q)
        e = r.shape[-1]
        att = self.encoder.layer[self.config.n_layers - 1].attention
        parts = {} if parts is None else parts
        if parts.get("fold") is not fold:  # the fold is made again when its weights change
            rows = self.kernel_rows(u)
            ug = rows * fold.gamma
            parts["fold"] = fold
            parts["folded"] = (
                rows,
                torch.cat([ug @ fold.w, (ug @ fold.b)[:, None]], 1),  # [R, e + 1]: [a_h, c_h]
                rows[:n_heads] @ fold.beta,  # u_h·β: the same for every token, part of the log-sum-exp
                torch.logsumexp(q_scores, -1),  # [H]: over the query's tokens
                att.folded_values((q_scores.softmax(-1) @ q[0])[None])[0].view(n_heads, -1),  # [H, dh]
            )
        rows, query, beta_scores, lse_q, on_query = parts["folded"]
        if fold.quad is not None:  # σ_j by the attention, from each row as it widens it
            sums, lse = attention.attend(
                query[None, None], r, r, key_mask(d_mask), 1.0, lse=True, quad=fold.quad
            )
            lse = lse[:, 0]
        else:
            b = r.shape[0]
            sums = q.new_empty(b, rows.shape[0], e + 1)
            lse = q.new_empty(b, rows.shape[0])
            for sl, block in widened(r, q.dtype):
                nb, t, _ = block.shape
                flat = block.reshape(-1, e)
                # 1/σ_j from r_j·(G·r_j + 2g) + |b̃|² (G's product: one GEMM over the block)
                quad = matmul_t(flat, fold.gram, fold.packed_gram, fold.g2).mul_(flat).sum(-1)
                inv = quad.add_(fold.bb).clamp_(min=0.0).div_(n).add_(fold.eps).rsqrt_().view(nb, t)
                stored = r[sl]  # read by the kernel as stored, each row times its 1/σ_j, then 1/σ_j itself
                part = attention.attend(
                    query[None, None],
                    stored,
                    stored,
                    key_mask(d_mask[sl]),
                    1.0,
                    lse=True,
                    key_scale=inv,
                    extra=inv,
                )
                sums[sl], lse[sl] = part[0], part[1][:, 0]
        # per head: w_d·(W_vh·Σ_d + b_vh) + w_q·(W_vh·Σ_q + b_vh), Σ_d = γ ⊙ (W̃·S + b̃·s) + β over the kernel's
        # sums [S, s]; u_h·β is the same for every token but part of the log-sum-exp
        w_d, w_q = merge_weights(lse[:, :n_heads] + beta_scores, q_scores, lse_q)  # [B, H] each
        heads = torch.bmm(sums[:, :n_heads].transpose(0, 1), fold.values)  # [H, B, dh]
        heads.add_(fold.value_bias[:, None]).mul_(w_d.T[..., None]).add_(w_q.T[..., None] * on_query[:, None])
        context = heads.permute(1, 0, 2).reshape(-1, 1, n)
        pooled = None
        if self.config.sim:  # the mean of ŝ: the last row's sums mapped back
            pooled = matmul_t(sums[:, n_heads], fold.out, fold.packed_out, fold.beta)
        return context, pooled

    def decompression_fold(self, like: Tensor) -> DecompressionFold:
        """The constants of :meth:`context_folded`, computed in float64 from Wd, bd, the LayerNorm's γ, β and layer
        L's value map (cast to float32), and kept until any of them changes (their version counters)."""
        value = self.encoder.layer[self.config.n_layers - 1].attention.self.value
        params = (
            self.decompressor.weight,
            self.decompressor.bias,
            self.decompressor_norm.weight,
            self.decompressor_norm.bias,
            value.weight,
            value.bias,
        )
        key = weights_key(*params)
        cached = self.__dict__.get("_fold")
        if cached is not None and cached[0] == key:
            return cached[1]
        with torch.no_grad():
            w, bias, gamma, beta, w_v, b_v = (p.detach().double() for p in params)
            w_c = w - w.mean(0, keepdim=True)  # [n, e]: each output less the mean output
            b_c = bias - bias.mean()
            f32 = {"dtype": torch.float32, "device": like.device}
            gram64 = w_c.T @ w_c
            gram = gram64.to(**f32).contiguous()
            n, e = w_c.shape
            out = torch.cat([gamma[:, None] * w_c, (gamma * b_c)[:, None]], 1)  # [n, e + 1]
            out32 = out.to(**f32).contiguous()
            heads = self.encoder.layer[self.config.n_layers - 1].attention.heads
            values = (w_v @ out).view(heads, n // heads, e + 1).transpose(1, 2)  # [H, e + 1, dh]
            diagonal = torch.diagonal(gram).contiguous() if gram_is_diagonal(gram64) else None
            g2 = (2 * w_c.T @ b_c).to(**f32)
            quad = None
            if diagonal is not None:
                scalars = torch.tensor([float(b_c @ b_c), 1.0 / n, float(self.decompressor_norm.eps)])
                quad = torch.cat([diagonal, g2, scalars.to(**f32)]).contiguous()
            fold = DecompressionFold(
                w=w_c.to(**f32).contiguous(),
                gram=gram,
                packed_gram=pack_weight(gram, like),
                g2=g2,
                bb=float(b_c @ b_c),
                b=b_c.to(**f32),
                gamma=gamma.to(**f32),
                beta=beta.to(**f32),
                eps=float(self.decompressor_norm.eps),
                out=out32,
                packed_out=pack_weight(out32, like),
                values=values.to(**f32).contiguous(),
                value_bias=(w_v @ beta + b_v).view(heads, -1).to(**f32).contiguous(),
                diagonal=diagonal,
                quad=quad,
            )
        self.__dict__["_fold"] = (key, fold)
        return fold

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
        q_pool = self.query_pool(q, q_mask) if self.config.sim else None
        return self.with_sim(self.head(x[:, 0]).squeeze(-1), q_pool, self.pooled_docs(s, d_mask))

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

    @torch.no_grad()
    def init_compressor_pca(self, texts: list[str], batch: int = 32, progress: bool = False) -> dict:
        """Initialise the compressor / decompressor from a PCA of the documents' layer-l states, so that
        ``decompress(compress(s)) ≈ s`` before any training: with γ, β layer l's output LayerNorm and u = (s − β)/γ
        (each token's normalised state), P the top-e principal directions of u and c a shift that keeps GELU in
        its linear range, ``r = GELU(Pᵀ(u − ū) + c)`` and ``ŝ = LN(P(r − c) + ū)`` with the LayerNorm's γ, β.
        Returns the record (documents, tokens, variance explained), also kept in ``config.extra``."""
        from aheadrank.rankers.text import pad

        from aheadrank.logs import progress_bar

        e = self.config.compress
        if not e:
            raise ValueError("init_compressor_pca needs a PreTTR ranker with a compressor (compress > 0)")
        was_training = self.training
        self.eval()
        norm = self.encoder.layer[self.config.layer - 1].output.LayerNorm
        gamma = torch.where(
            norm.weight.abs() < 1e-3, torch.full_like(norm.weight, 1e-3), norm.weight
        ).double()
        beta = norm.bias.double()
        us = []
        for i in progress_bar(range(0, len(texts), batch), desc="compressor PCA", disable=not progress):
            ids, mask = pad(self.tokenize_documents(texts[i : i + batch]), self.device)
            s = self.lower(ids, mask, 1, self.doc_offset)
            us.append((s[mask].double() - beta) / gamma)
        u = torch.cat(us)
        mean = u.mean(0)
        cov = (u - mean).T @ (u - mean) / max(1, len(u) - 1)
        evals, evecs = torch.linalg.eigh(cov)  # ascending
        p = evecs[:, -e:].flip(-1)  # [n, e], the top e directions
        z_std = evals[-e:].flip(-1).clamp(min=0).sqrt()
        shift = 4 * z_std + 3  # GELU(x) = x·Φ(x) is within 0.2 % of x for x ≥ 3
        self.compressor.weight.copy_((p.T / gamma).to(self.compressor.weight.dtype))
        self.compressor.bias.copy_((shift - p.T @ (beta / gamma + mean)).to(self.compressor.bias.dtype))
        self.decompressor.weight.copy_(p.to(self.decompressor.weight.dtype))
        self.decompressor.bias.copy_((mean - p @ shift).to(self.decompressor.bias.dtype))
        self.decompressor_norm.weight.copy_(norm.weight)
        self.decompressor_norm.bias.copy_(norm.bias)
        self.stored_basis.copy_(
            torch.eye(e, dtype=self.stored_basis.dtype)
        )  # the maps above are in r's own basis
        self.canonicalize_basis()
        self.train(was_training)
        explained = float(evals[-e:].sum() / evals.sum().clamp(min=1e-12))
        record = {"kind": "pca", "documents": len(texts), "tokens": len(u), "explained": round(explained, 4)}
        self.config.extra = {**self.config.extra, "compressor_init": record}
        return record

    def bi_encoder_embedding(self, doc_tokens: list[list[int]]) -> Tensor:
        """What :meth:`fit_pool_map` fits P to: tokenised documents (:meth:`tokenize_documents`) as the base
        bi-encoder reads them, ``[CLS] d [SEP]`` alone through all L layers, positions from 0, mean-pooled ->
        [B, n]."""
        from aheadrank.rankers.text import pad

        ids, mask = pad([[self._text().cls, *t] for t in doc_tokens], self.device)
        y = self.encoder.run(self.encoder.embeddings(ids, 0, positions(mask)), key_mask(mask), 0, None)
        return masked_mean(y, mask)

    @torch.no_grad()
    def fit_pool_map(
        self, texts: list[str], ridge: float = 1e-3, batch: int = 32, progress: bool = False
    ) -> dict:
        """Fit P (``sim``) by ridge regression: from the mean of the documents' decompressed layer-l states (as
        stored) to the base bi-encoder's embedding of the same documents (``[CLS] d [SEP]`` alone through all L
        layers, positions from 0, mean-pooled). ``ridge`` is relative to the mean variance of the inputs.
        Returns the fit's record (documents, R² on them), also kept in ``config.extra["pool_map"]``."""
        from aheadrank.rankers.text import pad

        from aheadrank.logs import progress_bar

        if not self.config.sim:
            raise ValueError("fit_pool_map needs a PreTTR ranker with the similarity residual (sim)")
        was_training = self.training
        self.eval()
        xs, ys = [], []
        for i in progress_bar(range(0, len(texts), batch), desc="pool map", disable=not progress):
            toks = self.tokenize_documents(texts[i : i + batch])
            ids, mask = pad(toks, self.device)
            xs.append(
                self.pooled_docs(
                    self.decompress(self.compress(self.lower(ids, mask, 1, self.doc_offset))), mask
                )
            )
            ys.append(self.bi_encoder_embedding(toks))
        x, y = torch.cat(xs).double(), torch.cat(ys).double()
        xa = torch.cat([x, torch.ones_like(x[:, :1])], 1)
        gram = xa.T @ xa
        lam = ridge * float(x.var(0).mean()) * len(x)
        w = torch.linalg.solve(
            gram + lam * torch.eye(len(gram), dtype=gram.dtype, device=gram.device), xa.T @ y
        )
        self.pool_map.weight.copy_(w[:-1].T)
        self.pool_map.bias.copy_(w[-1])
        residual = ((xa @ w - y) ** 2).sum() / ((y - y.mean(0)) ** 2).sum()
        self.train(was_training)
        record = {"documents": len(texts), "ridge": ridge, "r2": round(1.0 - float(residual), 4)}
        self.config.extra = {**self.config.extra, "pool_map": record}  # saved with every later checkpoint
        return record

    def init_from_base(self, sd: dict[str, Tensor]) -> None:
        self.encoder.embeddings.load_state_dict(base_embeddings(sd))
        for i, layer in enumerate(self.encoder.layer):
            layer.load_state_dict(base_layer(sd, i))


@dataclass
class PrettrOptions:
    layer: int = option(5, "split layer l: query and document apart in layers 1..l")
    compress: int = option(128, "compressed dims e (0 = no compressor)")
    sim: bool = option(True, "the similarity residual, as for MORES")


def parse_prettr(name: str) -> Variant | None:
    """``prettr-l<l>-e<e>``."""
    if m := re.fullmatch(r"prettr-l(\d+)-e(\d+)", name):
        return Variant(name, name, "prettr", {"layer": int(m.group(1)), "compress": int(m.group(2))})
    return None


SPEC = RankerSpec(
    "prettr",
    PrettrRanker,
    PrettrOptions,
    variants=tuple(f"prettr-l{l}-e{e}" for l in (4, 5) for e in (0, 128, 256)),  # noqa: E741
    parse=parse_prettr,
    default_variant="prettr-l5-e128",
    grammar="prettr-l<l>-e<e>",
)
