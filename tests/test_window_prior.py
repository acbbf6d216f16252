"""The window prior's weights and when a build stores it (aheadrank.build: ``share_weights``, ``stores_windows``);
the served scores and the sub-store are tested in tests/faults/test_window_faults.py."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

from aheadrank.build import (
    BUILD_FILE,
    MULTI_WINDOW,
    BuildPlan,
    label_free_weights,
    multi_window,
    share_weights,
    stores_windows,
)
from aheadrank.priors import QueryFeatures, fit_calibration, fit_priors, servable


def test_the_best_window_weighs_as_much_as_the_bi_encoder():
    w = share_weights(Fraction(1, 3), window=True)
    assert w["neural+bm25+dense+window"] == pytest.approx(
        {f: 0.25 for f in ("neural", "bm25", "dense", "window")}
    )
    assert w["neural+dense+window"] == pytest.approx({"neural": 1 / 3, "dense": 1 / 3, "window": 1 / 3})
    # without the window the subsets are the served score's as before, and no set has the window without dense
    assert {k: v for k, v in w.items() if "window" not in k} == share_weights(Fraction(1, 3))
    assert all(servable(k.split("+")) and sum(v.values()) == pytest.approx(1.0) for k, v in w.items())
    tk = label_free_weights("tk", window=True)["neural+bm25+dense+window"]
    assert tk["bm25"] == tk["dense"] == tk["window"] == pytest.approx(2.5 * tk["neural"])


def test_fitted_priors_never_weigh_the_window_without_the_dense_score():
    rng = np.random.default_rng(0)
    queries = []
    for i in range(6):
        feats = {f: rng.normal(size=8) for f in ("neural", "bm25", "dense", "window")}
        queries.append(QueryFeatures([f"d{j}" for j in range(8)], feats, {f"d{i % 8}": 1}))
    keys = set(fit_priors(queries, None, {}, step=0.25).weights)
    assert "neural+bm25+dense+window" in keys and "neural+dense+window" in keys
    assert not any("window" in k and "dense" not in k for k in keys)
    assert set(fit_calibration(queries, {}, step=0.25).platt) == keys
    assert not servable(["neural", "window"]) and servable(["neural", "bm25"])


def _collection(tmp_path, texts: list[str], qrels: bool = False):
    root = tmp_path / "coll"
    root.mkdir()
    rows = [json.dumps({"_id": f"d{i}", "title": "", "text": t}) for i, t in enumerate(texts)]
    (root / "corpus.jsonl").write_text("\n".join(rows) + "\n")
    if qrels:
        (root / "qrels").mkdir()
        (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td0\t1\n")
    return root


def test_a_label_free_build_stores_windows_where_most_documents_are_several(tmp_path):
    several = "One thing. Another thing. A third thing."
    coll = _collection(tmp_path, [several, several, "no sentence breaks here at all"])
    assert multi_window(coll) == pytest.approx(2 / 3) and 2 / 3 >= MULTI_WINDOW
    plan = BuildPlan(str(coll), str(tmp_path / "out"), labels="none")
    assert stores_windows(plan)
    assert not stores_windows(BuildPlan(str(coll), str(tmp_path / "out"), labels="none", windows=False))
    # the collection stage's count decides once it is recorded
    (tmp_path / "out").mkdir()
    record = {"plan": {}, "stages": {"collection": {"multi_window": 0.2}}}
    (tmp_path / "out" / BUILD_FILE).write_text(json.dumps(record))
    assert not stores_windows(plan)


def test_one_window_documents_or_judgments_keep_the_windows_off(tmp_path):
    flat = _collection(tmp_path, ["no sentence breaks", "none here either", "One. Two. Three."])
    assert not stores_windows(BuildPlan(str(flat), str(tmp_path / "a"), labels="none"))
    judged = tmp_path / "j"
    judged.mkdir()
    coll = _collection(judged, ["One. Two. Three."] * 3, qrels=True)
    assert not stores_windows(BuildPlan(str(coll), str(tmp_path / "b")))  # trained on qrels/train.tsv
    assert stores_windows(BuildPlan(str(coll), str(tmp_path / "b"), windows=True))
