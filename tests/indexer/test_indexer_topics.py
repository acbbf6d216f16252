"""Queries and qrels readers."""

from __future__ import annotations

import pytest
from aheadrank.indexer.collections import read_beir_split, read_qrels, read_queries
from indexer_testkit import SAMPLE, write_lines

from aheadrank.errors import CollectionError


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
def test_beir_queries_jsonl(tmp_path, suffix):
    path = write_lines(
        tmp_path / f"queries.jsonl{suffix}",
        [{"_id": "q1", "text": " first claim ", "metadata": {}}, "", {"_id": 2, "text": "second"}],
    )
    assert read_queries(path) == {"q1": "first claim", "2": "second"}


def test_tsv_queries_and_beir_directory(tmp_path):
    assert read_queries(write_lines(tmp_path / "topics.tsv", ["1\tone", "2\ttwo"])) == {
        "1": "one",
        "2": "two",
    }
    write_lines(tmp_path / "beir" / "queries.jsonl", [{"_id": "a", "text": "alpha"}])
    assert read_queries(tmp_path / "beir") == {"a": "alpha"}


def test_a_tsv_header_naming_the_columns_is_no_query(tmp_path):
    """`qid<TAB>query` first (pandas' `to_csv(sep="\\t")`): not a query called "qid"; later, a query as any."""
    rows = ["QID\tquery", "1\tone", "qid\tquery"]
    assert read_queries(write_lines(tmp_path / "topics.tsv.gz", rows)) == {"1": "one", "qid": "query"}
    assert read_queries(write_lines(tmp_path / "q.tsv", ["query-id\ttext", "2\ttwo"])) == {"2": "two"}


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["{oops"], r"q\.jsonl:1: invalid JSON"),
        ([{"_id": "a", "text": "x"}, {"_id": "a", "text": "y"}], r"q\.jsonl:2: query id 'a' repeated"),
        ([{"text": "no id"}], r"q\.jsonl:1: missing query id"),
        ([{"_id": "a", "text": "  "}], r"q\.jsonl:1: missing or empty query text"),
    ],
)
def test_bad_queries_raise_with_file_and_line(tmp_path, lines, message):
    with pytest.raises(CollectionError, match=message):
        read_queries(write_lines(tmp_path / "q.jsonl", lines))


def test_beir_qrels_with_and_without_header(tmp_path):
    rows = ["q1\td1\t1", "q1\td2\t2", "q2\td1\t0"]
    expected = {"q1": {"d1": 1, "d2": 2}, "q2": {"d1": 0}}
    assert read_qrels(write_lines(tmp_path / "a.tsv", ["query-id\tcorpus-id\tscore", *rows])) == expected
    assert read_qrels(write_lines(tmp_path / "b.tsv.gz", rows)) == expected


def test_trec_qrels(tmp_path):
    path = write_lines(tmp_path / "qrels.txt", ["1 0 184 2", "1 0 29 -1", "", "3 Q0 5 1.0"])
    assert read_qrels(path) == {"1": {"184": 2, "29": -1}, "3": {"5": 1}}


def test_qrels_of_a_beir_directory_split(tmp_path):
    write_lines(tmp_path / "beir" / "qrels" / "dev.tsv", ["query-id\tcorpus-id\tscore", "q\td\t1"])
    assert read_qrels(tmp_path / "beir", split="dev") == {"q": {"d": 1}}
    with pytest.raises(CollectionError, match="test.tsv"):
        read_qrels(tmp_path / "beir")


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["q d"], r"qr\.tsv:1: 2 columns"),
        (["q d 1", "q d 0"], r"qr\.tsv:2: \(q, d\) judged 1 before and 0 now"),
        (["q d 0.5"], r"qr\.tsv:1: relevance '0.5' is not an integer"),
        (["q d high"], r"qr\.tsv:1: relevance 'high' is not an integer"),
    ],
)
def test_bad_qrels_raise_with_file_and_line(tmp_path, lines, message):
    with pytest.raises(CollectionError, match=message):
        read_qrels(write_lines(tmp_path / "qr.tsv", lines))


def test_repeated_identical_judgement_is_fine(tmp_path):
    assert read_qrels(write_lines(tmp_path / "qr.tsv", ["q d 1", "q d 1"])) == {"q": {"d": 1}}


def test_bundled_sample_splits():
    train_queries, train_qrels = read_beir_split(SAMPLE, "train")
    test_queries, test_qrels = read_beir_split(SAMPLE, "test")
    assert len(train_queries) == 150 and len(test_queries) == 50
    assert not set(train_queries) & set(test_queries)
    assert set(train_queries) == set(train_qrels) and set(test_queries) == set(test_qrels)
