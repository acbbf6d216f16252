"""``aheadrank bm25-index`` / ``bm25-search`` through the shared typer app (in-process: one JVM)."""

from __future__ import annotations

import pytest
from aheadrank.indexer.bm25 import read_index_meta
from indexer_testkit import write_lines
from typer.testing import CliRunner

from aheadrank.cli import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in (
        "COLLECTION",
        "INDEX",
        "THREADS",
        "STRICT",
        "K1",
        "B",
        "QUERY",
        "K",
        "COLLECTION_FORMAT",
        "JAVA_HEAP",
    ):
        monkeypatch.delenv(f"AHEADRANK_{name}", raising=False)


def assert_clean_error(result, message: str) -> None:
    assert result.exit_code == 2, result.output
    assert f"error: {message}" in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.slow
def test_index_from_env_vars_then_search(tmp_path, monkeypatch):
    corpus = write_lines(
        tmp_path / "docs.tsv.gz", ["a\tthe zebra grazed", "b\tbasalt lava", "c\tplain words", "bad line"]
    )
    monkeypatch.setenv("AHEADRANK_COLLECTION", str(corpus))
    monkeypatch.setenv("AHEADRANK_INDEX", str(tmp_path / "idx"))
    monkeypatch.setenv("AHEADRANK_THREADS", "1")
    monkeypatch.setenv("AHEADRANK_B", "0.5")
    result = runner.invoke(app, ["bm25-index", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert f"indexed 3 documents into {tmp_path / 'idx'}" in result.stdout
    assert "skipped 1 records" in result.stdout
    assert read_index_meta(tmp_path / "idx")["b"] == 0.5

    result = runner.invoke(app, ["bm25-search", "--query", "zebra", "-k", "2"])
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0].split()
    assert first[:2] == ["1", "a"] and "the zebra grazed" in result.stdout

    result = runner.invoke(app, ["bm25-search", "--query", "nothing matches"])
    assert result.exit_code == 0 and "no hits" in result.stderr


@pytest.mark.slow
def test_strict_flag_turns_a_bad_line_into_an_error(tmp_path):
    corpus = write_lines(tmp_path / "docs.tsv", ["a\talpha", "b\t"])
    result = runner.invoke(
        app, ["bm25-index", "--collection", str(corpus), "--index", str(tmp_path / "i"), "--strict"]
    )
    assert_clean_error(result, f"{corpus}:2: empty_document")


def test_missing_collection_is_a_clean_error(tmp_path):
    result = runner.invoke(
        app, ["bm25-index", "--collection", str(tmp_path / "nope"), "--index", str(tmp_path / "i")]
    )
    assert_clean_error(result, "collection not found")


def test_bad_option_values_are_rejected_by_typer(tmp_path):
    args = ["bm25-index", "--collection", str(tmp_path), "--index", str(tmp_path / "i")]
    assert runner.invoke(app, [*args, "--b", "1.5"]).exit_code == 2
    assert runner.invoke(app, [*args, "--threads", "0"]).exit_code == 2
    assert runner.invoke(app, [*args, "--format", "xml"]).exit_code == 2


def test_a_malformed_java_heap_is_a_clean_error_before_any_work(tmp_path):
    corpus = write_lines(tmp_path / "docs.tsv", ["a\talpha"])
    args = ["bm25-index", "--collection", str(corpus), "--index", str(tmp_path / "i")]
    assert_clean_error(runner.invoke(app, [*args, "--java-heap", "2 GB"]), "Java heap size must look like")
    assert not (tmp_path / "i").exists()


def test_search_on_a_missing_index_is_a_clean_error(tmp_path):
    result = runner.invoke(app, ["bm25-search", "--index", str(tmp_path), "--query", "x"])
    assert_clean_error(result, "not a Lucene index")
