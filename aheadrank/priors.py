"""Priors in the served score: a ranker's neural score combined with BM25 and the dense bi-encoder cosine.

DESIGN.md "Priors: the served score". Per query, each available feature is standardised over the query's
scored candidates (z-score: ``(x - mean) / std``, 0 where the std is 0), then combined linearly:
``final = Σ w_f · z_f``. The weights are fitted on validation queries (never test) by a grid search over the
simplex that maximises mean nDCG@10, once per *set* of available features, so a request that lacks a
feature (ad-hoc texts have no BM25; a store without the dense field has no dense score) is still scored with
weights fitted for exactly what it has. A weight may be 0: a neural score that adds nothing on validation is
left out, and the served score is then the validation-tuned BM25 + bi-encoder fusion a user would build.

The fitted :class:`Priors` are saved as ``priors.json`` inside the checkpoint; its sha256 is recorded in the
checkpoint's ``fingerprint.json`` and verified on load (rankers/checkpoint.py). A store is bound to the
model fingerprint (config + weights) only, so refitting the priors does not invalidate the stores.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from aheadrank.errors import CheckpointError
from aheadrank.evaluation import best_first

FEATURES = ("neural", "bm25", "dense")
PRIORS_FILE = "priors.json"
PRIORS_FORMAT = 1
GRID_STEP = 0.05
RRF_K = 60


def subset_key(features: Iterable[str]) -> str:
    """The canonical name of a feature set: its members in FEATURES order, joined by '+'."""
    have = set(features)
    unknown = have - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}; known: {FEATURES}")
    return "+".join(f for f in FEATURES if f in have)


def zscore(x: np.ndarray) -> np.ndarray:
    """Per-query standardisation; a constant (or single) score list becomes zeros."""
    x = np.asarray(x, dtype=np.float64)
    if x.size == 0:
        return x
    if not np.all(np.isfinite(x)):
        raise ValueError("non-finite score in a prior feature")
    std = x.std()
    return (x - x.mean()) / std if std > 0 else np.zeros_like(x)


@dataclass
class Priors:
    """Fitted combination weights per feature set, plus what the dense prior needs to be reproduced."""

    weights: dict[str, dict[str, float]]  # subset_key -> {feature: weight}
    normalisation: str = "zscore"
    dense: dict | None = None  # {"fingerprint", "max_len"} of rankers.dense.DenseEncoder
    fitted_on: dict = field(default_factory=dict)  # provenance: collection, split, queries, depth, metric
    format: int = PRIORS_FORMAT

    def weights_for(self, features: Iterable[str]) -> dict[str, float]:
        key = subset_key(features)
        if key not in self.weights:
            raise KeyError(f"no weights fitted for the feature set {key!r} (have {sorted(self.weights)})")
        return self.weights[key]

    def combine(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """The final scores of one query's candidates from whichever features are given."""
        w = self.weights_for(features)
        n = len(next(iter(features.values())))
        out = np.zeros(n, dtype=np.float64)
        for name, values in features.items():
            if len(values) != n:
                raise ValueError(f"feature {name} has {len(values)} values, expected {n}")
            if w.get(name, 0.0):
                out += w[name] * zscore(values)
        return out

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Priors:
        if data.get("format", 1) > PRIORS_FORMAT:
            raise CheckpointError(
                f"priors format {data['format']} is newer than this aheadrank ({PRIORS_FORMAT})"
            )
        if data.get("normalisation") != "zscore":
            raise CheckpointError(f"unknown priors normalisation {data.get('normalisation')!r}")
        weights = data.get("weights")
        if not isinstance(weights, dict) or not weights:
            raise CheckpointError("priors.json has no fitted weights")
        for key, w in weights.items():
            if subset_key(key.split("+")) != key or set(w) - set(key.split("+")):
                raise CheckpointError(f"priors.json: malformed weights for {key!r}: {w}")
            if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in w.values()):
                raise CheckpointError(f"priors.json: non-finite weight for {key!r}: {w}")
        return cls(
            weights={k: {f: float(v) for f, v in w.items()} for k, w in weights.items()},
            normalisation="zscore",
            dense=data.get("dense"),
            fitted_on=data.get("fitted_on", {}),
            format=int(data.get("format", PRIORS_FORMAT)),
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def read_priors(checkpoint: str | Path) -> Priors | None:
    """The checkpoint's fitted priors, or None when it has none."""
    path = Path(checkpoint) / PRIORS_FILE
    if not path.is_file():
        return None
    try:
        return Priors.from_dict(json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"{path} is not valid priors JSON: {exc}") from exc


# ---- fitting ---------------------------------------------------------------------------------------------
@dataclass
class QueryFeatures:
    """One validation query: its candidates, each feature's scores over them, and the relevance labels."""

    docids: list[str]
    features: dict[str, np.ndarray]
    qrels: dict[str, int]


def ndcg10(scores: np.ndarray, docids: list[str], qrels: Mapping[str, int]) -> float:
    """nDCG@10 with trec_eval's linear gains; the ideal ranking uses every judged-relevant document.
    Ties are broken as in every ranked list (:func:`aheadrank.evaluation.best_first`)."""
    rel = sorted((g for g in qrels.values() if g > 0), reverse=True)
    if not rel:
        return 0.0
    order = best_first(docids, scores)[:10]
    disc = 1.0 / np.log2(np.arange(2, 12))
    dcg = sum(max(qrels.get(docids[i], 0), 0) * disc[r] for r, i in enumerate(order))
    idcg = sum(g * disc[r] for r, g in enumerate(rel[:10]))
    return float(dcg / idcg)


def simplex_grid(n: int, step: float = GRID_STEP) -> list[tuple[float, ...]]:
    """Every weight vector of n non-negative multiples of ``step`` summing to 1."""
    k = round(1 / step)
    out = []
    for combo in itertools.product(range(k + 1), repeat=n - 1):
        if sum(combo) <= k:
            out.append(tuple(c / k for c in (*combo, k - sum(combo))))
    return out


def fit_weights(
    queries: list[QueryFeatures], features: Iterable[str], step: float = GRID_STEP, fixed: dict | None = None
) -> tuple[dict[str, float], float]:
    """The simplex weights over ``features`` with the best mean nDCG@10 on ``queries`` (ties: the first in
    grid order, which favours the later features; equal-score points are rare with real data).
    ``fixed`` pins some weights to 0 (e.g. ``{"neural": 0}`` for the BM25 + dense baseline)."""
    names = [f for f in FEATURES if f in set(features)]
    if not names:
        raise ValueError("no features to fit")
    z = [{f: zscore(q.features[f]) for f in names} for q in queries]
    best, best_w = -1.0, None
    for w in simplex_grid(len(names), step):
        if fixed and any(w[names.index(f)] != v for f, v in fixed.items() if f in names):
            continue
        total = 0.0
        for q, zq in zip(queries, z, strict=True):
            s = sum(wi * zq[f] for wi, f in zip(w, names, strict=True))
            total += ndcg10(np.asarray(s), q.docids, q.qrels)
        mean = total / max(1, len(queries))
        if mean > best + 1e-12:
            best, best_w = mean, w
    return dict(zip(names, best_w, strict=True)), best


def fit_priors(
    queries: list[QueryFeatures], dense: dict | None, fitted_on: dict, step: float = GRID_STEP
) -> Priors:
    """Weights for every feature set that includes the neural score (plus neural alone)."""
    have = [f for f in FEATURES if all(f in q.features for q in queries)]
    if "neural" not in have:
        raise ValueError("the neural score is missing from the validation features")
    others = [f for f in have if f != "neural"]
    weights, metrics = {}, {}
    for r in range(len(others) + 1):
        for extra in itertools.combinations(others, r):
            names = ["neural", *extra]
            w, m = fit_weights(queries, names, step)
            weights[subset_key(names)] = w
            metrics[subset_key(names)] = m
    return Priors(
        weights=weights,
        dense=dense,
        fitted_on={**fitted_on, "queries": len(queries), "grid_step": step, "val_ndcg10": metrics},
    )


# ---- the user's alternatives (baselines) ----------------------------------------------------------------
def rrf(rankings: list[list[str]], k: int = RRF_K) -> dict[str, float]:
    """Reciprocal-rank fusion of several rankings of (possibly overlapping) docids."""
    out: dict[str, float] = {}
    for ranking in rankings:
        for r, d in enumerate(ranking):
            out[d] = out.get(d, 0.0) + 1.0 / (k + r + 1)
    return out
