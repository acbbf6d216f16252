"""bench/rag_bm25.py on a tiny label-free build of a judged collection: every cell is measured in one run, and the
store's texts sent as unknown ones (encoded online, their BM25 from their text) rank as they do when found."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import rag_bm25  # noqa: E402

pytestmark = pytest.mark.slow  # Java (the BM25 stage)


def test_the_bench_measures_found_and_unknown_texts_with_and_without_bm25(tmp_path, tiny_rag_build):
    coll, out = tiny_rag_build
    result = tmp_path / "r.json"
    args = ["--build", str(out), "--collection", str(coll), "--depth", "12", "--threads", "1"]
    assert rag_bm25.main([*args, "--out", str(result)]) == 0
    record = json.loads(result.read_text())
    rows = record["rows"]
    cells = [f"{u}texts, with{o} BM25" for u in ("", "unknown ") for o in ("", "out")]
    assert set(rows) == {*cells, "/v1/rerank", "bm25", "bi-encoder", "rrf", "fusion-equal"}
    assert record["queries"] == 4 and record["stored_texts"] > 0
    for found, unknown in zip(cells[:2], cells[2:], strict=True):  # the same features either way
        assert rows[unknown]["ndcg10"] == pytest.approx(rows[found]["ndcg10"], abs=1e-9)
    # a cell with BM25 is compared with the same texts without it
    assert rows[cells[2]]["vs_without_bm25"]["diff"] == pytest.approx(
        rows[cells[2]]["ndcg10"] - rows[cells[3]]["ndcg10"], abs=1e-9
    )
    assert set(record["timing"]["ratio_with_to_without"]) == {"found", "unknown"}
    assert "| unknown |" in result.with_suffix(".md").read_text()
    # --no-unknown: the found texts only
    assert rag_bm25.main([*args, "--no-unknown", "--out", str(tmp_path / "f.json")]) == 0
    assert set(json.loads((tmp_path / "f.json").read_text())["rows"]) == {*cells[:2], *list(rows)[4:]}
