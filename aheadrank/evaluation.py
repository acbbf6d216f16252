"""Evaluation harness: TREC run files, trec_eval-compatible metrics, paired comparison of two runs.

Conventions (those of ``trec_eval -c``, checked against the trec_eval 9.0.4 binary in the tests):

* a query's documents are ranked by score, highest first; equal scores are ordered by docid in
  *descending* string order (trec_eval's tie rule); the rank column of a run file is ignored;
* a document is relevant when its grade is >= 1; unjudged documents count as non-relevant;
* the queries averaged over are the qrels' queries with at least one relevant document: a query the run
  lacks scores 0 on every measure, a run query without judgements is ignored. One departure from
  trec_eval: a judged query with no relevant document is *skipped* (trec_eval would count it as 0), as
  no ranking can do anything for it.

Measures (names case-insensitive; trec_eval's own names are accepted, and results are keyed by the name
the caller gave):

=============  =====================  ==============================================================
name           trec_eval              value for one query (R = number of relevant documents)
=============  =====================  ==============================================================
``nDCG@k``     ``ndcg_cut_k``         sum_{r<=k} max(g_r, 0)/log2(r+1) over the ideal ordering of the
                                      qrels' positive grades, cut at k (``nDCG``: no cut-off, ``ndcg``)
``MRR@k``      ``recip_rank`` (cut)   1/rank of the first relevant document if that rank <= k, else 0
                                      (``MRR``: no cut-off, ``recip_rank``)
``R@k``        ``recall_k``           relevant documents in the top k / R
``P@k``        ``P_k``                relevant documents in the top k / k
``MAP``        ``map``                sum over relevant retrieved of precision at their rank / R
                                      (``MAP@k``: ``map_cut_k``)
=============  =====================  ==============================================================

Run files have six whitespace-separated columns ``qid Q0 docid rank score tag`` (plain or gzip).
Qrels are read by :func:`indexer.topics.read_qrels` (TREC ``qid 0 docid rel`` or BEIR TSV).

Paired comparison (:func:`compare`, :func:`paired_test`): run A is the baseline, run B the candidate.

* two-sided paired t-test of the per-query differences B_i - A_i (``scipy.stats.ttest_rel``);
* non-inferiority at margin delta, as in the MORES paper (Gao et al., Section 4.1, after Jayasinghe
  et al. 2015): the paper rejects H0': mu_A - mu_B > delta * mu_A ("delta = 2% / 5% of the mean of the
  BERT ranker"). That null is mu_B - (1 - delta) mu_A < 0, i.e. E[d] < 0 for the per-query
  d_i = B_i - (1 - delta) A_i. We run the one-sided one-sample t-test of H0: E[d] <= 0 against
  H1: E[d] > 0 on d (n - 1 degrees of freedom; ``scipy.stats.ttest_rel(B, (1 - delta) A,
  alternative="greater")``); B is non-inferior at that margin when p < alpha (0.05). Because the margin
  is a fraction of A's *true* mean, A's sampling variance enters the test through d. For reference,
  ``p_fixed_margin`` is the variant that treats delta * mean(A) as a known constant: one-sided test of
  B_i - A_i + delta * mean(A) > 0 (same mean, variance of B - A only); verdicts use ``p``.
* how precise the difference is: its two-sided (1 - alpha) t confidence interval (``ci_low``, ``ci_high``), and
  the smallest true mean difference the two-sided test would detect with probability :data:`POWER` (80 %) at
  this many queries with the observed per-query spread (``detectable``, from the noncentral t distribution;
  :func:`detectable_difference`). A difference well inside ``detectable`` is one the queries cannot tell from
  zero either way: :func:`queries_needed` says how many queries would.
* degenerate samples: with fewer than two queries t and p are NaN (never significant); with zero
  variance the test takes its limit (t = +-inf, p = 0 or 1; p = 1 when the mean is exactly 0).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from aheadrank.errors import AheadrankError
from aheadrank.fsfaults import atomic_write_text
from aheadrank.textio import text_lines

Run = dict[str, dict[str, float]]
Qrels = dict[str, dict[str, int]]

DEFAULT_METRICS = ("nDCG@10", "MRR@10", "R@100", "MAP", "P@10")
DEFAULT_MARGINS = (0.02, 0.05)
DEFAULT_ALPHA = 0.05
POWER = 0.8  # the probability of detection :func:`detectable_difference` and :func:`queries_needed` are at

__all__ = [
    "DEFAULT_ALPHA",
    "DEFAULT_MARGINS",
    "DEFAULT_METRICS",
    "POWER",
    "Coverage",
    "EvaluationError",
    "Measure",
    "NonInferiority",
    "PairedComparison",
    "Qrels",
    "Run",
    "RunFileError",
    "best_first",
    "by_score",
    "compare",
    "coverage",
    "detectable_difference",
    "evaluate",
    "mean_interval",
    "paired_test",
    "parse_metric",
    "per_query",
    "queries_needed",
    "ranking",
    "read_run",
    "write_run",
]


class EvaluationError(AheadrankError):
    """Bad evaluation input: an unknown metric, nothing to evaluate, mismatched per-query values."""


class RunFileError(EvaluationError):
    """A malformed TREC run file (the message names file and line) or a run that cannot be written."""


# ----------------------------------------------------------------------------------------------- run files


def _text_lines(path: Path) -> Iterable[tuple[int, str]]:
    return text_lines(path, RunFileError, what="cannot read run file")


def read_run(path: str | Path) -> Run:
    """Read a TREC run file into ``{qid: {docid: score}}``.

    Every non-blank line must have six columns ``qid Q0 docid rank score tag`` with an integer rank and
    a finite score; a document listed twice for the same query is an error. The rank column is not used
    for ranking (scores are, as in trec_eval).
    """
    path = Path(path)
    run: Run = {}
    first_seen: dict[tuple[str, str], int] = {}
    for lineno, line in _text_lines(path):
        columns = line.split()
        if not columns:
            continue
        where = f"{path}:{lineno}"
        if len(columns) != 6:
            raise RunFileError(f"{where}: {len(columns)} columns, expected 6 (qid Q0 docid rank score tag)")
        qid, _q0, docid, rank_text, score_text, _tag = columns
        try:
            int(rank_text)
        except ValueError:
            raise RunFileError(f"{where}: rank {rank_text!r} is not an integer") from None
        try:
            score = float(score_text)
        except ValueError:
            raise RunFileError(f"{where}: score {score_text!r} is not a number") from None
        if not math.isfinite(score):
            raise RunFileError(f"{where}: score {score_text!r} is not finite")
        if (qid, docid) in first_seen:
            raise RunFileError(
                f"{where}: document {docid!r} listed again for query {qid!r} "
                f"(first on line {first_seen[qid, docid]})"
            )
        first_seen[qid, docid] = lineno
        run.setdefault(qid, {})[docid] = score
    return run


def best_first(docids: Sequence[str], scores: Sequence[float]) -> list[int]:
    """Positions of ``docids`` best first: score descending, equal scores by docid descending (trec_eval's
    rule). The one order of every ranked list aheadrank evaluates or produces (``rerank-run``, the service,
    the priors fit, the baselines), so a served list and its evaluation agree on ties."""
    return sorted(range(len(docids)), key=lambda i: (scores[i], docids[i]), reverse=True)


def by_score(pairs: Iterable[tuple[str, float]]) -> list[tuple[str, float]]:
    """``(docid, score)`` pairs in the order of :func:`best_first`."""
    pairs = list(pairs)
    return [pairs[i] for i in best_first([d for d, _ in pairs], [s for _, s in pairs])]


def ranking(docs: Mapping[str, float]) -> list[str]:
    """Docids in trec_eval order (:func:`best_first`)."""
    return [docid for docid, _ in by_score(docs.items())]


def _qid_order(qid: str) -> tuple[int, int, str]:
    return (0, int(qid), qid) if qid.isdigit() else (1, 0, qid)


def _check_token(kind: str, value: object) -> str:
    if not isinstance(value, str) or not value or any(ch.isspace() for ch in value):
        raise RunFileError(f"{kind} {value!r} cannot be written to a TREC run (empty or contains whitespace)")
    return value


def write_run(path: str | Path, run: Mapping[str, Mapping[str, float]], tag: str = "aheadrank") -> int:
    """Write ``run`` as a TREC run file (atomically); returns the number of lines written.

    Queries in numeric order when their ids are numbers (else string order, numbers first); within a
    query, documents in :func:`ranking` order with ranks from 1, so the rank column agrees with the order
    trec_eval evaluates. Scores are written with full precision (``repr``) so reading them back is exact.
    """
    path = Path(path)
    _check_token("tag", tag)
    lines = []
    for qid in sorted(run, key=_qid_order):
        _check_token("query id", qid)
        docs = run[qid]
        for docid, score in docs.items():
            _check_token("docid", docid)
            if not isinstance(score, (int, float, np.number)) or not math.isfinite(float(score)):
                raise RunFileError(
                    f"query {qid!r}, document {docid!r}: score {score!r} is not a finite number"
                )
        for rank, docid in enumerate(ranking({d: float(s) for d, s in docs.items()}), start=1):
            lines.append(f"{qid} Q0 {docid} {rank} {float(docs[docid])!r} {tag}\n")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        atomic_write_text(path, "".join(lines))
    except OSError as exc:
        raise RunFileError(f"cannot write run file {path}: {exc.strerror or exc}") from None
    return len(lines)


# ----------------------------------------------------------------------------------------------- measures

_KINDS = {
    "ndcg": "ndcg",
    "ndcg_cut": "ndcg",
    "mrr": "rr",
    "rr": "rr",
    "recip_rank": "rr",
    "r": "recall",
    "recall": "recall",
    "p": "p",
    "precision": "p",
    "map": "ap",
    "map_cut": "ap",
}
_NEEDS_CUTOFF = {"recall", "p"}
_DISPLAY = {"ndcg": "nDCG", "rr": "MRR", "recall": "R", "p": "P", "ap": "MAP"}
_METRIC_RE = re.compile(r"^([a-z_]+?)(?:[@_.](\d+))?$")


@dataclass(frozen=True)
class Measure:
    """One measure: ``kind`` in {ndcg, rr, recall, p, ap} and an optional rank cut-off."""

    kind: str
    cutoff: int | None = None

    @property
    def name(self) -> str:
        """Canonical name, e.g. ``nDCG@10``, ``MRR@10``, ``R@100``, ``P@10``, ``MAP``."""
        base = _DISPLAY[self.kind]
        return base if self.cutoff is None else f"{base}@{self.cutoff}"

    def value(self, grades: np.ndarray, ideal: np.ndarray, num_rel: int) -> float:
        """This measure for one query.

        ``grades``: the judged grade of each retrieved document in ranked order (0 when unjudged);
        ``ideal``: the qrels' positive grades, highest first; ``num_rel``: documents with grade >= 1.
        """
        top = grades if self.cutoff is None else grades[: self.cutoff]
        relevant = top >= 1
        if self.kind == "p":
            return float(relevant.sum()) / float(self.cutoff)  # type: ignore[arg-type]
        if num_rel == 0:
            return 0.0
        if self.kind == "recall":
            return float(relevant.sum()) / num_rel
        if self.kind == "rr":
            hits = np.flatnonzero(relevant)
            return 1.0 / (int(hits[0]) + 1) if hits.size else 0.0
        if self.kind == "ap":
            ranks = np.flatnonzero(relevant) + 1
            return float((np.arange(1, ranks.size + 1) / ranks).sum()) / num_rel
        # ndcg: gain = grade (positive grades only), discount log2(rank + 1), ideal from the qrels
        best = ideal if self.cutoff is None else ideal[: self.cutoff]
        idcg = float((best / np.log2(np.arange(2, best.size + 2))).sum())
        gains = np.maximum(top, 0)
        dcg = float((gains / np.log2(np.arange(2, gains.size + 2))).sum())
        return dcg / idcg if idcg > 0 else 0.0


def parse_metric(name: str) -> Measure:
    """``nDCG@10`` / ``ndcg_cut_10`` / ``ndcg_cut.10``, ``MRR@10`` / ``recip_rank``, ``R@100`` /
    ``recall_100``, ``P@10`` / ``P_10``, ``MAP`` / ``map`` / ``map_cut_10`` -> :class:`Measure`."""
    match = _METRIC_RE.match(name.strip().lower())
    kind = _KINDS.get(match.group(1)) if match else None
    if match is None or kind is None:
        raise EvaluationError(
            f"unknown metric {name!r}; use nDCG@k, MRR@k, R@k, P@k, MAP (or nDCG, MRR, MAP@k), "
            "or trec_eval names such as ndcg_cut_10, recip_rank, recall_100, P_10, map"
        )
    cutoff = int(match.group(2)) if match.group(2) is not None else None
    if cutoff is None and (kind in _NEEDS_CUTOFF or match.group(1) in ("ndcg_cut", "map_cut")):
        raise EvaluationError(f"metric {name!r} needs a cut-off, e.g. {_DISPLAY[kind]}@10")
    if cutoff is not None and cutoff < 1:
        raise EvaluationError(f"metric {name!r}: the cut-off must be at least 1")
    return Measure(kind, cutoff)


def _measures(metrics: str | Sequence[str]) -> dict[str, Measure]:
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    if not names:
        raise EvaluationError("no metric given")
    return {name: parse_metric(name) for name in names}


def evaluated_qids(qrels: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The qrels queries with a relevant document (grade 1 or more): the ones every mean is taken over."""
    return sorted((q for q, judged in qrels.items() if any(g >= 1 for g in judged.values())), key=_qid_order)


