"""Transformer building blocks shared by every ranker.

Parameter names mirror Hugging Face's ``BertModel`` (``attention.self.query``, ``attention.output.LayerNorm``,
``intermediate.dense``, ``output.dense`` ...), so a base layer's weights load into a block with a plain
``load_state_dict`` and the BERT-weight-assisted initialisation is a set of named copies.

Masks are boolean, ``True`` = a real token. Attention masks broadcast to ``[B, heads, T_query, T_key]``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from aheadrank.kernels import attention
from aheadrank.kernels import layer as kernel_layer
from aheadrank.kernels.stored import widened


def key_mask(mask: Tensor) -> Tensor:
    """[B, T_key] padding mask -> [B, 1, 1, T_key] attention mask."""
    return mask[:, None, None, :]


def weights_key(*params: Tensor) -> tuple:
    """What changes when any of these tensors does, in place (an optimiser step, a load: the version counter) or
    by a new storage: the key under which something derived from them is kept (packed weights, folded constants).
    Not for inference tensors, which have no version counter."""
    return tuple((p._version, p.data_ptr()) for p in params)


class Embeddings(nn.Module):
    """word + token-type + position embeddings, LayerNorm, dropout (as BERT)."""

    def __init__(
        self, vocab: int, hidden: int, max_positions: int, type_vocab: int, eps: float, dropout: float
    ):
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden, padding_idx=0)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.token_type_embeddings = nn.Embedding(type_vocab, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def tokens(self, ids: Tensor, token_type: int | Tensor) -> Tensor:
        """The position-free part ``word[ids] + type[token_type]`` (what a cross-encoder can store)."""
        if isinstance(token_type, int):
            return self.word_embeddings(ids) + self.token_type_embeddings.weight[token_type]
        return self.word_embeddings(ids) + self.token_type_embeddings(token_type)

    def finish(self, token_part: Tensor, positions: Tensor) -> Tensor:
        """Add position embeddings to a ``tokens()`` result, then LayerNorm and dropout."""
        return self.dropout(self.LayerNorm(token_part + self.position_embeddings(positions)))

    def forward(self, ids: Tensor, token_type: int | Tensor, positions: Tensor) -> Tensor:
        return self.finish(self.tokens(ids, token_type), positions)


def _onednn_linear_available() -> bool:
    if os.environ.get("AHEADRANK_ONEDNN_LINEAR", "1").lower() in ("0", "false", "no", "off"):
        return False
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(
        hasattr(ops, name) for name in ("_reorder_linear_weight", "_linear_pointwise")
    )


# CPU inference runs nn.Linear through oneDNN with the weight packed once into its blocked layout, not through
# torch's default sgemm, which runs the AMD CPUs measured here at about half oneDNN's rate (bench/speed.py records
# both rates per run in bench/results/speed.json, `matmul`; the floor uses the faster; docs/results-log.md).
# AHEADRANK_ONEDNN_LINEAR=0 turns it off (services/README.md), read once at import: a process-wide switch, as
# torch's own backends flags are. The tests flip it (monkeypatch) to compare the packed and plain linears; it is
# read at each call (Linear, pack_weight, TransformerLayer.kernel_weights), never copied.
ONEDNN_LINEAR = _onednn_linear_available()
_MIN_PACKED_FEATURES = 16  # score heads and TK's kernel weights (n -> 1, 11 -> 1) stay plain
# x @ wᵀ with fewer rows in w is no faster through oneDNN (scratch timing, 1024 x 384 x 4)
_MIN_SHARED_ROWS = 8


class Linear(nn.Linear):
    """``nn.Linear`` (same parameters and state dict) whose inference on the CPU in float32 runs as oneDNN's
    linear over a packed copy of the weight (``ONEDNN_LINEAR``). A copy is made on the first such call and made again whenever the weight has changed since (its version counter or storage: an
    optimiser step, a ``load_state_dict``, an in-place fit). Anything else — gradients, autocast, another dtype
    or device, a weight created in inference mode (no version counter to trust), small layers — is
    ``F.linear`` as usual. Same function up to float32 rounding (the sums run in another order: ~1e-6
    relative)."""

    _packed: tuple[tuple[int, int], Tensor] | None = None

    def forward(self, x: Tensor) -> Tensor:
        if self._use_packed(x):
            return self._onednn(x)
        return F.linear(x, self.weight, self.bias)

    def gelu(self, x: Tensor) -> Tensor:
        """``F.gelu(self(x))``; in inference oneDNN's GELU post-op (erf form) applies it as each output is stored:
        no second pass over the activations (a cross-encoder's feed-forward: [B·T, 4n] outside the cache)."""
        if self._use_packed(x):
            return self._onednn(x, "gelu", "none")
        return F.gelu(self(x))

    def _onednn(self, x: Tensor, post_op: str = "none", algorithm: str = "") -> Tensor:
        """oneDNN's linear over the packed copy (made or remade as the weight requires), with a post-op."""
        w = self.weight
        key = weights_key(w)
        if self._packed is None or self._packed[0] != key:
            self._packed = (key, torch.ops.mkldnn._reorder_linear_weight(w.detach(), 64))
        return torch.ops.mkldnn._linear_pointwise(x, self._packed[1], self.bias, post_op, [], algorithm)

    def __getstate__(self) -> dict:
        """Pickled and deep-copied without the packed copies (oneDNN's is an opaque tensor with no storage to
        copy; both are caches); the copy packs its own on its first call."""
        state = self.__dict__.copy()
        state.pop("_packed", None)
        return state

    def _use_packed(self, x: Tensor) -> bool:
        return (
            _onednn_inference(x, self.weight)
            and min(self.in_features, self.out_features) >= _MIN_PACKED_FEATURES
            and not self.weight.is_inference()
        )


def _onednn_inference(x: Tensor, w: Tensor) -> bool:
    """Whether ``x @ wᵀ`` may run through oneDNN's packed linear: enabled, CPU float32 both, and inference (no
    gradients, no autocast, which would have run it in another dtype)."""
    return (
        ONEDNN_LINEAR
        and not torch.compiler.is_compiling()  # torch.compile packs its own weights (Inductor's freezing)
        and x.device.type == w.device.type == "cpu"
        and x.dtype == w.dtype == torch.float32
        and not torch.is_grad_enabled()
        and not torch.is_autocast_enabled("cpu")
    )


def matmul_t(x: Tensor, w: Tensor, packed: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """``x @ wᵀ (+ bias)`` for x [..., k], w [N, k] and bias [N]: through oneDNN over ``packed`` (:func:`pack_weight`
    of w; the bias added as the GEMM stores its output) when given, else a plain matmul. For a right-hand side
    shared by many calls (a query's vectors against every candidate block: TK's cosines, PreTTR's and MORES S1's
    folded scores)."""
    if packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    return x @ w.T if bias is None else torch.nn.functional.linear(x, w, bias)


def token_scores(u: Tensor, x: Tensor, packed: Tensor | None = None) -> Tensor:
    """Rows u [R, n] (or [Bq, R, n], Bq = 1 broadcasting) against every token of x [B, T, n] -> [B, R, T]. With
    ``packed`` (:func:`pack_weight` of the R rows) one oneDNN GEMM over the block's tokens, [B·T, n] × [n, R],
    seen as [B, R, T]; else a broadcast matmul (1.6x faster than [B·T, n] × [n, R] through MKL)."""
    if packed is not None:
        return matmul_t(x, u.reshape(-1, u.shape[-1]), packed).transpose(1, 2)
    return u @ x.transpose(1, 2)


def pack_weight(w: Tensor, x_like: Tensor) -> Tensor | None:
    """w [N, k] packed for :func:`matmul_t` where that runs through oneDNN (CPU float32 inference, as
    :class:`Linear`), else None. Packing costs ~80 µs: worth it once per query, not once per block."""
    usable = _onednn_inference(x_like, w) and w.dim() == 2 and w.shape[0] >= _MIN_SHARED_ROWS
    return torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), 64) if usable else None


