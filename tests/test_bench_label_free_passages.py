"""bench/label_free_passages.py: committed neural runs are read only over the candidates they were made on, and
the fused scores are the z-score sums the served score uses."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_passages as lfp  # noqa: E402
from label_free import runs_from as lfp_runs  # noqa: E402


def test_neural_is_given_as_folder_and_variant(capsys):
    assert lfp.parse_neural("bench/results/x:mores-2ib-s2") == (Path("bench/results/x"), "mores-2ib-s2")
    for bad in ("mores-2ib-s2", ":mores", "dir:"):
        with pytest.raises(SystemExit, match="DIR:VARIANT"):
            lfp.parse_neural(bad)
    with pytest.raises(SystemExit):  # the same variant twice would overwrite its runs: refused
        lfp.parse_args(["--neural", "a:mores-2ib-s2", "b:mores-2ib-s2"])
    assert "--neural: each VARIANT once" in capsys.readouterr().err


def test_a_neural_run_over_other_candidates_is_refused():
    cands = {"q1": [("a", 3.0), ("b", 2.0), ("c", 1.0)]}
    got = lfp.neural_scores({"q1": {"c": 0.1, "a": 0.9, "b": 0.5}}, cands, ["q1"], Path("run"))
    assert got["q1"].tolist() == [0.9, 0.5, 0.1]  # in candidate order, not the run's
    with pytest.raises(SystemExit, match=r"query 'q1' ranks other candidates .*1 missing, 1 not among them"):
        lfp.neural_scores({"q1": {"a": 0.9, "b": 0.5, "z": 0.1}}, cands, ["q1"], Path("run"))
    with pytest.raises(SystemExit, match="3 missing"):
        lfp.neural_scores({}, cands, ["q1"], Path("run"))


def test_the_probes_features_are_bm25_the_bi_encoder_and_its_pooled_windows(tmp_path):
    """``Candidates.features``: what every window probe builds its served score from, in candidate order; a
    document's window feature pools its own windows only; a pure run is read over the same candidates."""
    from label_free import write_zst_run

    docs = {"a": np.array([1.0, 0.0]), "b": np.array([0.0, 1.0])}
    windows = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0]], dtype=np.float32)  # a: rows 0, 1; b: row 2
    c = lfp.Candidates(
        tmp_path / "coll",
        {"q": {"b": 1}},
        {"q": [("b", 7.0), ("a", 5.0)]},
        ["q"],
        docs,
        windows,
        np.array([0, 0, 1]),
        {"a": 0, "b": 1},
        [[0, 1], [2]],
        {"q": np.array([0.8, 0.6])},
    )
    f = c.features("q")
    assert c.docids("q") == ["b", "a"]
    assert f["bm25"].tolist() == [7.0, 5.0]
    assert f["dense"] == pytest.approx([0.6, 0.8])
    assert f["window"] == pytest.approx([0.6, 0.96])  # a's best window (0.6, 0.8), not b's or its first
    assert c.features("q", pool=lambda s: float(s[0]), window="w")["w"] == pytest.approx([0.6, 0.8])
    ((q, base),) = c.base()
    assert (q, base.docids, base.qrels) == ("q", ["b", "a"], {"b": 1})
    with pytest.raises(SystemExit, match=r"--neural .*: no .*coll/runs/mores\.trec\.zst"):
        c.neural(tmp_path, "mores")
    (tmp_path / "coll" / "runs").mkdir(parents=True)
    write_zst_run(tmp_path / "coll" / "runs" / "mores.trec.zst", {"q": {"a": 0.9, "b": 0.1}}, "mores")
    neural = c.neural(tmp_path, "mores")
    assert neural["q"].tolist() == [0.1, 0.9]
    ((_, scored),) = lfp.with_neural(c.base(), neural)
    assert scored.features["neural"].tolist() == [0.1, 0.9] and "neural" not in base.features


def test_the_fused_runs_are_the_weighted_sum_of_per_query_z_scores():
    """bench/label_free.py ``runs_from``, which this bench scores its fusions with."""
    from aheadrank.priors import QueryFeatures

    f = {"bm25": np.array([1.0, 2.0, 3.0]), "passage": np.array([0.2, 0.2, 0.8])}
    z = lambda x: (x - x.mean()) / x.std()  # noqa: E731
    (out,) = lfp_runs(
        [("q", QueryFeatures(["a", "b", "c"], f, {}))], {"bm25": 0.25, "passage": 0.75}
    ).values()
    assert np.allclose(list(out.values()), 0.25 * z(f["bm25"]) + 0.75 * z(f["passage"]))
    (best,) = lfp_runs([("q", QueryFeatures(["a", "b", "c"], f, {}))], {"passage": 1.0}).values()
    assert max(best, key=best.get) == "c"


def test_the_split_share_is_the_served_score_where_a_document_is_one_window():
    """``SERVED_SPLIT`` keeps the bi-encoder's third: where the best window is the whole document (the passage
    feature equals the dense one) it scores exactly as the served 1/3 each; where they differ it does not."""
    from aheadrank.build import LABEL_FREE_WEIGHTS
    from aheadrank.priors import QueryFeatures

    assert sum(lfp.SERVED_SPLIT.values()) == pytest.approx(1.0)
    dense = np.array([0.3, 0.5, 0.1, 0.4])
    f = {"neural": np.array([2.0, 1.0, 0.5, 3.0]), "bm25": np.array([9.0, 4.0, 7.0, 1.0]), "dense": dense}
    one = [("q", QueryFeatures(list("abcd"), {**f, "passage": dense.copy()}, {}))]
    (split,) = lfp_runs(one, lfp.SERVED_SPLIT).values()
    (served,) = lfp_runs(one, LABEL_FREE_WEIGHTS["neural+bm25+dense"]).values()
    assert np.allclose(list(split.values()), list(served.values()))
    other = [("q", QueryFeatures(list("abcd"), {**f, "passage": np.array([0.9, 0.1, 0.1, 0.1])}, {}))]
    (moved,) = lfp_runs(other, lfp.SERVED_SPLIT).values()
    assert moved["a"] > split["a"] and moved["b"] < split["b"]  # the best window lifts a, the others fall


def test_the_window_rule_gives_the_best_window_the_bi_encoders_weight():
    """MORES's share 1/3 gives 1/4 each (``SERVED_PASSAGES``); PreTTR's and TK's 1/6 keeps the neural score at
    2/5 of the bi-encoder's weight (1/6 against 5/12, as served), the window equal to the bi-encoder's."""
    assert lfp.window_weights(1 / 3) == pytest.approx(lfp.SERVED_PASSAGES)
    w = lfp.window_weights(1 / 6)
    assert sum(w.values()) == pytest.approx(1.0)
    assert w["bm25"] == w["dense"] == w["passage"] == pytest.approx(2.5 * w["neural"])


def test_the_window_gate_counts_documents_cut_into_two_or_more_windows(tmp_path):
    rows = [
        '{"_id": "a", "title": "T", "text": "One. Two. Three."}',  # three sentences: two windows
        '{"_id": "b", "title": "", "text": "no sentence breaks at all"}',  # one window
        '{"_id": "c", "title": "T", "text": "Only one. And two."}',  # two sentences: one window
    ]
    (tmp_path / "corpus.jsonl").write_text("\n".join(rows) + "\n")
    assert lfp.multi_window(tmp_path, 2) == pytest.approx(1 / 3)
    assert lfp.multi_window(tmp_path, 1) == pytest.approx(2 / 3)
