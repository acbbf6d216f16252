"""bench/titles_only.py: a BEIR collection rewritten as its titles alone (or their first N words), judgments kept."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import titles_only  # noqa: E402


def test_each_document_becomes_its_title_and_the_judgments_stay(tmp_path):
    src = tmp_path / "c"
    (src / "qrels").mkdir(parents=True)
    docs = [
        ("a", "Bean  intake and renal\tbenefits", "A long body."),
        ("b", "", "No title here."),
        ("c", "One", "x"),
    ]
    (src / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": t, "text": b}) + "\n" for i, t, b in docs)
    )
    (src / "queries.jsonl").write_text(json.dumps({"_id": "1", "text": "beans"}) + "\n")
    (src / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n1\ta\t1\n1\tb\t1\n")

    counts = titles_only.titles_only(src, tmp_path / "out", words=None)
    rows = [json.loads(x) for x in (tmp_path / "out" / "corpus.jsonl").read_text().splitlines()]
    assert rows == [
        {"_id": "a", "title": "", "text": "Bean intake and renal benefits"},
        {"_id": "c", "title": "", "text": "One"},
    ]
    assert counts == {"documents": 2, "untitled_dropped": 1, "mean_words": 3.0}
    assert (tmp_path / "out" / "qrels" / "test.tsv").read_text() == (src / "qrels" / "test.tsv").read_text()
    assert (tmp_path / "out" / "queries.jsonl").read_text() == (src / "queries.jsonl").read_text()

    assert (
        titles_only.main(["--data", str(tmp_path), "--out", str(tmp_path / "short"), "--words", "2", "c"])
        == 0
    )
    first = json.loads((tmp_path / "short" / "c-titles2" / "corpus.jsonl").read_text().splitlines()[0])
    assert first["text"] == "Bean intake"
