"""Priors in the served score (aheadrank/priors.py, aheadrank/rerank.py): the fit, the checkpoint file,
the store's dense field, and the precomputed run with priors against the unsplit model with the same priors."""

from __future__ import annotations

import json
import random
import shutil

import numpy as np
import pytest

from aheadrank.errors import CheckpointError, StoreError
from aheadrank.priors import (
    FEATURES,
    Priors,
    QueryFeatures,
    cross_validated,
    fit_priors,
    fit_weights,
    grid_ndcg10,
    mean_ndcg10,
    ndcg10,
    rrf,
    simplex_grid,
    subset_key,
    zscore,
)


def synthetic_queries(n: int, seed: int, noise: dict[str, float]) -> list[QueryFeatures]:
    """Queries whose relevance is a hidden signal; each feature is the signal plus its own noise level."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(n):
        signal = rng.normal(size=50)
        docids = [f"q{q}d{i}" for i in range(50)]
        rel = {docids[i]: 1 for i in np.argsort(-signal)[:3]}
        feats = {f: signal + rng.normal(scale=s, size=50) * 1.0 for f, s in noise.items()}
        out.append(QueryFeatures(docids, feats, rel))
    return out


def test_zscore_and_grid():
    z = zscore(np.array([1.0, 2.0, 3.0]))
    assert abs(z.mean()) < 1e-12 and abs(z.std() - 1) < 1e-12
    assert np.all(zscore(np.array([5.0, 5.0])) == 0)
    with pytest.raises(ValueError):
        zscore(np.array([1.0, np.nan]))
    grid = simplex_grid(3, 0.1)
    assert len(grid) == 66 and all(abs(sum(w) - 1) < 1e-9 and min(w) >= 0 for w in grid)
    assert subset_key(["dense", "neural"]) == "neural+dense"
    with pytest.raises(ValueError):
        subset_key(["tfidf"])


def test_ndcg10_matches_the_evaluator():
    from aheadrank.evaluation import evaluate

    rng = random.Random(3)
    for _ in range(20):
        docids = [f"d{i}" for i in range(30)]
        scores = np.array([rng.random() for _ in docids])
        qrels = {d: rng.choice([0, 1, 2]) for d in rng.sample(docids, 8)}
        qrels["missing"] = 1  # judged but not retrieved: counts in the ideal ranking
        expect = evaluate(
            {"q": dict(zip(docids, scores.tolist(), strict=True))}, {"q": qrels}, metrics=("ndcg_cut_10",)
        )
        assert ndcg10(scores, docids, qrels) == pytest.approx(expect["ndcg_cut_10"], abs=1e-9)


def test_fit_prefers_the_informative_feature_and_can_drop_the_neural_score():
    queries = synthetic_queries(40, 0, {"neural": 100.0, "bm25": 0.3, "dense": 2.0})
    w, m = fit_weights(queries, ["neural", "bm25", "dense"])
    assert w["bm25"] > w["dense"] and w["neural"] <= 0.1
    priors = fit_priors(queries, None, {"test": True})
    assert set(priors.weights) == {"neural", "neural+bm25", "neural+dense", "neural+bm25+dense"}
    # the fitted combination is at least as good on the fitting queries as any single feature
    for f in ("neural", "bm25", "dense"):  # the features these queries have
        alone = np.mean([ndcg10(q.features[f], q.docids, q.qrels) for q in queries])
        assert priors.fitted_on["val_ndcg10"]["neural+bm25+dense"] >= alone - 1e-12


def test_the_grid_is_scored_at_once_exactly_as_point_by_point_ties_included():
    """grid_ndcg10 scores every simplex point of a query at once; its means are mean_ndcg10's to the last bit, with
    features full of ties (integer scores, rounded ones), queries with no relevant or a single candidate."""
    rng = np.random.default_rng(5)
    queries = []
    for i in range(40):
        n = int(rng.integers(1, 30))
        docids = [f"d{rng.integers(0, 50)}x{j}" for j in range(n)]
        feats = {
            "neural": rng.integers(0, 3, size=n).astype(float),
            "bm25": rng.normal(size=n),
            "dense": np.round(rng.normal(size=n), 1),
            "window": rng.integers(0, 2, size=n).astype(float),
        }
        qrels = {} if i % 7 == 0 else {d: int(rng.integers(0, 3)) for d in docids if rng.random() < 0.3}
        queries.append(QueryFeatures(docids, feats, qrels))
    names = list(FEATURES)
    z = [{f: zscore(q.features[f]) for f in names} for q in queries]
    grid = simplex_grid(len(names), 0.1)
    at_once = np.zeros(len(grid))
    for q, zq in zip(queries, z, strict=True):
        at_once += grid_ndcg10(np.array(grid), [zq[f] for f in names], q.docids, q.qrels)
    at_once /= len(queries)
    one_by_one = [mean_ndcg10(queries, z, dict(zip(names, w, strict=True))) for w in grid]
    assert at_once.tolist() == one_by_one
    w, m = fit_weights(queries, names, 0.1)
    assert m == max(one_by_one) and one_by_one.index(m) == grid.index(tuple(w[f] for f in names))


def test_fitted_weights_replace_kept_ones_only_where_they_serve_better_out_of_sample():
    """A feature that carries relevance and that the kept weights miss: cross-validation finds it and fit_priors
    takes the fit; where the kept weights are already right (or the queries too few) they stay, and fitted_on
    records the decision and the weights guarded against."""
    good = synthetic_queries(40, 1, {"neural": 100.0, "bm25": 0.3, "dense": 100.0})
    blind = {"neural": 0.5, "bm25": 0.0, "dense": 0.5}
    cv = cross_validated(good, ["neural", "bm25", "dense"], blind)
    assert cv["fitted"] and cv["diff"] > 0.3 and cv["p"] < 0.01 and cv["folds"] == 5
    keep = {"neural+bm25+dense": blind, "neural": {"neural": 1.0}}
    priors = fit_priors(good, None, {}, keep=keep)
    assert priors.weights["neural+bm25+dense"]["bm25"] > 0.5
    assert priors.fitted_on["guard"]["neural+bm25+dense"]["fitted"]
    assert priors.fitted_on["defaults"] == keep
    assert priors.weights["neural"] == {"neural": 1.0}  # one grid point: the fit is the kept weights
    right = {"neural": 0.0, "bm25": 1.0, "dense": 0.0}  # nothing a fit can add to BM25 alone here
    priors = fit_priors(good, None, {}, keep={"neural+bm25+dense": right})
    assert priors.weights["neural+bm25+dense"] == right
    assert not priors.fitted_on["guard"]["neural+bm25+dense"]["fitted"]
    few = cross_validated(good[:1], ["neural", "bm25", "dense"], blind)
    assert not few["fitted"] and few["why"] == "fewer than 2 queries"
    assert "guard" not in fit_priors(good, None, {}).fitted_on  # nothing kept: the plain fit


def test_combine_uses_the_weights_of_the_available_features():
    p = Priors(weights={"neural": {"neural": 1.0}, "neural+bm25": {"neural": 0.25, "bm25": 0.75}})
    n, b = np.array([3.0, 1.0, 2.0]), np.array([0.0, 10.0, 5.0])
    assert np.allclose(p.combine({"neural": n}), zscore(n))
    assert np.allclose(p.combine({"neural": n, "bm25": b}), 0.25 * zscore(n) + 0.75 * zscore(b))
    with pytest.raises(KeyError):
        p.combine({"neural": n, "dense": b})
    back = Priors.from_dict(json.loads(p.to_json()))
    assert back.weights == p.weights
    for bad in (
        {"weights": {}},
        {"normalisation": "minmax", "weights": p.weights},
        {"normalisation": "zscore", "weights": {"neural+bm25": {"neural": float("nan"), "bm25": 1}}},
        {"normalisation": "zscore", "weights": {"bm25+neural": {"neural": 1}}},
        {"normalisation": "zscore", "weights": {"neural": {"neural": 1}}, "format": 99},
    ):
        with pytest.raises(CheckpointError):
            Priors.from_dict(bad)


def test_rrf():
    fused = rrf([["a", "b", "c"], ["c", "a"]])
    assert fused["a"] > fused["c"] > fused["b"]


# ---- the checkpoint, the store's dense field, the serving path ------------------------------------------
@pytest.fixture(scope="module")
def prior_env(tmp_path_factory, service_env):
    """The service env's tiny MORES checkpoint and store, copied, with a dense field and fitted priors."""
    from aheadrank.indexer.build import BuildOptions, build_dense
    from aheadrank.indexer.topics import read_beir_split

    from aheadrank.rerank import fit_checkpoint_priors
    from aheadrank.runs import bm25_candidates

    root = tmp_path_factory.mktemp("priors")
    ckpt, store = root / "ckpt", root / "store"
    shutil.copytree(service_env.checkpoint, ckpt)
    shutil.copytree(service_env.store, store)
    build_dense(
        BuildOptions(str(ckpt), str(service_env.collection), str(store), shard_size=400, progress=False)
    )
    queries, qrels = read_beir_split(service_env.collection, "train")
    val = dict(sorted(queries.items())[:30])
    cands = bm25_candidates(service_env.lucene, val, 30)
    priors = fit_checkpoint_priors(ckpt, store, val, cands, qrels, {"split": "train"})
    test_q, test_qrels = read_beir_split(service_env.collection, "test")
    test_q = dict(sorted(test_q.items())[:8])
    return {
        "ckpt": ckpt,
        "store": store,
        "priors": priors,
        "queries": test_q,
        "qrels": test_qrels,
        "candidates": bm25_candidates(service_env.lucene, test_q, 30),
        "collection": service_env.collection,
    }