class _QKV(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.query = Linear(hidden, hidden)
        self.key = Linear(hidden, hidden)
        self.value = Linear(hidden, hidden)


class _AddNorm(nn.Module):
    """``LN(dropout(dense(x)) + residual)``."""

    def __init__(self, d_in: int, hidden: int, eps: float, dropout: float):
        super().__init__()
        self.dense = Linear(d_in, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, residual: Tensor) -> Tensor:
        return self.finish(self.dense(x), residual)

    def finish(self, projected: Tensor, residual: Tensor) -> Tensor:
        """``LN(dropout(projected) + residual)``, for a ``dense(x)`` computed by the caller."""
        return self.LayerNorm(self.dropout(projected) + residual)


class Attention(nn.Module):
    """Multi-head attention with BERT's output sub-layer: ``LN(Wo·softmax(qk/√d)v + bo + x)``.

    Queries, keys and values may come from different sequences (cross-attention), keys/values may be
    given already projected (Reuse-S2), and only some query rows may be computed (``rows``).
    """

    def __init__(self, hidden: int, heads: int, eps: float, dropout: float, attn_dropout: float):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not a multiple of {heads} heads")
        self.heads = heads
        self.head_dim = hidden // heads
        self.attn_dropout = attn_dropout
        self.self = _QKV(hidden)
        self.output = _AddNorm(hidden, hidden, eps, dropout)

    def split(self, x: Tensor) -> Tensor:
        """[B, T, n] -> [B, heads, T, head_dim]."""
        b, t, _ = x.shape
        return x.view(b, t, self.heads, self.head_dim).transpose(1, 2)

    def project_q(self, x: Tensor) -> Tensor:
        return self.split(self.self.query(x))

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Key and value projections ``x·Wk + bk``, ``x·Wv + bv``, each [B, T, n] (what Reuse-S2 stores)."""
        return self.self.key(x), self.self.value(x)

    def context(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """q [Bq, h, Tq, dh] (Bq may be 1 and is broadcast), k/v [B, T, n] -> context [B, Tq, n]; k/v may be in a
        narrower dtype than q (float16, bfloat16 or int8 as the store hands them over): the kernels' attention
        (:func:`aheadrank.kernels.attention.context`)."""
        return attention.context(q, k, v, mask, self.attn_dropout if self.training else 0.0)

    def context_of(self, q: Tensor, source: tuple[Tensor, Tensor] | Tensor, mask: Tensor | None) -> Tensor:
        """:meth:`context` from given keys and values ``(k, v)`` (Reuse-S2), or from the states ``x`` [B, T, n]
        they are projected from (Reuse-S1): folded (:meth:`folded_context`) where that is fewer multiply-adds,
        heads·Tq < n, else x projected to keys and values, a block of documents at a time where x is stored
        narrower than q (float16, bfloat16, int8: widened as :meth:`folded_context` widens it, never the whole
        candidate set copied to float32)."""
        if isinstance(source, tuple):
            return self.context(q, *source, mask)
        if self.heads * q.shape[2] < source.shape[-1]:
            return self.folded_context(q, source, mask)
        if source.dtype == q.dtype or source.device.type != "cpu":
            return self.context(q, *self.project_kv(source.to(q.dtype)), mask)
        out = q.new_empty(source.shape[0], q.shape[2], source.shape[2])
        for rows, block in widened(source, q.dtype):
            part = None if mask is None else mask[rows]
            out[rows] = self.context(q if q.shape[0] == 1 else q[rows], *self.project_kv(block), part)
        return out

    def context_and_mean(
        self, q: Tensor, source: tuple[Tensor, Tensor] | Tensor, mask: Tensor | None
    ) -> Tensor:
        """[B, Tq + 1, n]: :meth:`context` of the Tq query rows, then the mean of v over the unmasked keys, in
        one pass: one zero query row more, whose scores are all 0 and whose weights are therefore uniform over
        the unmasked keys. The mean is read from the block of keys and values the attention widens anyway,
        instead of a second pass over every candidate's stored values (MORES' similarity residual:
        ``mean_d V``). The rows stay in one contiguous tensor, so that the output projection after it is one
        GEMM (:meth:`InteractionBlock.forward`)."""
        if mask is not None and mask.shape[-2] != 1:
            raise ValueError("context_and_mean needs a key mask that is the same for every query row")
        return self.context_of(torch.cat([q, q.new_zeros(*q.shape[:2], 1, q.shape[3])], 2), source, mask)

    def folded_context(self, q: Tensor, x: Tensor, mask: Tensor | None) -> Tensor:
        """:meth:`context` from the states x [B, T, n] the keys and values would be projected from, without
        projecting them: q [Bq, h, Tq, dh] (Bq = 1 broadcasts), mask [B, 1, 1, T] -> [B, Tq, n]. Per head and
        query row the key map is folded into the query (:meth:`fold_keys`) and the value map applied after the
        weighted sum (:meth:`folded_values`): 4·h·Tq·T·n multiply-adds for the scores and sums plus Tq·n² for
        the value map, against 4·T·n² + 4·Tq·T·n, fewer whenever h·Tq < n and T > 2·Tq (MORES S1's
        cross-attention: 12 heads × 19 rows = 228 < 384). A float16/bfloat16/int8 x is widened a block of
        documents at a time (:func:`widened`), as :meth:`context` widens stored keys and values."""
        bq, h, tq, _ = q.shape
        u = self.fold_keys(q).reshape(bq, h * tq, -1)  # once per call, not per block
        packed = pack_weight(u[0], u) if bq == 1 else None  # the same rows against every block: oneDNN
        if x.dtype == q.dtype or x.device.type != "cpu":
            return self._folded_block(u, x.to(q.dtype), mask, h, packed)
        out = q.new_empty(x.shape[0], tq, x.shape[2])
        for rows, block in widened(x, q.dtype):
            part = None if mask is None else mask[rows]
            out[rows] = self._folded_block(u if bq == 1 else u[rows], block, part, h, packed)
        return out

    def _folded_block(
        self, u: Tensor, x: Tensor, mask: Tensor | None, h: int, packed: Tensor | None
    ) -> Tensor:
        """:meth:`folded_context` of documents x [B, T, n] for folded queries u [Bq, h·Tq, n] (``packed``: u[0]
        packed for oneDNN, :func:`pack_weight`)."""
        b, t, n = x.shape
        scores = token_scores(u, x, packed)  # [B, h·Tq, T]
        if mask is not None:  # an additive [B, 1, T] bias (a masked_fill over a broadcast mask is far slower)
            scores = scores + torch.zeros(b, 1, t, dtype=scores.dtype, device=x.device).masked_fill_(
                ~mask[:, 0], float("-inf")
            )
        weighted = torch.bmm(self.attention_dropout(scores.softmax(-1)), x)  # [B, h·Tq, n]
        return self.folded_values(weighted.view(b, h, -1, n))

    def one_row_context(self, x_row: Tensor, x: Tensor, mask: Tensor | None) -> Tensor:
        """softmax(q·Kᵀ/√dh)·V for one query row per sequence, without projecting x [B, T, n] to keys and
        values: q = Wq·x_row + bq (x_row [Bq, 1, n], Bq = 1 broadcasts), mask [B or 1, 1, 1, T] -> [B, 1, n].

        Per head the key map is folded into the query, u_h = W_khᵀ·q_h / √dh (:meth:`folded_query`:
        q_h·(W_kh·x_j + b_kh) is u_h·x_j plus a constant over j, which the softmax drops), and the value map is
        applied after the weighted sum (:meth:`folded_values`: Σ_j p_j·(W_vh·x_j + b_vh) = W_vh·Σ_j p_j·x_j +
        b_vh). That is 4·H·T·n multiply-adds per sequence for the scores and the sum instead of the 4·T·n² of
        projecting every token's key and value: the [CLS]-only last layer of bert, PreTTR and MORES' last
        interaction block."""
        u = self.folded_query(x_row)  # [Bq, H, n]
        scores = u @ x.transpose(1, 2)  # [B, H, T]; Bq = 1 broadcasts
        if mask is not None:
            scores = scores.masked_fill(~mask[:, :, 0], float("-inf"))
        return self.folded_values(torch.bmm(self.attention_dropout(scores.softmax(-1)), x))

    def folded_query(self, x_row: Tensor) -> Tensor:
        """x_row [Bq, 1, n] -> u [Bq, H, n], u_h = W_khᵀ·(W_qh·x_row + b_qh) / √dh: a token's score under head h
        is u_h·x_j (up to a constant over the tokens)."""
        q = self.self.query(x_row[:, 0]).view(-1, self.heads, 1, self.head_dim)
        return self.fold_keys(q)[:, :, 0]

    def fold_keys(self, q: Tensor) -> Tensor:
        """Projected queries q [Bq, H, Tq, dh] -> u [Bq, H, Tq, n], u = W_khᵀ·q_h / √dh per head:
        q_h·(W_kh·x_j + b_kh) / √dh is u·x_j plus a constant over the tokens j, which the softmax drops."""
        h, dh = self.heads, self.head_dim
        w = self.self.key.weight
        # the 1/√dh on q, n/dh times smaller than u (MORES' [CLS] rows, 300 documents: 0.5 ms less a query)
        return torch.einsum("bhtd,hdn->bhtn", q * dh**-0.5, w.view(h, dh, w.shape[1]))

    def folded_values(self, weighted: Tensor) -> Tensor:
        """Per head (and query row) the probability-weighted sum of the tokens' states, [B, H, n] or
        [B, H, Tq, n] -> the context [B, 1 or Tq, n] (W_vh·Σ_j p_j·x_j + b_vh)."""
        if weighted.dim() == 3:
            weighted = weighted[:, :, None]
        b, h, tq, n = weighted.shape
        dh = self.head_dim
        ctx = torch.einsum("bhtn,hdn->bthd", weighted, self.self.value.weight.view(h, dh, n))
        return (ctx + self.self.value.bias.view(h, dh)).reshape(b, tq, h * dh)

    def attention_dropout(self, p: Tensor) -> Tensor:
        return F.dropout(p, self.attn_dropout, self.training)

    def probs(self, q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
        """Attention probabilities [B, h, Tq, Tk] (for PreTTR's attention-MSE loss)."""
        kh = self.split(k)
        scores = q @ kh.transpose(-1, -2) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        return scores.softmax(-1)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        kv: tuple[Tensor, Tensor] | None = None,
        source: Tensor | None = None,
        q: Tensor | None = None,
        rows: slice | None = None,
    ) -> Tensor:
        """Attention from ``x`` (rows ``rows`` only) to ``source`` (default ``x``) or to given ``kv``.

        ``q`` is an already-projected query (e.g. computed once per request and broadcast over documents).
        """
        xq = x if rows is None else x[:, rows]
        if mask is not None and rows is not None and mask.shape[-2] != 1:
            mask = mask[..., rows, :]
        src = x if source is None else source
        if kv is None and q is None and xq.shape[1] == 1 and xq.shape[0] in (1, src.shape[0]):
            # one row ([CLS] only): keys and values folded away (one_row_context)
            return self.output(self.one_row_context(xq, src, mask), xq)
        if kv is None:
            kv = self.project_kv(src)
        if q is None:
            q = self.project_q(xq)
        ctx = self.context(q, kv[0], kv[1], mask)
        return self.output(ctx, xq)