@dataclass(frozen=True)
class Coverage:
    """How a run's queries meet the qrels' queries."""

    evaluated: int  # qrels queries with a relevant document: the set every mean is taken over
    retrieved: int  # ... of which the run has results
    missing: int  # ... of which the run has none (they score 0)
    no_relevant: int  # qrels queries without a relevant document (skipped)
    unjudged: int  # run queries the qrels do not mention (ignored)
    # the share of the run's top 10 documents of the retrieved queries the qrels judge, any grade (ir_measures'
    # Judged@10): near 0 when the qrels are of another collection whose query ids happen to match; None: none retrieved
    judged_at_10: float | None = None


def coverage(run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]]) -> Coverage:
    evaluated = evaluated_qids(qrels)
    tops = {q: ranking(run[q])[:10] for q in evaluated if run.get(q)}
    shown = sum(map(len, tops.values()))
    judged = sum(d in qrels[q] for q, top in tops.items() for d in top)
    return Coverage(
        evaluated=len(evaluated),
        retrieved=len(tops),
        missing=len(evaluated) - len(tops),
        no_relevant=len(qrels) - len(evaluated),
        unjudged=sum(1 for q in run if q not in qrels),
        judged_at_10=judged / shown if shown else None,
    )


def per_query(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    metrics: str | Sequence[str] = DEFAULT_METRICS,
) -> dict[str, dict[str, float]]:
    """``{metric: {qid: value}}`` for every qrels query with a relevant document (0 where the run lacks
    it); keys are the metric names as given."""
    measures = _measures(metrics)
    qids = evaluated_qids(qrels)
    if not qids:
        raise EvaluationError("nothing to evaluate: no query in the qrels has a relevant document")
    values: dict[str, dict[str, float]] = {name: {} for name in measures}
    for qid in qids:
        judged = qrels[qid]
        docs = ranking(run.get(qid, {}))
        grades = np.array([judged.get(d, 0) for d in docs], dtype=np.float64)
        ideal = np.array(sorted((g for g in judged.values() if g > 0), reverse=True), dtype=np.float64)
        num_rel = sum(1 for g in judged.values() if g >= 1)
        for name, measure in measures.items():
            values[name][qid] = measure.value(grades, ideal, num_rel)
    return values


