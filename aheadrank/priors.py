"""Priors in the served score: a ranker's neural score combined with BM25 and the dense bi-encoder cosine (and,
where the store holds sentence windows, the bi-encoder's best window: ``window``, store/windows.py).

DESIGN.md "Priors: the served score". Per query, each available feature is standardised over the query's
scored candidates (z-score: ``(x - mean) / std``, 0 where the std is 0), then combined linearly:
``final = Σ w_f · z_f``. The weights are fitted on validation queries (never test) by a grid search over the
simplex that maximises mean nDCG@10, once per *set* of available features, so a request that lacks a
feature (ad-hoc texts on a server without the index have no BM25; a store without the dense field has no dense
score) is still scored with weights fitted for exactly what it has. A weight may be 0: a neural score that adds nothing on validation is
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

FEATURES = ("neural", "bm25", "dense", "window")
# the window prior is the best of a document's windows and the document itself (its one window where it has no
# more: the dense field's row), so it is never served without the dense feature
NEEDS = {"window": "dense"}
PRIORS_FILE = "priors.json"
# fitted_on["label_free"] of a label-free build's default weights (aheadrank.build): what fit-priors guards
LABEL_FREE_DEFAULTS = "default weights (aheadrank.build.label_free_weights)"
PRIORS_FORMAT = 1
GRID_STEP = 0.05
RRF_K = 60
NO_EVIDENCE_SLOPE = 1e-6  # Platt's slope where the combined score does not rise with relevance


def subset_key(features: Iterable[str]) -> str:
    """The canonical name of a feature set: its members in FEATURES order, joined by '+'."""
    have = set(features)
    unknown = have - set(FEATURES)
    if unknown:
        raise ValueError(f"unknown features {sorted(unknown)}; known: {FEATURES}")
    return "+".join(f for f in FEATURES if f in have)


def servable(names: Iterable[str]) -> bool:
    """Whether a feature set can be served: every feature's prerequisite (:data:`NEEDS`) is in it."""
    have = set(names)
    return all(NEEDS[f] in have for f in have if f in NEEDS)


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
    calibration: dict | None = None  # Calibration.to_dict(): absolute, calibrated scores (None: uncalibrated)

    def calibrated(self) -> Calibration | None:
        """The absolute score's calibration, or None for priors fitted before it existed."""
        return None if self.calibration is None else Calibration.from_dict(self.calibration)

    def weights_for(self, features: Iterable[str]) -> dict[str, float]:
        key = subset_key(features)
        if key not in self.weights:
            raise KeyError(f"no weights fitted for the feature set {key!r} (have {sorted(self.weights)})")
        return self.weights[key]

    def widest(self) -> dict[str, float]:
        """The weights of the largest feature set: what a stored candidate with every prior is scored with."""
        return self.weights[max(self.weights, key=lambda k: (len(k.split("+")), k))]

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

    def defaults(self) -> dict[str, dict[str, float]] | None:
        """The weights a refit keeps unless fitted ones serve better out of sample (:func:`fit_priors`' ``keep``): a
        label-free build's default weights, or those an earlier guarded refit recorded; None for any other priors."""
        if self.fitted_on.get("label_free") == LABEL_FREE_DEFAULTS:
            return self.weights
        return self.fitted_on.get("defaults")

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
            calibration=None
            if data.get("calibration") is None
            else Calibration.from_dict(data["calibration"]).to_dict(),
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


def recorded_aggregation(given: str | None, checkpoint: str | Path, with_priors: bool = True) -> str:
    """:func:`aheadrank.passages.served_aggregation` with the priors of ``checkpoint`` (what they were fitted
    with); a damaged priors.json is an error only where the priors are used (``with_priors``), as the scorer
    reads them."""
    from aheadrank.passages import served_aggregation

    try:
        priors = read_priors(checkpoint) if given is None else None
    except CheckpointError:
        if with_priors:
            raise
        priors = None
    return served_aggregation(given, priors)


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
    return _grid_search(queries, z, names, step, fixed)


