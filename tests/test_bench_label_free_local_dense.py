"""bench/label_free_local_dense.py: a long document's dense feature from its passages' best cosine, the fillers that
bury a relevant text, and the choice made on the other collections (the window probes' rule)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_local_dense as ld  # noqa: E402
import label_free_window_size as ws  # noqa: E402


def test_each_text_gets_its_best_passage_s_cosine():
    qv = np.array([1.0, 0.0])
    vectors = np.array([[0.2, 0.98], [0.9, 0.44], [0.5, 0.87], [-1.0, 0.0]])
    owner = np.array([0, 0, 1, 2])
    assert ld.best_cosine(qv, vectors, owner, 3) == pytest.approx([0.9, 0.5, -1.0])


def test_the_probe_keeps_the_head_on_ties_and_chooses_on_the_others():
    probe = ld.DENSE_PROBE
    assert probe.current == "whole" == ld.CURRENT and set(ld.WINDOWS) | {"whole"} == set(ld.OPTIONS)
    served = {"a": {"whole": 0.40, "maxp": 0.41, "maxp256": 0.405}, "flat": dict.fromkeys(ld.OPTIONS, 0.3)}
    assert ws.choose(served, ["a"], probe) == "maxp"
    assert ws.choose(served, ["flat"], probe) == "whole"
    assert ws.choose({"t": {"whole": 0.4, "maxp": 0.40001, "maxp256": 0.3}}, ["t"], probe) == "whole"


def test_a_filler_is_never_a_candidate_or_relevant_and_is_fixed_by_the_query():
    from benchkit import filler_docid  # the draw bench/rag_long_texts.py buries with

    order = [f"d{i}" for i in range(10)]
    avoid = {f"d{i}" for i in range(9)}
    assert filler_docid("q1", order, avoid) == "d9"
    assert filler_docid("q7", order, set()) == filler_docid("q7", order, set())
    with pytest.raises(SystemExit, match="no filler"):
        filler_docid("q1", order, set(order))
    with pytest.raises(SystemExit, match=r"no filler \(lower --depth\)"):
        filler_docid("q1", order, set(order), " (lower --depth)")


def test_a_long_text_is_cut_as_the_ranker_cuts_it_and_a_short_one_is_one_passage():
    vectors = ld.PassageVectors(None, Path("unused"), progress=False)
    short = "a short abstract about wings"
    long = " ".join(f"word{i}" for i in range(400))
    flat, owner = vectors.split([short, long], "maxp")
    assert flat[0] == short and owner[0] == 0
    assert (owner == 1).sum() >= 3  # 400 words are far more than one 128-piece window
    flat256, owner256 = vectors.split([short, long], "maxp256")
    assert (owner256 == 1).sum() < (owner == 1).sum()


def test_a_mix_reads_the_head_and_the_passages_and_an_unknown_option_is_refused():
    per = {"whole": np.array([0.2, 0.6]), "maxp": np.array([0.5, 0.4])}
    assert ld.feature_of("whole", per) is per["whole"]
    assert ld.feature_of("max(whole,maxp)", per) == pytest.approx([0.5, 0.6])
    assert ld.feature_of("mean(whole,maxp)", per) == pytest.approx([0.35, 0.5])
    with pytest.raises(ValueError, match="unknown dense option"):
        ld.feature_of("min(whole,maxp)", per)
    local = {"whole": {"q": per["whole"]}, "maxp": {"q": per["maxp"]}}
    assert ld.option_features(local, "max(whole,maxp)")["q"] == pytest.approx([0.5, 0.6])


def test_the_mix_probe_chooses_among_the_head_and_its_mixes():
    import label_free_local_dense_mix as mix

    probe = mix.MIX_PROBE
    assert probe.current == "whole" and set(probe.options) == {"whole", *ld.MIXES}
    served = {"a": {"whole": 0.40, "max(whole,maxp)": 0.42, "mean(whole,maxp)": 0.41}}
    assert ws.choose(served, ["a"], probe) == "max(whole,maxp)"
