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