def _grid_search(
    queries: list[QueryFeatures], z: list[dict[str, np.ndarray]], names: list[str], step: float, fixed
) -> tuple[dict[str, float], float]:
    """The simplex point with the best mean nDCG@10 of ``Σ w_f · z_f`` (``z``: each query's normalised
    features). Every point is scored at once per query (:func:`grid_ndcg10`); the same means as
    :func:`mean_ndcg10` point by point, so the same choice."""
    grid = [
        w
        for w in simplex_grid(len(names), step)
        if not (fixed and any(w[names.index(f)] != v for f, v in fixed.items() if f in names))
    ]
    weights = np.array(grid, dtype=np.float64)
    total = np.zeros(len(grid))
    for q, zq in zip(queries, z, strict=True):
        total += grid_ndcg10(weights, [zq[f] for f in names], q.docids, q.qrels)
    means = total / max(1, len(queries))
    best, best_w = -1.0, None
    for w, mean in zip(grid, means.tolist(), strict=True):
        if mean > best + 1e-12:
            best, best_w = mean, w
    return dict(zip(names, best_w, strict=True)), best


def grid_ndcg10(
    weights: np.ndarray, z: list[np.ndarray], docids: list[str], qrels: Mapping[str, int]
) -> np.ndarray:
    """One query's nDCG@10 under each row of ``weights`` [G, F] of ``Σ w_f · z_f`` (``z``: F arrays over its
    candidates) — :func:`ndcg10` of each row, its sums taken in the same order, ties broken as
    :func:`aheadrank.evaluation.best_first` (score, then docid, descending)."""
    rel = sorted((g for g in qrels.values() if g > 0), reverse=True)
    if not rel:
        return np.zeros(len(weights))
    order = sorted(range(len(docids)), key=lambda i: docids[i], reverse=True)  # docid descending
    scores = np.zeros((len(weights), len(docids)))  # 0 + x == x: the sums of ndcg10's Σ, term by term
    for f, zf in enumerate(z):
        scores += weights[:, f : f + 1] * np.asarray(zf, dtype=np.float64)[order]
    top = np.argsort(-scores, axis=1, kind="stable")[:, :10]  # stable: equal scores keep docid order
    gains = np.array([max(qrels.get(docids[i], 0), 0) for i in order], dtype=np.float64)[top]
    disc = 1.0 / np.log2(np.arange(2, 12))
    dcg = np.zeros(len(weights))
    for r in range(gains.shape[1]):
        dcg += gains[:, r] * disc[r]
    idcg = sum(g * disc[r] for r, g in enumerate(rel[:10]))
    return dcg / idcg


def mean_ndcg10(
    queries: list[QueryFeatures], z: list[dict[str, np.ndarray]], w: Mapping[str, float]
) -> float:
    """Mean nDCG@10 of ``Σ w_f · z_f`` over ``queries`` (``z``: each query's normalised features)."""
    total = 0.0
    for q, zq in zip(queries, z, strict=True):
        s = sum(wf * zq[f] for f, wf in w.items())
        total += ndcg10(np.asarray(s), q.docids, q.qrels)
    return total / max(1, len(queries))


def fit_priors(
    queries: list[QueryFeatures],
    dense: dict | None,
    fitted_on: dict,
    step: float = GRID_STEP,
    keep: Mapping[str, Mapping[str, float]] | None = None,
) -> Priors:
    """Weights for every feature set that includes the neural score (plus neural alone). With ``keep`` (weights
    per feature set, e.g. a label-free build's defaults), a set's fitted weights replace ``keep``'s only where
    they serve better out of sample (:func:`cross_validated`); what was decided is in ``fitted_on["guard"]``."""
    have = [f for f in FEATURES if all(f in q.features for q in queries)]
    if "neural" not in have:
        raise ValueError("the neural score is missing from the validation features")
    others = [f for f in have if f != "neural"]
    weights, metrics, guard = {}, {}, {}
    for r in range(len(others) + 1):
        for extra in itertools.combinations(others, r):
            names = ["neural", *extra]
            if not servable(names):
                continue
            key = subset_key(names)
            w, m = fit_weights(queries, names, step)
            if keep is not None and key in keep:
                cv = cross_validated(queries, names, dict(keep[key]), step=step)
                guard[key] = cv
                if not cv["fitted"]:
                    w, m = dict(keep[key]), mean_ndcg10(queries, _zscores(queries, names), keep[key])
            weights[key] = w
            metrics[key] = m
    if keep is not None:  # the weights guarded against, for a later refit to guard against them again
        fitted_on = {**fitted_on, "guard": guard, "defaults": {k: dict(w) for k, w in keep.items()}}
    return Priors(
        weights=weights,
        dense=dense,
        fitted_on={**fitted_on, "queries": len(queries), "grid_step": step, "val_ndcg10": metrics},
    )