def evaluate(
    run: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    metrics: str | Sequence[str] = DEFAULT_METRICS,
) -> dict[str, float]:
    """``{metric: mean over the evaluated queries}`` (see :func:`per_query`)."""
    return {name: float(np.mean(list(v.values()))) for name, v in per_query(run, qrels, metrics).items()}


# ------------------------------------------------------------------------------------ paired comparison


def _t_test(x: np.ndarray, alternative: str) -> tuple[float, float]:
    """One-sample t-test of mean(x) against 0 with the degenerate cases made explicit."""
    if x.size < 2:
        return math.nan, math.nan
    if np.all(x == x[0]):
        mean = float(x[0])
        if mean == 0.0:
            return math.nan, 1.0
        t = math.copysign(math.inf, mean)
        if alternative == "greater":
            return t, 0.0 if mean > 0 else 1.0
        return t, 0.0
    from scipy import stats

    result = stats.ttest_1samp(x, 0.0, alternative=alternative)
    return float(result.statistic), float(result.pvalue)


def mean_interval(x: np.ndarray, alpha: float = DEFAULT_ALPHA) -> tuple[float, float]:
    """The two-sided (1 - ``alpha``) t confidence interval of mean(x); NaN with fewer than two values."""
    if x.size < 2:
        return math.nan, math.nan
    from scipy import stats

    mean = float(x.mean())
    half = float(stats.t.ppf(1 - alpha / 2, x.size - 1)) * float(x.std(ddof=1)) / math.sqrt(x.size)
    return mean - half, mean + half


