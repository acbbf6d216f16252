"""bench/label_free_query_log.py: the log is every query outside the test split (texts only), its labels the
equal-weight fusion's best candidate, written as a qrels split of a linked copy of the collection."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_query_log as qlog  # noqa: E402
from aheadrank.indexer.topics import read_beir_split  # noqa: E402

from aheadrank.priors import QueryFeatures  # noqa: E402


def collection(root: Path) -> Path:
    d = root / "c"
    (d / "qrels").mkdir(parents=True)
    (d / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": "", "text": f"document {i}"}) + "\n" for i in "abc")
    )
    queries = {"1": "first", "2": "second", "3": "third", "4": "fourth"}
    (d / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items())
    )
    (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n2\ta\t1\n4\tb\t1\n")
    (d / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n1\tc\t1\n")  # never read
    return d


def test_the_log_is_every_query_outside_the_test_split(tmp_path):
    d = collection(tmp_path)
    assert qlog.log_queries(d) == {"1": "first", "3": "third"}  # 3 is in no split: a query of the log too
    assert qlog.test_qids(d) == {"2", "4"}


def test_labels_are_the_fusions_best_candidate(monkeypatch):
    import aheadrank.baselines as baselines

    feats = {
        # BM25 prefers x, the bi-encoder z; the equal-weight z-score fusion puts y first
        "q": QueryFeatures(
            ["x", "y", "z"], {"bm25": np.array([3.0, 2.5, 0.0]), "dense": np.array([0.0, 0.5, 0.6])}, {}
        ),
        "empty": QueryFeatures([], {"bm25": np.array([]), "dense": np.array([])}, {}),
    }
    seen = {}

    def fake_dense_features(field, queries, hits, device="cpu"):
        seen.update(field=field, queries=queries, hits=hits)
        return feats

    monkeypatch.setattr(baselines, "dense_features", fake_dense_features)
    hits = {"q": [("x", 3.0), ("y", 2.5), ("z", 0.0)], "empty": []}
    labels = qlog.teacher_labels({"q": "a query", "empty": "none"}, hits, Path("field"), "cpu")
    assert labels == {"q": "y"}  # a query without candidates gets no label
    assert seen["field"] == Path("field") and seen["hits"] is hits


def test_the_log_collection_links_the_texts_and_holds_the_labels_as_a_split(tmp_path):
    d = collection(tmp_path)
    out = qlog.log_collection(d, {"1": "c", "3": "a"}, tmp_path / "log")
    assert (out / "corpus.jsonl").resolve() == (d / "corpus.jsonl").resolve()
    queries, qrels = read_beir_split(out, qlog.SPLIT)
    assert qrels == {"1": {"c": 1}, "3": {"a": 1}} and queries == {"1": "first", "3": "third"}
    _, test = read_beir_split(out, "test")
    assert test == {"2": {"a": 1}, "4": {"b": 1}}  # the test judgments are the collection's own
    # run again (a resumed bench): the links stay, the labels are rewritten
    qlog.log_collection(d, {"1": "b"}, out)
    assert read_beir_split(out, qlog.SPLIT)[1] == {"1": {"b": 1}}


def test_table_has_the_baselines_and_the_rankers_rows():
    cmp = {"diff": 0.01, "p": 0.5}
    result = {
        "collection": "scifact",
        "test_queries": 300,
        "log_queries": 809,
        "labels": 809,
        "variants": {
            "mores-2ib-s2": {
                "build": {"train": {"seconds": 12.0}},
                "aggregations": {
                    "maxp": {
                        "baselines": {"bm25": 0.6789, "fusion-equal": 0.7289},
                        "best_baseline": "fusion-equal",
                        "runs": {"pure": {"ndcg10": 0.7, "vs_bm25": cmp, "vs_best_baseline": cmp}},
                    }
                },
            }
        },
    }
    md = qlog.table([result])
    assert "### scifact (300 test queries; the log: 809 unjudged queries, 809 teacher labels)" in md
    assert "| maxp | bm25 | 0.6789 | | |" in md
    assert "| maxp | mores-2ib-s2 pure | 0.7000 | +0.0100 (p 0.5) | +0.0100 (p 0.5) vs fusion-equal |" in md
    assert "build stages (s) of mores-2ib-s2: train=12" in md