GUARD_FOLDS = 5
GUARD_ALPHA = 0.05


def _zscores(queries: list[QueryFeatures], names: Iterable[str]) -> list[dict[str, np.ndarray]]:
    return [{f: zscore(q.features[f]) for f in names} for q in queries]


def cross_validated(
    queries: list[QueryFeatures],
    names: list[str],
    keep: dict[str, float],
    folds: int = GUARD_FOLDS,
    alpha: float = GUARD_ALPHA,
    step: float = GRID_STEP,
    seed: int = 0,
) -> dict:
    """Whether weights fitted on ``queries`` serve better than ``keep`` on queries they were not fitted on: the
    queries split into ``folds`` folds (seeded), each fold ranked by the weights fitted on the others and by
    ``keep``; ``fitted`` is True where the fitted weights' nDCG@10 is higher on average over every query and a
    paired t-test gives p < ``alpha``. A grid fit on a few queries chases their noise: on SciFact, weights fitted
    on 5 to 809 judged queries each served below a label-free build's defaults
    (bench/results/few-judgments/)."""
    from aheadrank.evaluation import paired_test

    rec = {"queries": len(queries), "folds": min(folds, len(queries)), "alpha": alpha, "fitted": False}
    if len(queries) < 2:
        return {**rec, "why": "fewer than 2 queries"}
    z = _zscores(queries, names)
    kept = [
        ndcg10(sum(w * zq[f] for f, w in keep.items()), q.docids, q.qrels)
        for q, zq in zip(queries, z, strict=True)
    ]
    order = np.random.default_rng(seed).permutation(len(queries))
    fitted = [0.0] * len(queries)
    for k in range(rec["folds"]):
        held = set(order[k :: rec["folds"]].tolist())
        w, _ = fit_weights([q for i, q in enumerate(queries) if i not in held], names, step)
        for i in held:
            fitted[i] = ndcg10(sum(wf * z[i][f] for f, wf in w.items()), queries[i].docids, queries[i].qrels)
    c = paired_test(
        {str(i): v for i, v in enumerate(kept)}, {str(i): v for i, v in enumerate(fitted)}, margins=()
    )
    diff = float(np.mean(fitted) - np.mean(kept))
    return {
        **rec,
        "kept_ndcg10": round(float(np.mean(kept)), 4),
        "fitted_ndcg10": round(float(np.mean(fitted)), 4),
        "diff": round(diff, 4),
        "p": None if math.isnan(c.p) else c.p,
        "fitted": bool(diff > 0 and not math.isnan(c.p) and c.p < alpha),
    }