class TransformerLayer(nn.Module):
    """A BERT layer (post-LN self-attention + feed-forward); state-dict compatible with ``BertLayer``."""

    def __init__(self, hidden: int, heads: int, inner: int, eps: float, dropout: float, attn_dropout: float):
        super().__init__()
        self.attention = Attention(hidden, heads, eps, dropout, attn_dropout)
        self.intermediate = nn.Module()
        self.intermediate.dense = Linear(hidden, inner)
        self.output = _AddNorm(inner, hidden, eps, dropout)

    def __getstate__(self) -> dict:
        """Pickled and deep-copied without the kernel's weights (:meth:`kernel_weights`: addresses into this copy's
        weights and panels): a copy builds its own on its first call."""
        state = self.__dict__.copy()
        state.pop("_kernel_weights", None)
        return state

    def ffn(self, x: Tensor) -> Tensor:
        """BERT's feed-forward sub-layer: ``LN(W2·GELU(W1·x + b1) + b2 + x)``."""
        return self.output(self.intermediate.dense.gelu(x), x)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        rows: slice | None = None,
        kv: tuple[Tensor, Tensor] | None = None,
    ) -> Tensor:
        """The layer on x: the kernels' layer (:func:`aheadrank.kernels.layer.layer`: a few rows in inference in
        one kernel call, else this module's PyTorch sub-layers)."""
        whole = rows is None and kv is None and not self.training
        return kernel_layer.layer(
            self.kernel_weights() if whole else None,
            x,
            mask,
            lambda: self.ffn(self.attention(x, mask, kv=kv, rows=rows)),
        )

    def kernel_weights(self) -> kernel_layer.LayerWeights | None:
        """This layer's parameters as the kernels' layer takes them, kept until any of them changes (version
        counters, storage); None while the packed linears are off (``ONEDNN_LINEAR``) or a parameter is missing."""
        if not ONEDNN_LINEAR:
            return None
        linears = tuple(_submodule(self, path) for path in _LAYER_LINEARS)
        norms = tuple(_submodule(self, path) for path in _LAYER_NORMS)
        params = [m._parameters.get(name) for m in (*linears, *norms) for name in ("weight", "bias")]
        if any(p is None for p in params):
            return None
        key = weights_key(*params)
        cached = self.__dict__.get("_kernel_weights")
        if cached is None or cached[0] != key:
            heads = self.attention.heads
            pairs = tuple((m.weight, m.bias) for m in linears)
            cached = (
                key,
                kernel_layer.LayerWeights(heads, pairs, tuple((m.weight, m.bias, m.eps) for m in norms)),
            )
            self.__dict__["_kernel_weights"] = cached
        return cached[1]


