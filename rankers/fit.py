"""Ridge fits of a ranker's last linear layer to a teacher's scores, before (or instead of) training.

A ranker's score is linear in its last layer: TK's kernel weights over the pooled kernel features
(:meth:`TkRanker.fit_kernel_weights`), a split ranker's score head over its [CLS] output plus the similarity
residual's α over its cosine (:func:`fit_head`). Given ``lists`` of (query, document texts, target scores) —
e.g. the listwise teacher's over the query's candidates (``rankers.recipe.kernel_fit_lists``) — those weights
are fitted in closed form so that the score follows the targets within each query: features and targets are
centred per query (a ranking ignores a query's offset) and the targets z-scored per query (the scale the
listwise loss reads them at). ``ridge`` is relative to the mean variance of the features. Nothing below the
last layer is touched.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

FitList = tuple[str, list[str], list[float]]


def ridge_within_queries(
    feats: list[Tensor], targets: list[Tensor], ridge: float = 1e-3
) -> tuple[Tensor, dict]:
    """Per query: features [n_q, k] and targets [n_q] -> (weights [k] float64, the fit's record: pairs,
    queries, ridge, R² within queries). Queries with fewer than two documents must be left out by the caller."""
    if not feats:
        raise ValueError("a fit needs at least one query with two or more documents")
    xs, ys = [], []
    for x, y in zip(feats, targets, strict=True):
        x, y = x.double(), y.double().to(x.device)
        xs.append(x - x.mean(0))
        ys.append((y - y.mean()) / y.std().clamp(min=1e-6))
    x, y = torch.cat(xs), torch.cat(ys)
    lam = ridge * float(x.var(0).mean()) * len(x)
    eye = torch.eye(x.shape[1], dtype=x.dtype, device=x.device)
    w = torch.linalg.solve(x.T @ x + lam * eye, x.T @ y)
    residual = float(((x @ w - y) ** 2).sum() / (y**2).sum())
    return w, {"pairs": len(x), "queries": len(xs), "ridge": ridge, "r2": round(1.0 - residual, 4)}


def fit_to_lists(
    lists: list[FitList], features: Callable[[str, list[str]], Tensor], ridge: float = 1e-3
) -> tuple[Tensor, dict]:
    """:func:`ridge_within_queries` over ``lists``, each query's features ``features(query, texts)`` [n_q, k];
    queries with fewer than two documents are left out."""
    feats, targets = [], []
    for query, texts, target in lists:
        if len(texts) >= 2:
            feats.append(features(query, texts))
            targets.append(torch.tensor(target, dtype=torch.float64))
    return ridge_within_queries(feats, targets, ridge)


def has_head(model) -> bool:
    """Whether :func:`fit_head` applies: a score head (``bert``, MORES, PreTTR; not TK)."""
    return isinstance(getattr(model, "head", None), torch.nn.Linear)


@torch.no_grad()
def head_features(model, q_ids: Tensor, q_mask: Tensor, d_ids: Tensor, d_mask: Tensor) -> Tensor:
    """B (query, document) pairs -> [B, n (+1)]: what the score head reads, and with the similarity residual its
    cosine (the residual's term divided by its α), from one pass of the full model (``forward_pairs``)."""
    seen: list[Tensor] = []
    handle = model.head.register_forward_hook(lambda _m, inputs, _out: seen.append(inputs[0]))
    try:
        score = model.forward_pairs(q_ids, q_mask, d_ids, d_mask).float()
    finally:
        handle.remove()
    if len(seen) != 1:
        raise RuntimeError(f"{model.kind}: the score head ran {len(seen)} times in one pass, expected once")
    h = seen[0].float()
    cols = [h]
    if getattr(model.config, "sim", None):
        rest = score - model.head(h).squeeze(-1).float()
        cols.append((rest / model.sim.scale.float())[:, None])
    return torch.cat(cols, -1)


@torch.no_grad()
def fit_head(model, lists: list[FitList], ridge: float = 1e-3, batch: int = 16) -> dict:
    """Fit the score head (weights; bias 0) and, with the similarity residual, its α so that the score follows
    ``lists`` within each query (module docstring). Returns the fit's record, also kept in
    ``config.extra["head_fit"]`` (saved with every later checkpoint)."""
    from aheadrank.rankers.text import pad

    if not has_head(model):
        raise ValueError(f"{model.kind} has no score head to fit")
    was_training = model.training
    model.eval()

    def features(query: str, texts: list[str]) -> Tensor:
        q_tok = model.tokenize_queries([query])
        rows = []
        for i in range(0, len(texts), batch):
            d_ids, d_mask = pad(model.tokenize_documents(texts[i : i + batch]), model.device)
            q_ids, q_mask = pad(q_tok * len(d_ids), model.device)
            rows.append(head_features(model, q_ids, q_mask, d_ids, d_mask))
        return torch.cat(rows)

    w, record = fit_to_lists(lists, features, ridge)
    n = model.head.weight.shape[1]
    model.head.weight.copy_(w[:n].to(model.head.weight.dtype)[None])
    model.head.bias.zero_()
    if len(w) > n:
        model.sim.scale.copy_(w[n].to(model.sim.scale.dtype))
        record["alpha"] = round(float(w[n]), 4)
    model.train(was_training)
    model.config.extra = {**model.config.extra, "head_fit": record}
    return record