def _power(effect: float, n: int, alpha: float) -> float:
    """The probability that the two-sided one-sample t-test at ``alpha`` over ``n`` values rejects a zero mean
    when the true mean is ``effect`` standard deviations (noncentral t)."""
    from scipy import stats

    df, nc = n - 1, abs(effect) * math.sqrt(n)
    crit = float(stats.t.ppf(1 - alpha / 2, df))
    upper, lower = float(stats.nct.sf(crit, df, nc)), float(stats.nct.cdf(-crit, df, nc))
    # far from zero scipy's tails can come back NaN: there the far tail is nil and the near one whole
    upper = upper if math.isfinite(upper) else 1.0
    lower = lower if math.isfinite(lower) else 0.0
    return min(1.0, upper + lower)


def detectable_difference(sd: float, n: int, alpha: float = DEFAULT_ALPHA, power: float = POWER) -> float:
    """The smallest true mean difference that a two-sided paired t-test at ``alpha`` over ``n`` queries detects
    with probability ``power``, where the per-query differences have standard deviation ``sd``; NaN with fewer
    than two queries or an undefined ``sd``."""
    if n < 2 or not math.isfinite(sd):
        return math.nan
    if sd == 0.0:
        return 0.0
    from scipy.optimize import brentq

    high = 1.0
    while _power(high, n, alpha) < power:  # an effect (in SDs) large enough to bracket the root
        high *= 2
    return float(brentq(lambda e: _power(e, n, alpha) - power, 0.0, high, xtol=1e-10)) * sd


