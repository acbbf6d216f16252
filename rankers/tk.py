"""TK (Transformer-Kernel): contextualised term vectors matched by a cosine matrix and 11 RBF kernels.

``t`` = word embeddings (taken from the base model's table), contextualised by a few small Transformer layers
shared by query and document over ``t + p`` (sinusoidal positions); ``t̂ = α·t + (1−α)·context(t + p)``.
Term vectors are unit-normalised; the stored document side is those vectors (field ``doc``, no special
tokens). ``M = q̂·d̂ᵀ`` (one GEMM over all candidates' terms); kernel k: ``K_k(M_ij) = exp(−(M_ij − μ_k)² / 2σ²)``, σ = 0.1,
μ = 1, 0.9, 0.7, …, −0.9. Per kernel: ``φ_log = Σ_i log(max(Σ_j K, 1e-10))·0.01`` and
``φ_len = Σ_i Σ_j K / |d|``; ``s = β·(w_log·φ_log) + γ·(w_len·φ_len)``.

With ``tk_base`` (variant ``tk-<n>l-base``) the contextualisation starts from the base instead of from scratch:
``t`` = the base's embedding (word + learned position, LayerNorm) and the layers are its first n, so the
term vectors start as the base's own layer-n token states mixed with its embedding (``rankers/config.py``).
With ``tk_specials`` too (``tk-<n>l-base-specials``) a text is read as the base was trained, ``[CLS] text [SEP]``,
and the vectors of those two are cut off: the store keeps the text's own pieces either way.
"""

from __future__ import annotations

import math
import re
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from aheadrank.rankers.base import QueryState, Ranker
from aheadrank.rankers.base_model import base_embeddings, base_layer
from aheadrank.rankers.blocks import (
    TransformerLayer,
    key_mask,
    make_embeddings,
    matmul_t,
    pack_weight,
    run_layers,
    sinusoidal_positions,
)
from aheadrank.rankers.spec import RankerSpec, Variant, option
from aheadrank.rankers.text import positions
from torch import Tensor, nn

from aheadrank.kernels import tk as tk_kernels
from aheadrank.kernels.stored import widened

KERNEL_MU = (1.0, 0.9, 0.7, 0.5, 0.3, 0.1, -0.1, -0.3, -0.5, -0.7, -0.9)
KERNEL_SIGMA = 0.1


def kernel_features_reference(
    match: Tensor, q_mask: Tensor, d_mask: Tensor, mu: Tensor, sigma: float
) -> tuple[Tensor, Tensor]:
    """The kernel stage as the formula reads: every kernel of every (query term, document term) pair in one
    [B, Tq, Td, K] tensor. Differentiable; used for training and as the reference of :func:`kernel_features`."""
    k = torch.exp(-((match[..., None] - mu) ** 2) / (2 * sigma**2))  # [B, Tq, Td, K]
    k = k * d_mask[:, None, :, None].to(k.dtype)
    return pooled_features(k.sum(2), q_mask, d_mask)


