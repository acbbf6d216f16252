"""bench/label_free_sim_space.py: the residual's cosine is the ranker's, and a collection's space is chosen on the
other collections' served scores, the value space keeping ties."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_sim_space as ss  # noqa: E402


def test_the_cosine_is_the_residual_s():
    rng = np.random.default_rng(0)
    q, d = rng.normal(size=8), rng.normal(size=(5, 8))
    d[3] = 0.0  # a zero vector scores 0, not nan
    want = F.cosine_similarity(torch.tensor(q)[None], torch.tensor(d), dim=-1, eps=1e-6).numpy()
    assert ss.cosines(q, d) == pytest.approx(want, abs=1e-12)
    assert ss.cosines(q, d)[3] == 0.0


def test_a_collection_s_space_is_chosen_on_the_others_and_the_value_space_keeps_ties():
    served = {
        "a": {"values": 0.40, "states": 0.42},
        "b": {"values": 0.55, "states": 0.54},
        "t": {"values": 0.0, "states": 1.0},  # the target's own numbers never count
    }
    assert ss.choose(served, ["a"]) == "states"
    assert ss.choose(served, ["b"]) == "values"
    assert ss.choose(served, ["a", "b"]) == "states"  # means 0.475 / 0.48
    assert ss.choose({"c": {"values": 0.41, "states": 0.41003}}, ["c"]) == "values"


def test_the_probe_scores_the_label_free_start_a_build_makes():
    from aheadrank.rankers.recipe import LABEL_FREE_DOC_LEN

    ranker, strategy = ss.start_ranker(None)
    assert strategy == "s2" and ranker.config.sim and ranker._text().max_doc_len == LABEL_FREE_DOC_LEN
    # the value space's vectors are the ranker's own residual: its score of a (query, document) pair is
    # α·cos of them, and its head starts at zero
    q_states, q_values = ss.query_vectors(ranker, ["cell growth in mice"])
    d_states, d_values = ss.passage_vectors(ranker, ["Mice cells grow faster when fed.", "Stars."], False)
    with torch.inference_mode():
        fields = ranker.encode_documents(["Mice cells grow faster when fed.", "Stars."])
        want = ranker.score(ranker.encode_query("cell growth in mice"), fields).numpy()
    alpha = float(ranker.sim.scale)
    assert alpha * ss.cosines(q_values[0], d_values) == pytest.approx(want, rel=1e-4, abs=1e-4)
    assert not np.allclose(ss.cosines(q_states[0], d_states), ss.cosines(q_values[0], d_values))


def test_the_held_out_probe_chooses_on_the_others_and_vetoes_a_loss(tmp_path):
    import json
    from types import SimpleNamespace

    qrels = {"q1": {"a": 1}, "q2": {"b": 1}, "q3": {"a": 1}}
    good = {q: {"a": 2.0 if q != "q2" else 0.0, "b": 1.0} for q in qrels}
    bad = {q: {"a": 0.0 if q != "q2" else 2.0, "b": 1.0} for q in qrels}

    def rows(served: dict) -> dict:
        runs = {k: good for k in ("bm25", "bi-encoder", "rrf", "fusion-equal")}
        for o in ("values", "states"):
            runs[f"mores-2ib-s2-{o}"] = runs[f"mores-2ib-s2-{o}+priors"] = good if o == "values" else bad
        ndcg = dict.fromkeys(runs, 0.5)
        return {"qrels": qrels, "runs": runs, "ndcg": ndcg, "served": served, "gate": False, "check": None}

    args = SimpleNamespace(collections=["a", "b", "c"], out=tmp_path, aggregation="maxp", started=0.0)
    by = {
        "a": rows({"values": 0.40, "states": 0.45}),
        "b": rows({"values": 0.50, "states": 0.52}),
        "c": rows({"values": 0.60, "states": 0.55}),  # chosen states on a and b, and serves worse with it
    }
    assert ss.held_out_probe(args, [], by, ss.SPACES, "values", "probe", key="space") == 0
    got = json.loads((tmp_path / "probe.json").read_text())
    assert {c: got["results"][c]["space"] for c in "abc"} == {"a": "values", "b": "values", "c": "states"}
    # means a+b+c: values 0.5, states 0.5067: the choice over all is states, vetoed by c
    assert got["default"] == "states" and got["veto"] == {"a": True, "b": True, "c": False}
    assert got["adopted"] == "values"
    assert got["results"]["c"]["held_out"]["+priors"]["run"] == "mores-2ib-s2-states+priors"
    assert (tmp_path / "c" / "runs" / "mores-2ib-s2-states+priors.trec.zst").exists()