# ---- absolute, calibrated scores -------------------------------------------------------------------------
@dataclass
class Calibration:
    """A score that does not depend on the other candidates, mapped to the probability of relevance.

    Each feature is standardised by *fixed* statistics (its mean and std over every candidate of the fitting
    queries), the standardised features are combined by weights fitted for that normalisation (nDCG@10, the
    same simplex grid as :func:`fit_weights`), and the combination ``s`` is mapped by Platt scaling:
    ``P(relevant) = sigmoid(a · s + b)``, ``a > 0`` so the mapping keeps the ranking. :meth:`logits` is
    ``a · s + b`` (what ``raw_scores`` clients get); one per feature set, like the weights."""

    stats: dict[str, list[float]]  # feature -> [mean, std] over the fitting candidates
    weights: dict[str, dict[str, float]]  # subset_key -> {feature: weight}
    platt: dict[str, list[float]]  # subset_key -> [a, b]
    method: str = "platt"
    fitted_on: dict = field(default_factory=dict)

    def logits(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """The calibrated log-odds of each candidate, from whichever features are given (each candidate's
        own values only: the same document gets the same score in any request)."""
        key = subset_key(features)
        if key not in self.platt:
            raise KeyError(f"no calibration fitted for the feature set {key!r} (have {sorted(self.platt)})")
        a, b = self.platt[key]
        return a * self.combine(features) + b

    def probabilities(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.logits(features)))

    def combine(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        w = self.weights[subset_key(features)]
        n = len(next(iter(features.values())))
        out = np.zeros(n, dtype=np.float64)
        for name, values in features.items():
            values = np.asarray(values, dtype=np.float64)
            if len(values) != n:
                raise ValueError(f"feature {name} has {len(values)} values, expected {n}")
            if not np.all(np.isfinite(values)):
                raise ValueError(f"non-finite score in the feature {name}")
            if w.get(name, 0.0):
                out += w[name] * self.normalise(name, values)
        return out

    def normalise(self, name: str, values: np.ndarray) -> np.ndarray:
        mean, std = self.stats[name]
        return (np.asarray(values, dtype=np.float64) - mean) / std

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Calibration:
        if not isinstance(data, dict) or data.get("method") != "platt":
            raise CheckpointError(f"priors.json: unknown calibration {str(data)[:80]!r}")
        try:
            stats = {f: [float(m), float(s)] for f, (m, s) in data["stats"].items()}
            weights = {k: {f: float(v) for f, v in w.items()} for k, w in data["weights"].items()}
            platt = {k: [float(a), float(b)] for k, (a, b) in data["platt"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"priors.json: malformed calibration: {exc}") from exc
        for f, (m, s) in stats.items():
            if f not in FEATURES or not (math.isfinite(m) and math.isfinite(s) and s > 0):
                raise CheckpointError(f"priors.json: bad calibration statistics for {f!r}: {[m, s]}")
        for key in platt:
            if key not in weights or set(key.split("+")) - set(stats) or subset_key(key.split("+")) != key:
                raise CheckpointError(f"priors.json: calibration for {key!r} has no weights or statistics")
            a, b = platt[key]
            if not (math.isfinite(a) and math.isfinite(b) and a > 0):
                raise CheckpointError(f"priors.json: bad Platt parameters for {key!r}: {[a, b]}")
        return cls(stats, weights, platt, "platt", dict(data.get("fitted_on", {})))


def fixed_stats(queries: list[QueryFeatures], names: Iterable[str]) -> dict[str, list[float]]:
    """Each feature's mean and std over every candidate of ``queries`` (a constant feature gets std 1)."""
    out = {}
    for f in names:
        x = np.concatenate([np.asarray(q.features[f], dtype=np.float64) for q in queries])
        if x.size == 0 or not np.all(np.isfinite(x)):
            raise ValueError(f"no (or non-finite) values of the feature {f} to fit the calibration on")
        std = float(x.std())
        out[f] = [float(x.mean()), std if std > 0 else 1.0]
    return out


def platt_fit(scores: np.ndarray, labels: np.ndarray, iterations: int = 100) -> tuple[float, float]:
    """Platt scaling: ``(a, b)`` of ``P(y=1 | s) = sigmoid(a·s + b)`` by Newton's method on the log-loss,
    with Platt's smoothed targets ``(N₊+1)/(N₊+2)`` and ``1/(N₋+2)`` (no infinite odds on separable data)."""
    s = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    pos, neg = float(y.sum()), float(len(y) - y.sum())
    if pos == 0 or neg == 0:
        raise ValueError("calibration needs relevant and non-relevant candidates among the fitting queries")
    t = np.where(y > 0, (pos + 1) / (pos + 2), 1 / (neg + 2))
    a, b = 1.0, math.log((pos + 1) / (neg + 1))
    for _ in range(iterations):
        z = np.clip(a * s + b, -50, 50)
        p = 1.0 / (1.0 + np.exp(-z))
        g = np.array([np.sum((p - t) * s), np.sum(p - t)])
        h = p * (1 - p)
        hess = np.array([[np.sum(h * s * s), np.sum(h * s)], [np.sum(h * s), np.sum(h)]]) + 1e-9 * np.eye(2)
        step = np.linalg.solve(hess, g)
        a, b = a - step[0], b - step[1]
        if np.max(np.abs(step)) < 1e-10:
            break
    return float(a), float(b)


def fit_calibration(
    queries: list[QueryFeatures],
    fitted_on: dict | None = None,
    step: float = GRID_STEP,
    subsets: Iterable[Iterable[str]] | None = None,
    weights: Mapping[str, Mapping[str, float]] | None = None,
) -> Calibration:
    """Fit the absolute, calibrated score on judged queries: each query's candidates with their features
    (:class:`QueryFeatures`: docids, ``{feature: scores}``, qrels — real judgments or the label-free
    pseudo-queries' ones). Per feature set (default: every set with the neural score that all queries have,
    as :func:`fit_priors`): fixed statistics, weights (nDCG@10 grid, or ``weights[key]`` where given: the
    label-free build's default weights) and Platt's ``(a, b)`` on the pooled candidates (relevant: a qrel > 0;
    unjudged counts as not relevant). ``fitted_on["labels"]`` says what the qrels are: ``judged`` (the default)
    or ``pseudo-queries`` (each label-free pseudo-query's source document, the one known relevant)."""
    if not queries:
        raise ValueError("no queries to fit the calibration on")
    have = [f for f in FEATURES if all(f in q.features for q in queries)]
    if subsets is None:
        if "neural" not in have:
            raise ValueError("the neural score is missing from the calibration features")
        others = [f for f in have if f != "neural"]
        subsets = [
            ["neural", *extra]
            for r in range(len(others) + 1)
            for extra in itertools.combinations(others, r)
            if servable(["neural", *extra])
        ]
    keys = [subset_key(names) for names in subsets]
    for key in keys:
        if set(key.split("+")) - set(have):
            raise ValueError(f"the feature set {key} is not in every query's features (have {have})")
    stats = fixed_stats(queries, have)
    cal = Calibration(stats, {}, {}, "platt", {})
    labels = np.concatenate([[q.qrels.get(d, 0) > 0 for d in q.docids] for q in queries]).astype(float)
    metrics = {}
    for key in keys:
        names = key.split("+")
        z = [{f: cal.normalise(f, q.features[f]) for f in names} for q in queries]
        if weights is not None and key in weights:  # given: only its nDCG@10 on these queries is measured
            w = {f: float(weights[key].get(f, 0.0)) for f in names}
            metrics[key] = mean_ndcg10(queries, z, w)
        else:
            w, metrics[key] = _grid_search(queries, z, names, step, None)
        cal.weights[key] = w
        s = np.concatenate([sum(w[f] * zq[f] for f in names) for zq in z])
        a, b = platt_fit(s, labels)
        if a <= NO_EVIDENCE_SLOPE:  # the score does not rise with relevance here: every text gets the base
            rate = labels.mean()  # rate (calibrated, uninformative), still ordered by the combination
            a, b = NO_EVIDENCE_SLOPE, math.log(rate / (1 - rate))
        cal.platt[key] = [a, b]
    cal.fitted_on = {
        "labels": "judged",
        **(fitted_on or {}),
        "queries": len(queries),
        "candidates": int(labels.size),
        "relevant": int(labels.sum()),
        "grid_step": step,
        "val_ndcg10": metrics,
    }
    return cal


def expected_calibration_error(probabilities, labels, bins: int = 10) -> tuple[float, list[dict]]:
    """ECE over ``bins`` equal-width probability bins (the weighted mean |mean prediction - fraction
    relevant|) and the reliability table: per non-empty bin its range, count, mean prediction, fraction."""
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    idx = np.minimum((p * bins).astype(int), bins - 1)
    ece, table = 0.0, []
    for k in range(bins):
        m = idx == k
        if not m.any():
            continue
        conf, frac = float(p[m].mean()), float(y[m].mean())
        ece += m.sum() / len(p) * abs(conf - frac)
        table.append({"lo": k / bins, "hi": (k + 1) / bins, "n": int(m.sum()), "mean_p": conf, "frac": frac})
    return float(ece), table


# ---- the user's alternatives (baselines) ----------------------------------------------------------------
def rrf(rankings: list[list[str]], k: int = RRF_K) -> dict[str, float]:
    """Reciprocal-rank fusion of several rankings of (possibly overlapping) docids."""
    out: dict[str, float] = {}
    for ranking in rankings:
        for r, d in enumerate(ranking):
            out[d] = out.get(d, 0.0) + 1.0 / (k + r + 1)
    return out