def run_layers(layers: Sequence[TransformerLayer], x: Tensor, mask: Tensor | None) -> Tensor:
    """``layers`` one after the other on x with the key mask: a few rows in inference by one kernel call for all
    of them (:func:`aheadrank.kernels.layer.stack`), else layer by layer."""

    def one_by_one() -> Tensor:
        y = x
        for layer in layers:
            y = layer(y, mask)
        return y

    stacked = len(layers) > 1 and not any(layer.training for layer in layers)
    return kernel_layer.stack(
        [layer.kernel_weights() for layer in layers] if stacked else None, x, mask, one_by_one
    )


# the kernel's linears and LayerNorms within a TransformerLayer, in its argument order
_LAYER_LINEARS = (
    ("attention", "self", "query"),
    ("attention", "self", "key"),
    ("attention", "self", "value"),
    ("attention", "output", "dense"),
    ("intermediate", "dense"),
    ("output", "dense"),
)
_LAYER_NORMS = (("attention", "output", "LayerNorm"), ("output", "LayerNorm"))


def _submodule(module: nn.Module, path: tuple[str, ...]) -> nn.Module:
    """The submodule at ``path``, looked up in the modules' own dicts: ``nn.Module.__getattr__`` costs about a
    microsecond a step, 30 µs a layer for the lookups of :meth:`TransformerLayer.kernel_weights` on every query
    (~3 µs so)."""
    for name in path:
        module = module._modules[name]
    return module