def test_priors_are_saved_in_the_checkpoint_and_verified(prior_env, tmp_path):
    from aheadrank.rankers import load_ranker, read_fingerprint

    ckpt = prior_env["ckpt"]
    ranker = load_ranker(ckpt)
    assert Priors.from_dict(ranker.priors).weights == prior_env["priors"].weights
    assert prior_env["priors"].dense["fingerprint"]
    record = json.loads((ckpt / "fingerprint.json").read_text())
    assert record["priors_sha256"] and read_fingerprint(ckpt) == record["sha256"]
    bad = tmp_path / "ckpt"
    shutil.copytree(ckpt, bad)
    data = json.loads((bad / "priors.json").read_text())
    data["weights"]["neural"]["neural"] = 0.5
    (bad / "priors.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="priors.json"):
        load_ranker(bad)
    (bad / "priors.json").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        load_ranker(bad)


def test_served_scores_are_the_fitted_combination_of_their_parts(prior_env):
    from aheadrank.runs import rerank_run

    with_priors, stats = rerank_run(
        prior_env["ckpt"], prior_env["store"], prior_env["queries"], prior_env["candidates"], progress=False
    )
    pure, _ = rerank_run(
        prior_env["ckpt"],
        prior_env["store"],
        prior_env["queries"],
        prior_env["candidates"],
        progress=False,
        pure=True,
    )
    assert stats.notices == []
    w = prior_env["priors"].weights["neural+bm25+dense"]
    from aheadrank.rankers import load_ranker

    from aheadrank.rerank import PriorScorer

    ranker = load_ranker(prior_env["ckpt"])
    scorer = PriorScorer(ranker, prior_env["store"])
    for qid, cands in prior_env["candidates"].items():
        docids = [d for d, _ in cands]
        n = np.array([pure[qid][d] for d in docids])
        b = np.array([s for _, s in cands])
        c = scorer.stored_dense(scorer.query_vector(prior_env["queries"][qid]), docids)
        expect = w["neural"] * zscore(n) + w["bm25"] * zscore(b) + w.get("dense", 0) * zscore(c)
        got = np.array([with_priors[qid][d] for d in docids])
        assert np.allclose(got, expect, atol=1e-6)
    scorer.close()


def test_precomputed_run_with_priors_equals_the_unsplit_model_with_priors(prior_env):
    """Neural: score_pairs (unsplit, float32); dense: the encoder over the texts (float32), against the
    store's float16 fields. Final scores agree within the float16 rounding of the stored fields."""
    from aheadrank.indexer.collections import Collection
    from aheadrank.rankers import load_ranker

    from aheadrank.rerank import PriorScorer, apply_priors
    from aheadrank.runs import rerank_run

    texts = {d.docid: d.text for d in Collection(prior_env["collection"])}
    stored, _ = rerank_run(
        prior_env["ckpt"], prior_env["store"], prior_env["queries"], prior_env["candidates"], progress=False
    )
    ranker = load_ranker(prior_env["ckpt"])
    scorer = PriorScorer(ranker, prior_env["store"])
    for qid, cands in prior_env["candidates"].items():
        q = prior_env["queries"][qid]
        docids = [d for d, _ in cands]
        neural = ranker.score_pairs(q, [texts[d] for d in docids]).detach().tolist()
        dense = scorer.text_dense(scorer.query_vector(q), [texts[d] for d in docids])
        rows = apply_priors(scorer, list(zip(docids, neural, strict=True)), dict(cands), dense)
        ref = {r.docid: r.score for r in rows}
        diffs = [abs(ref[d] - stored[qid][d]) for d in docids]
        # z-scored features have unit scale; float16 storage moves each by well under 1e-2
        assert max(diffs) < 2e-2, (qid, max(diffs))
    scorer.close()


def without_dense(store, out) -> None:
    """A copy of ``store`` as `aheadrank index --no-dense` would have left it: no dense/, the manifest says so."""
    from dataclasses import replace

    from aheadrank.store import read_manifest
    from aheadrank.store.manifest import write_manifest_file

    shutil.copytree(store, out)
    shutil.rmtree(out / "dense")
    write_manifest_file(out, replace(read_manifest(out), dense=False))


def test_a_store_without_the_dense_field_serves_with_a_notice(prior_env, tmp_path):
    from aheadrank.runs import rerank_run

    store = tmp_path / "store"
    shutil.copytree(prior_env["store"], store)
    shutil.rmtree(store / "dense")
    with pytest.raises(StoreError, match="built with the dense field"):  # a dense field lost: refused
        rerank_run(prior_env["ckpt"], store, prior_env["queries"], prior_env["candidates"], progress=False)
    shutil.rmtree(store)
    without_dense(prior_env["store"], store)
    run, stats = rerank_run(
        prior_env["ckpt"], store, prior_env["queries"], prior_env["candidates"], progress=False
    )
    assert any("no dense field" in n for n in stats.notices)
    w = prior_env["priors"].weights["neural+bm25"]
    pure, _ = rerank_run(
        prior_env["ckpt"], store, prior_env["queries"], prior_env["candidates"], progress=False, pure=True
    )
    for qid, cands in prior_env["candidates"].items():
        docids = [d for d, _ in cands]
        n = np.array([pure[qid][d] for d in docids])
        b = np.array([s for _, s in cands])
        assert np.allclose(
            [run[qid][d] for d in docids], w["neural"] * zscore(n) + w["bm25"] * zscore(b), atol=1e-6
        )


def test_the_service_serves_rerank_runs_scores_with_their_parts(prior_env, service_env, tmp_path):
    import httpx
    from services_testkit import Server

    from aheadrank.runs import rerank_run

    run, _ = rerank_run(
        prior_env["ckpt"], prior_env["store"], prior_env["queries"], prior_env["candidates"], progress=False
    )
    pure_run, _ = rerank_run(
        prior_env["ckpt"],
        prior_env["store"],
        prior_env["queries"],
        prior_env["candidates"],
        progress=False,
        pure=True,
    )
    bare = tmp_path / "bare-store"  # the same store built without its dense field: served with a notice
    without_dense(prior_env["store"], bare)
    args = ["--checkpoint", str(prior_env["ckpt"]), "--index", str(service_env.lucene)]
    srv = Server(*args, "--store", str(prior_env["store"])).wait_ready()
    try:
        client = httpx.Client(base_url=srv.url, timeout=60)
        info = client.get("/v1/info").json()
        assert info["priors"]["dense_field"] and set(info["priors"]["weights"]) >= {"neural+bm25+dense"}
        for qid, query in list(prior_env["queries"].items())[:3]:
            body = client.post("/v1/rerank", json={"query": query, "depth": 30}).json()
            assert body["scoring"] == "neural+bm25+dense"
            got = {r["docid"]: r for r in body["results"]}
            assert set(got) == set(run[qid])
            for d, r in got.items():
                assert r["score"] == pytest.approx(run[qid][d], abs=1e-5)
                assert r["neural_score"] == pytest.approx(pure_run[qid][d], abs=1e-5)
                assert r["dense_score"] is not None and r["bm25_score"] is not None
            ranks = [r["docid"] for r in body["results"]]
            assert ranks == sorted(run[qid], key=lambda d: (-run[qid][d], d))
            pure = client.post("/v1/rerank", json={"query": query, "depth": 30, "pure": True}).json()
            assert pure["scoring"] == "neural"
            assert all(
                r["score"] == pytest.approx(pure_run[qid][r["docid"]], abs=1e-5) for r in pure["results"]
            )
            # given candidates get the BM25 scores BM25's candidates carry (the index scores them), and the same
            # scoring; among themselves their served scores are the z-scores of those five
            given = client.post("/v1/rerank", json={"query": query, "candidates": ranks[:5]}).json()
            assert given["scoring"] == "neural+bm25+dense"
            assert {r["docid"]: r["bm25_score"] for r in given["results"]} == pytest.approx(
                {d: got[d]["bm25_score"] for d in ranks[:5]}, abs=1e-4
            )
            five, _ = rerank_run(
                prior_env["ckpt"],
                prior_env["store"],
                {qid: query},
                {qid: [(d, got[d]["bm25_score"]) for d in ranks[:5]]},
                progress=False,
            )
            assert {r["docid"]: r["score"] for r in given["results"]} == pytest.approx(five[qid], abs=1e-4)
        # a query BM25 finds nothing for: no results, and the scoring it would have had (not the given-docids one)
        none = client.post("/v1/rerank", json={"query": "zzqxv", "depth": 30}).json()
        assert none["candidates"] == 0 and none["results"] == [] and none["scoring"] == "neural+bm25+dense"
        adhoc = client.post("/rerank", json={"query": "cancer", "texts": ["lung cancer risk", "bananas"]})
        assert adhoc.status_code == 200, adhoc.text
    finally:
        srv.stop()
    srv = Server(*args, "--store", str(bare)).wait_ready()
    try:
        client = httpx.Client(base_url=srv.url, timeout=60)
        info = client.get("/v1/info").json()
        assert any("no dense field" in w for w in info["warnings"])
        body = client.post("/v1/rerank", json={"query": "cell biology", "depth": 10}).json()
        assert body["scoring"] == "neural+bm25" and all(r["dense_score"] is None for r in body["results"])

    finally:
        srv.stop()


# ---- absolute, calibrated scores ------------------------------------------------------------------------
def logistic_queries(n: int, seed: int, a: float = 1.5, b: float = -3.0) -> list[QueryFeatures]:
    """Queries whose candidates are relevant with probability sigmoid(a·signal + b); neural and dense are
    the signal on other scales and offsets (the calibration must learn both)."""
    rng = np.random.default_rng(seed)
    out = []
    for q in range(n):
        signal = rng.normal(size=40)
        docids = [f"q{q}d{i}" for i in range(40)]
        rel = rng.random(40) < 1 / (1 + np.exp(-(a * signal + b)))
        feats = {
            "neural": 7.0 * signal + 2.0 + rng.normal(scale=0.5, size=40),
            "dense": 0.1 * signal + 0.4 + rng.normal(scale=0.05, size=40),
        }
        out.append(QueryFeatures(docids, feats, {d: int(r) for d, r in zip(docids, rel, strict=True)}))
    return out


def test_platt_recovers_a_logistic_model():
    from aheadrank.priors import platt_fit

    rng = np.random.default_rng(0)
    s = rng.normal(size=200_000)
    y = rng.random(s.size) < 1 / (1 + np.exp(-(2.0 * s - 1.0)))
    a, b = platt_fit(s, y)
    assert a == pytest.approx(2.0, rel=0.03) and b == pytest.approx(-1.0, abs=0.03)
    with pytest.raises(ValueError, match="relevant and non-relevant"):
        platt_fit(s[:10], np.zeros(10))


def test_calibrated_scores_are_probabilities_on_held_out_queries():
    from aheadrank.priors import expected_calibration_error, fit_calibration

    cal = fit_calibration(logistic_queries(200, seed=1), {"split": "train"})
    assert set(cal.platt) == {"neural", "neural+dense"} and cal.fitted_on["queries"] == 200
    held_out = logistic_queries(200, seed=2)
    for names in (["neural"], ["neural", "dense"]):
        p = np.concatenate([cal.probabilities({f: q.features[f] for f in names}) for q in held_out])
        y = np.concatenate([[q.qrels[d] for d in q.docids] for q in held_out])
        ece, table = expected_calibration_error(p, y)
        assert ece < 0.03, table
        # a per-request z-score (today's relevance_score) is not a probability on the same data
        zs = np.concatenate([1 / (1 + np.exp(-zscore(q.features["neural"]))) for q in held_out])
        assert expected_calibration_error(zs, y)[0] > 0.1


def test_a_calibrated_score_is_the_documents_own():
    from aheadrank.priors import fit_calibration

    cal = fit_calibration(logistic_queries(50, seed=3))
    q = logistic_queries(1, seed=4)[0]
    together = cal.logits(q.features)
    alone = [cal.logits({f: v[i : i + 1] for f, v in q.features.items()})[0] for i in range(len(q.docids))]
    assert np.allclose(together, alone, rtol=0, atol=1e-12)
    order = np.argsort(-together)  # the calibration keeps the combination's ranking
    assert np.all(np.diff(cal.combine(q.features)[order]) <= 0)


def test_calibration_round_trips_and_bad_calibration_is_refused():
    from aheadrank.priors import fit_calibration

    qs = logistic_queries(30, seed=5)
    priors = fit_priors(qs, None, {})
    assert priors.calibrated() is None and Priors.from_dict(priors.to_dict()).calibration is None
    priors.calibration = fit_calibration(qs).to_dict()
    back = Priors.from_dict(json.loads(priors.to_json()))
    assert back.calibration == priors.calibration
    f = {k: v[:5] for k, v in qs[0].features.items()}
    assert np.array_equal(back.calibrated().logits(f), priors.calibrated().logits(f))
    for bad in (
        {**priors.calibration, "method": "isotonic"},
        {**priors.calibration, "platt": {"neural": [-1.0, 0.0]}},
        {**priors.calibration, "stats": {"neural": [0.0, 0.0], "dense": [0.0, 1.0]}},
        {**priors.calibration, "platt": {"neural+bm25": [1.0, 0.0]}},
    ):
        with pytest.raises(CheckpointError):
            Priors.from_dict({**priors.to_dict(), "calibration": bad})


def test_a_score_that_does_not_rise_with_relevance_gets_the_base_rate():
    from aheadrank.priors import fit_calibration

    qs = logistic_queries(40, seed=6)
    for q in qs:  # the neural score now falls with relevance
        q.features = {"neural": -q.features["neural"]}
    cal = fit_calibration(qs)
    p = cal.probabilities({"neural": np.array([-30.0, 0.0, 30.0])})
    rate = cal.fitted_on["relevant"] / cal.fitted_on["candidates"]
    assert np.allclose(p, rate, atol=1e-4)


def test_the_service_scores_a_text_the_same_alone_or_among_99_others(prior_env, tmp_path):
    """/rerank with a calibrated checkpoint: a text's relevance_score does not depend on the request's other
    texts; a checkpoint whose priors predate calibration still serves, and says its scores are relative."""
    import httpx
    from aheadrank.rankers.checkpoint import write_priors
    from services_testkit import SAMPLE, Server

    texts = [json.loads(line)["text"] for line in (SAMPLE / "corpus.jsonl").open()][:100]
    query = "smoking increases the risk of lung cancer"
    old = tmp_path / "uncalibrated"
    shutil.copytree(prior_env["ckpt"], old)
    write_priors(old, {**prior_env["priors"].to_dict(), "calibration": None})
    srv = Server("--checkpoint", str(prior_env["ckpt"]), "--no-warmup").wait_ready()
    try:
        client = httpx.Client(base_url=srv.url, timeout=120)
        info = client.get("/v1/info").json()
        assert info["relevance_score"] == "calibrated" and info["priors"]["calibration"]["method"] == "platt"
        many = client.post("/v1/rerank", json={"query": query, "documents": texts}).json()
        assert many["meta"]["relevance_score"] == "calibrated"
        together = {r["index"]: r["relevance_score"] for r in many["results"]}
        for i in (0, 37, 99):
            one = client.post("/v1/rerank", json={"query": query, "documents": [texts[i]]}).json()
            assert one["results"][0]["relevance_score"] == pytest.approx(together[i], abs=1e-6)
        tei = client.post("/rerank", json={"query": query, "texts": texts[:3]})
        assert tei.headers["x-relevance-score"] == "calibrated"
    finally:
        srv.stop()
    srv = Server("--checkpoint", str(old), "--no-warmup").wait_ready()
    try:
        client = httpx.Client(base_url=srv.url, timeout=120)
        info = client.get("/v1/info").json()
        assert info["relevance_score"] == "relative" and info["priors"]["calibration"] is None
        assert any("no calibration" in w for w in info["warnings"])
        body = client.post("/v1/rerank", json={"query": query, "documents": texts[:2]}).json()
        assert body["meta"]["relevance_score"] == "relative"
    finally:
        srv.stop()
