"""bench/label_free_sdm.py: SDM scores a document whose query words stand together above one with the same words
apart, where BM25 ties them, and the probe is qld's with SDM in query likelihood's place."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_sdm as sdm  # noqa: E402

FILLER = "river mountain city market garden window bridge school paper music story letter".split()


def test_sdm_takes_half_of_bm25s_weight_and_keeps_the_build_on_ties():
    import label_free_qld as qld
    import label_free_window_size as ws

    assert sdm.SDM.feature == "sdm" and sdm.SDM_PROBE.options == ("none", "sdm")
    w = {"neural": 0.25, "bm25": 0.25, "dense": 0.25, "window": 0.25}
    assert qld.with_qld(w, "sdm") == {
        "neural": 0.25,
        "bm25": 0.125,
        "dense": 0.25,
        "window": 0.25,
        "sdm": 0.125,
    }
    assert ws.choose({"a": {"none": 0.40, "sdm": 0.40003}}, ["a"], sdm.SDM_PROBE) == "none"
    assert ws.choose({"a": {"none": 0.40, "sdm": 0.41}}, ["a"], sdm.SDM_PROBE) == "sdm"


@pytest.mark.slow  # needs Java
def test_words_that_stand_together_score_above_the_same_words_apart(tmp_path):
    near = ["heat", "transfer", *FILLER[:10]]
    apart = ["heat", *FILLER[:10], "transfer"]
    docs = [
        {"_id": "near", "title": "", "text": " ".join(near)},
        {"_id": "apart", "title": "", "text": " ".join(apart)},
    ]
    docs += [{"_id": f"f{i}", "title": "", "text": " ".join(FILLER[i:] + FILLER[:i])} for i in range(12)]
    collection = tmp_path / "toy"
    collection.mkdir()
    (collection / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    from aheadrank.indexer.bm25 import Bm25Searcher
    from benchkit import Bm25Hits

    got = dict(sdm.sdm_scores(collection, tmp_path / "work", {"q": "heat transfer"}, False)["q"])
    assert set(got) == {"near", "apart"}
    assert got["near"] > got["apart"]
    with Bm25Searcher(Bm25Hits(collection, tmp_path / "work", False).index) as searcher:
        bm25 = dict(searcher.search("heat transfer", 10))
    assert bm25["near"] == pytest.approx(bm25["apart"])


def test_in_place_sdm_takes_all_of_bm25s_weight():
    import label_free_qld as qld
    import label_free_sdm_in_place as ip

    assert (
        ip.IN_PLACE.feature == "sdm" and ip.IN_PLACE.name == "sdm-in-place" and ip.PROBE.options == ip.OPTIONS
    )
    w = {"neural": 0.25, "bm25": 0.25, "dense": 0.25, "window": 0.25}
    assert qld.with_qld(w, "sdm", ip.IN_PLACE.share) == {
        "neural": 0.25,
        "bm25": 0.0,
        "dense": 0.25,
        "window": 0.25,
        "sdm": 0.25,
    }
    assert sdm.SDM.name == "sdm" and sdm.SDM.share == 0.5


def test_the_replication_reads_the_split_it_is_given(monkeypatch, tmp_path):
    """``--split train`` (SDM's replication on queries no label-free setting was chosen on) reaches the probe's
    candidates and the builds' bench; the test split stays the default."""
    import benchkit
    import label_free
    import label_free_passages as lp

    neural = ["--neural", "x:mores-2ib-s2", "--collections", "a", "b"]
    from label_free_window_size import parse_args

    assert parse_args(neural).split == "test"
    args = parse_args([*neural, "--split", "train", "--data", str(tmp_path)])
    assert args.split == "train"
    assert label_free.parse_args(["--split", "train"]).split == "train"
    assert label_free.parse_args([]).split == "test"

    class Read(Exception):
        pass

    seen = []

    def eval_topics(collection, split, max_queries):
        seen.append((collection, split))
        raise Read

    monkeypatch.setattr(benchkit, "eval_topics", eval_topics)
    with pytest.raises(Read):
        lp.candidates(args, "a")
    assert seen == [(tmp_path / "a", "train")]