def queries_needed(
    diff: float, sd: float, alpha: float = DEFAULT_ALPHA, power: float = POWER, most: int = 10**7
) -> int | None:
    """How many queries a two-sided paired t-test at ``alpha`` needs to detect a true mean difference ``diff`` with
    probability ``power`` when the per-query differences have standard deviation ``sd`` (the smallest such n, at
    least 2); None where ``diff`` is 0 or not finite, ``sd`` not finite, or it would take more than ``most``."""
    if not (math.isfinite(diff) and math.isfinite(sd)) or diff == 0.0:
        return None
    if sd == 0.0:
        return 2
    effect = abs(diff) / sd
    low, high = 1, 2  # power(low) < power <= power(high)
    while _power(effect, high, alpha) < power:
        if high >= most:
            return None
        low, high = high, min(2 * high, most)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if _power(effect, mid, alpha) >= power else (mid, high)
    return high


@dataclass(frozen=True)
class NonInferiority:
    """One non-inferiority test of B against A at ``margin`` (a fraction of A's mean)."""

    margin: float  # delta
    threshold: float  # (1 - delta) * mean(A): the mean B must beat
    mean_d: float  # mean(B) - (1 - delta) * mean(A) = mean of d_i = B_i - (1 - delta) A_i
    t: float  # one-sided one-sample t statistic of d
    p: float  # one-sided p-value, H1: E[d] > 0
    non_inferior: bool  # p < alpha
    p_fixed_margin: float  # same test treating delta * mean(A) as a known constant (reference only)