class InteractionBlock(nn.Module):
    """MORES Interaction Block on query states Q and document states D (or their stored projections).

    ``Qx = LN(Attend(Q, D) + Q)``, ``Qs = LN(Attend(Qx, Qx) + Qx)``, ``IB = LN(FFN(Qs) + Qs)``.
    """

    def __init__(self, hidden: int, heads: int, inner: int, eps: float, dropout: float, attn_dropout: float):
        super().__init__()
        self.cross = Attention(hidden, heads, eps, dropout, attn_dropout)
        self.layer = TransformerLayer(hidden, heads, inner, eps, dropout, attn_dropout)

    def forward(
        self,
        q_states: Tensor,
        q_mask: Tensor,
        doc: tuple[Tensor, Tensor] | Tensor,
        d_mask: Tensor,
        q_proj: Tensor | None = None,
        cls_only: bool = False,
        mean_values: bool = False,
    ) -> Tensor | tuple[Tensor, Tensor]:
        """q_states [Bq, Tq, n] (Bq = 1 broadcasts over the B documents); doc the cross-attention's keys and
        values (K, V) [B, Td, n] each (Reuse-S2), or the document states D [B, Td, n] they are projected from
        (Reuse-S1: :meth:`Attention.context_of` folds the projections away where that is cheaper); masks
        [Bq, Tq] / [B, Td]. Returns [B, Tq, n], or [B, 1, n] with ``cls_only``; with ``mean_values`` also the
        mean of the values over each document's tokens [B, n], computed by the cross-attention's own pass
        (:meth:`Attention.context_and_mean`)."""
        cross, mean_v = self.cross, None
        q = cross.project_q(q_states) if q_proj is None else q_proj
        if mean_values:
            both = cross.context_and_mean(q, doc, key_mask(d_mask))
            mean_v = both[:, -1]
            # the output projection over all Tq + 1 rows, the mean's dropped after it: one GEMM over contiguous
            # rows (the [B, Tq] slice alone goes through a batched matmul per document, ~1.4x slower)
            qx = cross.output.finish(cross.output.dense(both)[:, :-1], q_states)
        else:
            qx = cross.output(cross.context_of(q, doc, key_mask(d_mask)), q_states)
        out = self.layer(qx, key_mask(q_mask), rows=slice(0, 1) if cls_only else None)
        return (out, mean_v) if mean_values else out


