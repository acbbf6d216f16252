"""bench/label_free_goals.py: each goal is the paired (or one-sample) t-test it names, against the better fusion of
the same queries, with SciFact's own goals only on SciFact."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_goals as goals  # noqa: E402


def _values(x) -> dict[str, float]:
    return {f"test:{i}": float(v) for i, v in enumerate(x)}


def _runs(seed: int, n: int = 60) -> dict[str, dict[str, float]]:
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.2, 0.9, n)
    runs = {
        "bm25": base,
        "rrf": base + 0.01,
        "fusion-equal": base + 0.02,  # the better fusion
        "mores-2ib-s2": base - 0.05 + rng.normal(0, 0.05, n),
        "mores-2ib-s2+priors": base + 0.04 + rng.normal(0, 0.02, n),
        "tk-6l-base+priors": base + rng.normal(0, 0.02, n),
    }
    return {k: _values(v) for k, v in runs.items()}


def test_served_rows_test_against_the_better_fusion_and_scifacts_goals_stand_only_for_scifact():
    runs = _runs(0)
    rows = goals.goals(runs, "scifact")
    assert [r["goal"] for r in rows] == [
        "served ≥ better fusion, significantly",
        "served ≥ better fusion, significantly",
        "served ≥ 0.75",
        "pure MORES ≥ BM25",
    ]
    mores, tk, target, pure = rows
    assert mores["baseline"] == tk["baseline"] == "fusion-equal"
    b, a = (np.array(list(runs[k].values())) for k in ("mores-2ib-s2+priors", "fusion-equal"))
    ref = stats.ttest_rel(b, a)
    assert mores["p"] == pytest.approx(ref.pvalue) and mores["diff"] == pytest.approx((b - a).mean())
    assert mores["ci95"] == pytest.approx(list(ref.confidence_interval(0.95)))
    assert mores["verdict"] == "met, significantly" and tk["verdict"].startswith("not met")
    assert pure["verdict"] == "not met, significantly" and pure["baseline"] == "bm25"
    served = np.array(list(runs["mores-2ib-s2+priors"].values()))
    one = stats.ttest_1samp(served, 0.75)  # a goal against a number: the one-sample test
    assert target["p"] == pytest.approx(one.pvalue) and target["diff"] == pytest.approx(served.mean() - 0.75)
    assert target["queries_for_diff"] is not None and target["detects"] > 0
    other = goals.goals(runs, "vaswani")
    assert [r["goal"] for r in other] == ["served ≥ better fusion"] * 2


def test_pooled_splits_keep_every_query_of_the_runs_they_share():
    test, train = (
        _runs(1, 10),
        {k: {q.replace("test", "train"): v for q, v in r.items()} for k, r in _runs(2, 20).items()},
    )
    del train["rrf"]
    both = goals.pooled([test, train])
    assert "rrf" not in both and len(both["bm25"]) == 30
    assert goals.goals(both, "cranfield")[0]["queries"] == 30