@dataclass(frozen=True)
class PairedComparison:
    """Paired comparison of a baseline A and a candidate B on one metric over the same queries."""

    metric: str
    qids: tuple[str, ...]
    a: tuple[float, ...]
    b: tuple[float, ...]
    mean_a: float
    mean_b: float
    mean_diff: float  # mean(B - A)
    ratio: float  # mean(B) / mean(A) (NaN when mean(A) is 0)
    t: float  # paired t statistic of B - A
    p: float  # two-sided p-value
    alpha: float
    non_inferiority: tuple[NonInferiority, ...]
    ci_low: float = math.nan  # the two-sided (1 - alpha) t confidence interval of mean(B - A)
    ci_high: float = math.nan
    sd: float = math.nan  # the standard deviation of the per-query B - A
    # the smallest true |mean(B - A)| the t-test detects with probability POWER over these queries
    detectable: float = math.nan

    @property
    def n(self) -> int:
        return len(self.qids)

    @property
    def diffs(self) -> dict[str, float]:
        """Per-query B_i - A_i."""
        return {q: b - a for q, a, b in zip(self.qids, self.a, self.b, strict=True)}

    @property
    def significant(self) -> bool:
        """The two-sided paired t-test rejects equal means at ``alpha``."""
        return self.p < self.alpha

    def at(self, margin: float) -> NonInferiority:
        for test in self.non_inferiority:
            if math.isclose(test.margin, margin):
                return test
        raise KeyError(f"no non-inferiority test at margin {margin}")

    def to_dict(self) -> dict:
        """JSON-ready: everything, per-query values as ``{qid: value}`` maps, NaN/inf as ``None``."""
        data = asdict(self)
        data.update(n=self.n, significant=self.significant)
        del data["qids"], data["a"], data["b"]
        data["per_query"] = {
            q: {"a": a, "b": b, "diff": b - a} for q, a, b in zip(self.qids, self.a, self.b, strict=True)
        }
        return _finite_or_none(data)


def _finite_or_none(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_none(v) for v in value]
    return value


def paired_test(
    a: Mapping[str, float],
    b: Mapping[str, float],
    metric: str = "",
    margins: Sequence[float] = DEFAULT_MARGINS,
    alpha: float = DEFAULT_ALPHA,
) -> PairedComparison:
    """Compare per-query values ``{qid: value}`` of baseline ``a`` and candidate ``b`` (same qids)."""
    if set(a) != set(b):
        only = sorted(set(a) ^ set(b), key=_qid_order)
        raise EvaluationError(f"paired test needs the same queries on both sides; differing: {only[:5]}")
    if not 0 < alpha < 1:
        raise EvaluationError(f"alpha must be in (0, 1), not {alpha}")
    for margin in margins:
        if not 0 <= margin < 1:
            raise EvaluationError(f"non-inferiority margin must be in [0, 1), not {margin}")
    qids = tuple(sorted(a, key=_qid_order))
    xa = np.array([a[q] for q in qids], dtype=np.float64)
    xb = np.array([b[q] for q in qids], dtype=np.float64)
    mean_a = float(xa.mean()) if qids else math.nan
    mean_b = float(xb.mean()) if qids else math.nan
    t, p = _t_test(xb - xa, "two-sided")
    ci_low, ci_high = mean_interval(xb - xa, alpha)
    sd = float((xb - xa).std(ddof=1)) if len(qids) > 1 else math.nan
    tests = []
    for margin in margins:
        d = xb - (1.0 - margin) * xa
        ni_t, ni_p = _t_test(d, "greater")
        _, fixed_p = _t_test(xb - xa + margin * mean_a, "greater")
        tests.append(
            NonInferiority(
                margin=float(margin),
                threshold=(1.0 - margin) * mean_a,
                mean_d=float(d.mean()) if qids else math.nan,
                t=ni_t,
                p=ni_p,
                non_inferior=bool(ni_p < alpha),
                p_fixed_margin=fixed_p,
            )
        )
    return PairedComparison(
        metric=metric,
        qids=qids,
        a=tuple(float(v) for v in xa),
        b=tuple(float(v) for v in xb),
        mean_a=mean_a,
        mean_b=mean_b,
        mean_diff=mean_b - mean_a,
        ratio=mean_b / mean_a if mean_a else math.nan,
        t=t,
        p=p,
        alpha=float(alpha),
        non_inferiority=tuple(tests),
        ci_low=ci_low,
        ci_high=ci_high,
        sd=sd,
        detectable=detectable_difference(sd, len(qids), alpha),
    )


def compare(
    run_a: Mapping[str, Mapping[str, float]],
    run_b: Mapping[str, Mapping[str, float]],
    qrels: Mapping[str, Mapping[str, int]],
    metric: str = "nDCG@10",
    margins: Sequence[float] = DEFAULT_MARGINS,
    alpha: float = DEFAULT_ALPHA,
) -> PairedComparison:
    """Paired comparison of baseline ``run_a`` and candidate ``run_b`` on ``metric`` over the qrels'
    evaluated queries (a query missing from either run scores 0 there)."""
    a = per_query(run_a, qrels, (metric,))[metric]
    b = per_query(run_b, qrels, (metric,))[metric]
    return paired_test(a, b, metric=metric, margins=margins, alpha=alpha)