class SimilarityResidual(nn.Module):
    """``α·cos(q, d)`` of a pooled query vector and a pooled document vector, α learned (initially
    ``scale``). A split ranker adds it to its interaction score and starts with a zero score head
    (:func:`zero_head`), so that before training it ranks by the base model's own bi-encoder similarity and
    training adds the interaction on top (issue 14: split rankers that learn within a CPU budget)."""

    def __init__(self, scale: float = 10.0):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor(float(scale)))

    def forward(self, q: Tensor, d: Tensor) -> Tensor:
        """q [1 or B, n], d [B, n] -> [B]."""
        return self.scale * F.cosine_similarity(q, d, dim=-1, eps=1e-6)


def zero_head(head: nn.Linear) -> nn.Linear:
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


class Encoder(nn.Module):
    """Embeddings + a stack of BERT layers (a full or partial copy of the base model)."""

    def __init__(self, cfg: dict, n_layers: int):
        super().__init__()
        self.embeddings = make_embeddings(cfg)
        self.layer = nn.ModuleList(make_layer(cfg) for _ in range(n_layers))

    def run(self, x: Tensor, mask: Tensor | None, start: int = 0, stop: int | None = None) -> Tensor:
        """Run layers ``start..stop-1`` (0-based) on hidden states x with an attention mask (:func:`run_layers`)."""
        return run_layers(self.layer[start:stop], x, mask)


