"""bench/few_judged_training.py: each size's draw of judged queries is fixed by the seed, holds only queries with a
relevant document, and the collection copy a judged build trains on holds exactly that draw's judgments and the
source's test split."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import few_judged_training as fjt  # noqa: E402
from aheadrank.indexer.topics import read_beir_split, read_qrels  # noqa: E402

from aheadrank.build import judged_split  # noqa: E402


@pytest.fixture
def source(tmp_path):
    folder = tmp_path / "src"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "title": "", "text": f"text {i}"}) + "\n" for i in range(30))
    )
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": f"query {i}"}) + "\n" for i in range(25))
    )
    train = "".join(f"q{i}\td{i}\t{0 if i == 3 else 1}\n" for i in range(20))
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + train + "q5\td6\t2\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq20\td20\t1\nq21\td21\t1\n")
    return folder


def test_a_draw_is_fixed_by_its_seed_and_holds_only_queries_with_a_relevant_document(source):
    qrels = read_qrels(source, "train")
    a = fjt.drawn(qrels, 10, 0)
    assert a == fjt.drawn(qrels, 10, 0) and len(set(a)) == 10 and "q3" not in a
    assert a != fjt.drawn(qrels, 10, 1)
    assert sorted(fjt.drawn(qrels, 19, 0)) == sorted(q for q in qrels if q != "q3")
    with pytest.raises(SystemExit, match="only 19 judged train queries"):
        fjt.drawn(qrels, 20, 0)


def test_the_copy_holds_the_draws_judgments_and_the_sources_test_split(source, tmp_path):
    qids = fjt.drawn(read_qrels(source, "train"), 5, 0)
    copy = fjt.judged_copy(source, tmp_path / "copy", qids)
    train = read_qrels(copy, "train")
    full = read_qrels(source, "train")
    assert sorted(train) == qids and all(train[q] == full[q] for q in qids)
    assert read_beir_split(copy, "test") == read_beir_split(source, "test")
    assert (copy / "corpus.jsonl").read_text() == (source / "corpus.jsonl").read_text()
    assert judged_split(copy, "auto") == "train"
    # made again with the same draw: the same; with another, rewritten
    before = (copy / "qrels" / "train.tsv").stat().st_mtime_ns
    fjt.judged_copy(source, tmp_path / "copy", qids)
    assert (copy / "qrels" / "train.tsv").stat().st_mtime_ns == before
    other = fjt.drawn(read_qrels(source, "train"), 6, 0)
    assert sorted(read_qrels(fjt.judged_copy(source, tmp_path / "copy", other), "train")) == other
