"""The bundled demo collection is consistent, small, and exactly what bench/make_sample.py produces."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from aheadrank.indexer.collections import Collection, read_qrels, read_queries
from indexer_testkit import SAMPLE, shared_dataset

REPO = Path(__file__).resolve().parents[2]
FILES = ["corpus.jsonl", "queries.jsonl", "qrels/train.tsv", "qrels/test.tsv", "SOURCE.md"]


def test_sample_is_small_and_self_consistent():
    assert sum((SAMPLE / name).stat().st_size for name in FILES) < 2_000_000
    docids = {doc.docid for doc in Collection(SAMPLE, strict=True)}
    queries = read_queries(SAMPLE)
    for split in ("train", "test"):
        qrels = read_qrels(SAMPLE, split)
        assert set(qrels) <= set(queries)
        assert {d for judged in qrels.values() for d in judged} <= docids  # every judged doc is present
    assert "Licence" in (SAMPLE / "SOURCE.md").read_text()


def test_make_sample_regenerates_the_same_bytes(tmp_path):
    source = shared_dataset("scifact")
    subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "make_sample.py"),
            "--source",
            str(source),
            "--out",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
    )
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (SAMPLE / name).read_bytes(), name