def _bert_shape(cfg: dict) -> tuple:
    """(hidden, heads, inner, eps, dropout, attention dropout) of a BERT config."""
    keys = (
        "hidden_size",
        "num_attention_heads",
        "intermediate_size",
        "layer_norm_eps",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
    )
    return tuple(cfg[k] for k in keys)


def make_embeddings(cfg: dict) -> Embeddings:
    """The base's embedding module (word + position + token type, LayerNorm) for a BERT config."""
    return Embeddings(
        cfg["vocab_size"],
        cfg["hidden_size"],
        cfg["max_position_embeddings"],
        cfg["type_vocab_size"],
        cfg["layer_norm_eps"],
        cfg["hidden_dropout_prob"],
    )


def make_layer(cfg: dict) -> TransformerLayer:
    return TransformerLayer(*_bert_shape(cfg))


def make_interaction_block(cfg: dict) -> InteractionBlock:
    return InteractionBlock(*_bert_shape(cfg))


def sinusoidal_positions(length: int, dim: int, device: torch.device | None = None) -> Tensor:
    """The fixed sinusoidal positional encoding of Vaswani et al. ([length, dim])."""
    pos = torch.arange(length, dtype=torch.float32, device=device)[:, None]
    i = torch.arange(0, dim, 2, dtype=torch.float32, device=device)
    angle = pos / torch.pow(10000.0, i / dim)
    pe = torch.zeros(length, dim, device=device)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : dim // 2])
    return pe
