"""bench/rag_chunks.py on a tiny label-free build of a judged collection: documents cut into chunks that the store
does not hold, sent in one request, each document ranked by its best chunk, beside the same baselines over the chunks
and over the whole documents."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import rag_chunks  # noqa: E402


def test_a_text_is_cut_into_chunks_of_so_many_words_and_no_stub():
    text = " ".join(f"w{i}" for i in range(23))
    assert [len(c.split()) for c in rag_chunks.chunked(text, 10)] == [10, 13]  # 3 words join the chunk before
    assert [len(c.split()) for c in rag_chunks.chunked(text, 8)] == [8, 8, 7]
    assert rag_chunks.chunked("one  two\nthree", 10) == ["one two three"]
    assert " ".join(rag_chunks.chunked(text, 4)) == text  # nothing lost, nothing repeated
    assert rag_chunks.chunked("", 5) == [""]
    with pytest.raises(ValueError):
        rag_chunks.chunked(text, 0)


def test_a_chunk_of_no_words_is_refused_at_the_command_line(capsys):
    with pytest.raises(SystemExit):
        rag_chunks.parse_args(["--build", "b", "--collection", "c", "--chunk-words", "0"])
    assert "--chunk-words must be at least 1" in capsys.readouterr().err


def test_a_document_scores_its_best_chunk():
    run = {"q": {"a#0": 0.1, "a#1": 0.9, "b#0": 0.5}}
    owner = {"a#0": "a", "a#1": "a", "b#0": "b"}
    assert rag_chunks.best_chunk(run, owner) == {"q": {"a": 0.9, "b": 0.5}}


@pytest.mark.slow  # Java (the BM25 stage)
def test_the_bench_ranks_documents_by_their_chunks_beside_the_baselines(tmp_path, tiny_rag_build):
    coll, out = tiny_rag_build
    result = tmp_path / "r.json"
    args = [
        "--build",
        str(out),
        "--collection",
        str(coll),
        "--depth",
        "12",
        "--threads",
        "1",
        "--chunk-words",
        "4",
    ]
    assert rag_chunks.main([*args, "--out", str(result)]) == 0
    record = json.loads(result.read_text())
    rows = record["rows"]
    baselines = [
        f"{b} ({s})" for s in ("chunks", "documents") for b in ("bm25", "bi-encoder", "rrf", "fusion-equal")
    ]
    assert set(rows) == {rag_chunks.CHUNKS, rag_chunks.WITHOUT, rag_chunks.DOCUMENTS, *baselines}
    assert record["queries"] == 4
    shape = record["shape"]
    assert shape["chunks_per_document"] > 1 and shape["texts_sent"] > 4 * 12
    assert record["best_chunk_fusion"] in ("rrf (chunks)", "fusion-equal (chunks)")
    best = rows[record["best_chunk_fusion"]]
    assert best["vs_best_chunk_fusion"]["diff"] == pytest.approx(0.0, abs=1e-12)
    assert rows[rag_chunks.CHUNKS]["vs_chunks_without_bm25"]["diff"] == pytest.approx(
        rows[rag_chunks.CHUNKS]["ndcg10"] - rows[rag_chunks.WITHOUT]["ndcg10"], abs=1e-9
    )
    for k in (rag_chunks.CHUNKS, rag_chunks.WITHOUT, rag_chunks.DOCUMENTS):
        r = rows[k]["relevance_score"]
        assert 0 < r["relevant_mean"] < 1 and 0 < r["other_mean"] < 1 and 0 <= r["brier"] <= 1
    assert record["timing"]["requests"] == 4
    assert "chunks / documents" in result.with_suffix(".md").read_text()