def pooled_features(per_term: Tensor, q_mask: Tensor, d_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Σ_j K per (document, query term, kernel) [B, Tq, K] -> (φ_log, φ_len), each [B, K]."""
    qm = q_mask[..., None].to(per_term.dtype)
    log_feat = (torch.log(per_term.clamp(min=1e-10)) * 0.01 * qm).sum(1)
    doc_len = d_mask.sum(1).to(per_term.dtype).clamp(min=1.0)[:, None, None]
    len_feat = (per_term / doc_len * qm).sum(1)
    return log_feat, len_feat


# Exponents below this are raised to it: exp(-80) = 1.8e-35 is far below anything the features can see
# (Σ_j K is clamped at 1e-10 before the log, and Td · 1.8e-35 never reaches it), and it keeps exp() and the
# sum out of float32's subnormal range, where x86 runs 30x slower. Padding gets a cosine of 1e3: its
# exponent is raised to the floor too, so no mask multiplication is needed.
EXPONENT_FLOOR = -80.0
_FAR = 1e3
# Stored vectors widened for the cosine GEMM 4x the default block (4 MB of float32, 20 documents of 130 terms):
# the GEMM has only Tq columns, so fewer, taller calls pay off. `bench/online_kernels.py --threads 2 --parts blocks
# --rounds 15 --chunk 300` (bench/results/kernels-blocks.json), tk-2l: 1.19x the whole path at d = 128 (300
# candidates), 1.07x at d = 493 (75); 8x the block: 1.12x / 1.00x. A module constant only so that that bench
# can sweep it (mock.patch); no test or caller sets it.
COSINE_BLOCK_FACTOR = 4


def kernel_centres(mu: Tensor) -> tuple[float, ...]:
    """The kernels' centres as the decimals they stand for: a float32 buffer's 0.9 is 0.89999998, and its
    unrounded differences (0.19999999, 0.20000001, ...) would each need a ratio pass of their own."""
    return tuple(round(x, 6) for x in mu.tolist())


def kernel_features(
    match: Tensor, q_mask: Tensor, d_mask: Tensor, mu: Tensor, sigma: float
) -> tuple[Tensor, Tensor]:
    """match [B, Tq, Td] cosine similarities; masks [B or 1, Tq] / [B, Td] -> (φ_log, φ_len), each [B, n_kernels].

    Online (no gradient) the kernels are evaluated by ``aheadrank.kernels.tk.kernel_sums``, chained: the
    Gaussians share σ, so a kernel is its neighbour times ``e^{Δ·m/σ²}`` and a constant. TK's 11 kernels take 3 ``exp`` passes (the anchor, ``e^{0.2·m/σ²}``, ``e^{0.1·m/σ²}``) and one
    reciprocal instead of 11 ``exp``; each kernel is then a multiply, a floor and ``Σ_j``. Same values as
    :func:`kernel_features_reference` up to float32 rounding and a 1e-30 floor per value
    (``tests/rankers/test_init_and_math.py``); centres the chain cannot reach exactly are evaluated one
    ``exp`` each (:func:`kernel_features_direct`). Where the native stage applies the same chain runs
    there, one pass per document."""
    if match.requires_grad or match.dtype != torch.float32:
        return kernel_features_reference(match, q_mask, d_mask, mu, sigma)
    per_term = tk_kernels.kernel_sums(match, d_mask, kernel_centres(mu), float(sigma))
    if per_term is None:  # centres the chain cannot reach exactly
        return kernel_features_direct(match, q_mask, d_mask, mu, sigma)
    return pooled_features(per_term, q_mask, d_mask)


def kernel_features_direct(
    match: Tensor, q_mask: Tensor, d_mask: Tensor, mu: Tensor, sigma: float
) -> tuple[Tensor, Tensor]:
    """The kernels one ``exp`` each over a cache-sized block of documents, in place: ``t = match − μ_k``,
    ``t² · (−1/2σ²)``, floor, ``exp``, ``Σ_j`` (no mask multiplication: padding is a far cosine). The stage
    before the chain (kept for centres the chain cannot reach exactly, and as its benchmark reference)."""
    b, tq, td = match.shape
    far = match.masked_fill(~d_mask[:, None, :], _FAR)
    per_term = torch.empty(len(mu), b, tq, dtype=match.dtype, device=match.device)
    scale = -1.0 / (2 * sigma**2)
    block = max(1, tk_kernels.BLOCK_VALUES // max(1, tq * td))
    for lo in range(0, b, block):
        m = far[lo : lo + block]
        t = torch.empty_like(m)
        for k, centre in enumerate(mu.tolist()):
            torch.sub(m, centre, out=t)
            t.square_().mul_(scale).clamp_(min=EXPONENT_FLOOR).exp_()
            torch.sum(t, -1, out=per_term[k, lo : lo + block])
    return pooled_features(per_term.permute(1, 2, 0), q_mask, d_mask)


def cosines(q: Tensor, d: Tensor, out: Tensor | None = None, packed_q: Tensor | None = None) -> Tensor:
    """M = q̂·d̂ᵀ: q [1 or B, Tq, n], d [B, Td, n] -> [B, Tq, Td], a view of [B, Td, Tq] storage (``out``, when
    given). With one query that is one GEMM of every candidate term against the query's few terms, not a batch
    of B small ones (2.5x faster at Td = 128); the kernel stage's element-wise passes keep that layout and its
    ``Σ_j`` reduces over the strided axis."""
    b, td, tq = d.shape[0], d.shape[1], q.shape[1]
    if packed_q is not None:  # q[0] packed for oneDNN (blocks.pack_weight): inference on the CPU
        m = matmul_t(d.reshape(-1, d.shape[-1]), q[0], packed_q).view(b, td, tq)
        out = m if out is None else out.copy_(m)
    elif q.shape[0] == 1:  # out=None allocates (and keeps autograd: training goes through here)
        flat = None if out is None else out.view(-1, tq)
        out = torch.mm(d.reshape(-1, d.shape[-1]), q[0].T, out=flat).view(b, td, tq)
    else:
        out = torch.bmm(d, q.transpose(1, 2), out=out)
    return out.transpose(1, 2)


def between_specials(ids: Tensor, mask: Tensor, cls: int, sep: int, pad: int) -> tuple[Tensor, Tensor]:
    """``[CLS] text [SEP]`` of each row of ``ids`` [B, T] (right-padded with ``pad``) and its mask, [B, T + 2]."""
    b, t = ids.shape
    lens = mask.long().sum(1)
    wide = ids.new_full((b, t + 2), pad)
    wide[:, 0] = cls
    wide[:, 1 : t + 1] = ids
    wide[torch.arange(b, device=ids.device), lens + 1] = sep
    wide_mask = (torch.arange(t + 2, device=ids.device)[None] < (lens + 2)[:, None]).to(mask.dtype)
    return wide, wide_mask


class TkRanker(Ranker):
    kind = "tk"
    derived_caches = ("_q_pack",)  # a weak reference and an opaque oneDNN tensor: neither pickles

    @property
    def fresh_modules(self) -> tuple[str, ...]:  # type: ignore[override]
        """The kernel weights and the mix; the contextualisation layers too unless they come from the base."""
        kernels = ("dense_log", "dense_len", "dense_comb", "mixer")
        return kernels if self.config.tk_base else (*kernels, "layers")

    def __init__(self, config, text=None, strategy=None):
        super().__init__(config, text, strategy)
        b, n = config.bert, config.hidden
        # tk_base: the base's embedding (init_from_base loads it and the layers, whose shape config.validate
        # checked is the base's); else a word table, sinusoids added in contextualize
        if config.tk_base:
            self.embeddings = make_embeddings(b)
        else:
            self.embeddings = nn.Embedding(b["vocab_size"], n, padding_idx=0)
        self.layers = nn.ModuleList(
            TransformerLayer(
                n,
                config.tk_heads,
                config.tk_ffn or n,
                b["layer_norm_eps"],
                b["hidden_dropout_prob"],
                b["attention_probs_dropout_prob"],
            )
            for _ in range(config.tk_layers)
        )
        self.mixer = nn.Parameter(torch.tensor(0.5))
        self.register_buffer("mu", torch.tensor(KERNEL_MU), persistent=False)
        self.dense_log = nn.Linear(len(KERNEL_MU), 1, bias=False)
        self.dense_len = nn.Linear(len(KERNEL_MU), 1, bias=False)
        self.dense_comb = nn.Linear(2, 1, bias=False)  # β, γ
        for lin in (self.dense_log, self.dense_len):
            nn.init.uniform_(lin.weight, -0.014, 0.014)
        # β = γ = 1 at the start: with both layers drawn near zero (as in the TK code) their product's
        # gradient vanishes and training stalls at the uniform softmax
        nn.init.ones_(self.dense_comb.weight)

    def field_dims(self) -> dict[str, int]:
        return {"doc": self.config.hidden}

    def query_ids(self, pieces: list[int]) -> list[int]:
        return list(pieces)

    def doc_ids(self, pieces: list[int]) -> list[int]:
        return list(pieces)

    def contextualize(self, ids: Tensor, mask: Tensor) -> Tensor:
        """The unit term vectors of a text [B, T] (zero where ``mask`` is); with ``tk_specials`` the text is read
        between [CLS] and [SEP] and their two vectors are cut off."""
        if not self.config.tk_specials:
            return self.mixed(ids, mask)
        wide, wide_mask = between_specials(ids, mask, self._text().cls, self._text().sep, self._text().pad)
        h = self.mixed(wide, wide_mask)[:, 1:-1]
        return h * mask[..., None].to(h.dtype)

    def mixed(self, ids: Tensor, mask: Tensor) -> Tensor:
        """``normalize(α·t + (1−α)·context(t))`` over exactly the pieces given."""
        if self.config.tk_base:  # t = LayerNorm(word + learned position + type 0): what base layer 1 reads
            t = self.embeddings(ids, 0, positions(mask))
            x = t
        else:
            t = self.embeddings(ids)
            x = t + sinusoidal_positions(ids.shape[1], t.shape[-1], t.device)
        x = run_layers(self.layers, x, key_mask(mask))
        h = self.mixer * t + (1 - self.mixer) * x
        return F.normalize(h, dim=-1) * mask[..., None].to(h.dtype)

    def document_fields(self, ids: Tensor, mask: Tensor) -> dict[str, Tensor]:
        return {"doc": self.contextualize(ids, mask)}

    def query_state(self, ids: Tensor, mask: Tensor) -> QueryState:
        return QueryState({"q": self.contextualize(ids, mask)}, mask)

    def kernel_score(self, q: Tensor, q_mask: Tensor, d: Tensor, d_mask: Tensor) -> Tensor:
        """q [1 or B, Tq, n], d [B, Td, n] -> [B]. On the CPU, for one query and no gradients, cosines and kernels
        come from the native pass over d in its stored dtype (``aheadrank.kernels.tk.stored_sums``); elsewhere a
        stored d (float16, or int8 + scales) is widened a block of documents at a time, each block's cosines computed by
        one GEMM while it is in cache."""
        centres = kernel_centres(self.mu)
        per_term = tk_kernels.stored_sums(q, d, d_mask, centres, KERNEL_SIGMA)  # native, stored dtype
        if per_term is not None:
            return self.combine(*pooled_features(per_term, q_mask, d_mask))
        packed = self._query_packed(q) if q.shape[0] == 1 else None  # once per query, for every block
        if d.dtype == q.dtype or d.device.type != "cpu":
            match = cosines(q, d.to(q.dtype), packed_q=packed)
        else:
            terms = q.new_empty(d.shape[0], d.shape[1], q.shape[1])
            for rows, block in widened(d, q.dtype, COSINE_BLOCK_FACTOR):
                cosines(q if q.shape[0] == 1 else q[rows], block, out=terms[rows], packed_q=packed)
            match = terms.transpose(1, 2)
        return self.combine(*kernel_features(match, q_mask, d_mask, self.mu, KERNEL_SIGMA))

    def combine(self, log_feat: Tensor, len_feat: Tensor) -> Tensor:
        """The score from the pooled kernel features (φ_log, φ_len) [B, K] -> [B]."""
        both = torch.cat([self.dense_log(log_feat), self.dense_len(len_feat)], -1)
        return self.dense_comb(both).squeeze(-1)

    def _query_packed(self, q: Tensor) -> Tensor | None:
        """q[0] packed for oneDNN (:func:`pack_weight`, ~0.2 ms), kept for the next call with the same query
        tensor: a request scores its candidates in several chunks, each a call with the query state's q."""
        cached = self.__dict__.get("_q_pack")
        if cached is not None and cached[0]() is q:
            return cached[1]
        packed = pack_weight(q[0], q)
        self.__dict__["_q_pack"] = (weakref.ref(q), packed)
        return packed

    def score_batch(self, qs: QueryState, fields: dict[str, Tensor], mask: Tensor) -> Tensor:
        return self.kernel_score(qs["q"], qs.mask, fields["doc"], mask)

    def forward_pairs(self, q_ids: Tensor, q_mask: Tensor, d_ids: Tensor, d_mask: Tensor) -> Tensor:
        return self.kernel_score(
            self.contextualize(q_ids, q_mask), q_mask, self.contextualize(d_ids, d_mask), d_mask
        )

    @torch.no_grad()
    def fit_kernel_weights(
        self, lists: list[tuple[str, list[str], list[float]]], ridge: float = 1e-3, batch: int = 64
    ) -> dict:
        """Fit the kernel weights (``w_log``, ``w_len``; β = γ = 1) so that the score follows ``lists`` of (query,
        document texts, target scores) — e.g. a teacher's over the query's candidates — within each query: the
        ridge fit of ``rankers/fit.py``. The contextualisation is not touched. Returns the fit's record (pairs,
        queries, R² within queries), also kept in ``config.extra["kernel_fit"]``."""
        from aheadrank.rankers.fit import fit_to_lists
        from aheadrank.rankers.text import pad

        was_training = self.training
        self.eval()

        def features(query: str, texts: list[str]) -> Tensor:
            q_ids, q_mask = pad(self.tokenize_queries([query]), self.device)
            q = self.contextualize(q_ids, q_mask)
            rows = []
            for i in range(0, len(texts), batch):
                d_ids, d_mask = pad(self.tokenize_documents(texts[i : i + batch]), self.device)
                match = cosines(q, self.contextualize(d_ids, d_mask))
                rows.append(torch.cat(kernel_features(match, q_mask, d_mask, self.mu, KERNEL_SIGMA), -1))
            return torch.cat(rows)

        w, record = fit_to_lists(lists, features, ridge)
        k = len(KERNEL_MU)
        self.dense_log.weight.copy_(w[:k].to(self.dense_log.weight.dtype)[None])
        self.dense_len.weight.copy_(w[k:].to(self.dense_len.weight.dtype)[None])
        nn.init.ones_(self.dense_comb.weight)
        self.train(was_training)
        self.config.extra = {**self.config.extra, "kernel_fit": record}  # saved with every later checkpoint
        return record

    def init_from_base(self, sd: dict[str, Tensor]) -> None:
        """``tk_base``: the base's embedding and first layers as they are. Else the base's word embeddings, rescaled to a mean norm of √n: the scale of the sinusoidal positions
        and of the post-LN context layers. Cosine matching is scale-free, but at BERT's scale (norm ≈ 1) the
        position term drowns ``t + p`` and the context term drowns the α-mix, and training stalls."""
        if self.config.tk_base:
            self.embeddings.load_state_dict(base_embeddings(sd))
            for i, layer in enumerate(self.layers):
                layer.load_state_dict(base_layer(sd, i))
            return
        table = base_embeddings(sd)["word_embeddings.weight"]
        scale = math.sqrt(table.shape[1]) / table.norm(dim=1).mean()
        self.embeddings.weight.data.copy_(table * scale)


@dataclass
class TkOptions:
    tk_layers: int = option(2, "contextualisation layers", flag="--layers")
    tk_heads: int = option(8, "attention heads of the contextualisation (with --tk-base: the base's)")
    tk_ffn: int = option(384, "FFN width of the contextualisation (with --tk-base: the base's)")
    tk_base: bool = option(
        False,
        "the contextualisation starts from the base's embedding and first --layers layers, or from small random "
        "layers over its word embeddings",
        flag="--tk-base/--tk-scratch",
    )
    tk_specials: bool | None = option(
        None,
        "with --tk-base: each text read between [CLS] and [SEP], as the base was trained, only its own pieces "
        "matched (default: the text alone)",
        flag="--tk-specials/--tk-no-specials",
    )


def parse_tk(name: str) -> Variant | None:
    """``tk-<n>l`` (``-base`` / ``-scratch``: the contextualisation from the base's layers or from small random
    ones; neither: the default, written out so that the two never share a cache key; ``-specials`` after
    ``-base``: ``tk_specials``)."""
    if m := re.fullmatch(r"tk-(\d+)l(-base|-scratch)?(-specials)?", name):
        base = m.group(2) == "-base" if m.group(2) else TkOptions.tk_base
        options = {"tk_layers": int(m.group(1)), "tk_base": base}
        return Variant(name, name, "tk", options | ({"tk_specials": True} if m.group(3) else {}))
    return None


SPEC = RankerSpec(
    "tk",
    TkRanker,
    TkOptions,
    variants=("tk-1l", "tk-2l"),
    parse=parse_tk,
    default_variant="tk-2l",
    grammar="tk-<n>l[-base|-scratch][-specials]",
)
