"""bench/few_judgments.py: the draws of judged queries are fixed by the seed and never repeat a query, and weights
fitted on judged queries find the feature that carries relevance where the label-free weights missed it."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import few_judgments as fj  # noqa: E402

from aheadrank.priors import QueryFeatures  # noqa: E402


def test_draws_are_the_same_for_the_same_seed_and_never_repeat_a_query():
    qids = [f"q{i}" for i in range(30)]
    a = fj.draws_of(qids, 10, 4, seed=0)
    assert a == fj.draws_of(list(reversed(qids)), 10, 4, seed=0)  # the order given does not matter
    assert len(a) == 4 and all(len(set(d)) == 10 and set(d) <= set(qids) for d in a)
    assert len({tuple(d) for d in a}) == 4  # the draws differ
    assert fj.draws_of(qids, 10, 4, seed=1) != a
    assert fj.draws_of(qids, 30, 4, seed=0) == [sorted(qids)]  # all of them: one draw
    assert fj.draws_of(qids, 50, 4, seed=0) == [sorted(qids)]


def synthetic(n_queries: int, seed: int, prefix: str) -> tuple[list, dict]:
    """Queries of 20 candidates, 2 relevant each; BM25 carries the relevance, the neural and dense scores are noise."""
    rng = np.random.default_rng(seed)
    feats, qrels = [], {}
    for i in range(n_queries):
        qid = f"{prefix}{i}"
        docids = [f"{qid}-d{j}" for j in range(20)]
        rel = np.zeros(20)
        rel[rng.choice(20, size=2, replace=False)] = 1
        features = {
            "neural": rng.normal(size=20),
            "bm25": rel * 2.0 + rng.normal(scale=0.5, size=20),
            "dense": rng.normal(size=20),
        }
        q = {d: 1 for d, r in zip(docids, rel, strict=True) if r}
        feats.append((qid, QueryFeatures(docids, features, q)))
        qrels[qid] = q
    return feats, qrels


def test_weights_fitted_on_judged_queries_find_the_feature_the_label_free_weights_missed():
    train, _ = synthetic(40, 1, "t")
    test, qrels = synthetic(25, 2, "e")
    served = {"neural": 0.5, "bm25": 0.0, "dense": 0.5}  # label-free weights that miss BM25
    default, sizes = fj.measure(train, test, qrels, served, [5, 10, 100], draws=3, seed=0)
    assert list(sizes) == ["5", "10", "all"]  # 100 is not below the 40 train queries: only "all"
    assert [len(sizes[k]["draws"]) for k in sizes] == [3, 3, 1]
    assert sizes["all"]["n"] == 40
    for e in sizes.values():
        assert e["min"] > default + 0.3  # BM25 found on every draw
        assert all(r["weights"]["bm25"] > 0.5 for r in e["draws"])
        assert all(set(r["fusion_weights"]) == {"bm25", "dense"} for r in e["draws"])
        assert e["above_label_free"] == len(e["draws"])
        assert e["fusion_mean"] == pytest.approx(e["mean"], abs=0.1)  # the fusion has BM25 too
    assert sizes["all"]["vs_label_free"]["diff"] > 0.3 and sizes["all"]["vs_label_free"]["p"] < 0.01
    md = fj.table(
        [
            {
                "collection": "synthetic",
                "test_queries": 25,
                "baselines": {"bm25": 0.9, "bi-encoder": 0.2, "rrf": 0.6, "fusion-equal": 0.7},
                "best_baseline": "fusion-equal",
                "label_free": {"weights": served, "ndcg10": default},
                "sizes": sizes,
            }
        ]
    )
    assert "| all (40) | 1 |" in md and "| 5 | 3 |" in md
