"""bench/calibration.py on a tiny label-free build of a judged collection: every feature set the build's
calibration has is measured, the window prior's included, and a document stored as passages is scored by the
aggregation the build serves (not the collect_features default)."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
from conftest import build_tiny_label_free, write_judged_collection

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import calibration  # noqa: E402

from aheadrank.build import paths  # noqa: E402
from aheadrank.passages import LABEL_FREE_AGGREGATION  # noqa: E402
from aheadrank.priors import read_priors  # noqa: E402

pytestmark = pytest.mark.slow  # Java (the BM25 stage)


def test_the_bench_measures_what_a_label_free_build_serves(tmp_path, tiny_base):
    qids = {"train": ["q0", "q1", "q2", "q3"], "test": ["q4", "q5", "q6", "q7"]}
    # every other document longer than the window (128 pieces), all of several sentence windows
    coll = write_judged_collection(tmp_path / "coll", random.Random(5), 40, (20, 5), qids)
    out = tmp_path / "b"
    build_tiny_label_free(coll, out, tiny_base, max_queries=80)
    cal = read_priors(paths(out)["checkpoint"]).calibrated()
    assert cal is not None and "neural+bm25+dense+window" in cal.platt  # the priors weigh the window
    result = tmp_path / "c.json"
    argv = ["--build", str(out), "--collection", str(coll), "--depth", "12", "--threads", "1"]
    record = calibration.main([*argv, "--judged-queries", "3", "--out", str(result)])
    assert record["passage_aggregation"] == LABEL_FREE_AGGREGATION  # what the build serves
    assert record["test"]["queries"] == 4 and record["judged_fit"]["queries"] == 3
    measured = {r["features"] for r in record["rows"].values()}
    assert measured == set(calibration.FEATURE_SETS) & set(cal.platt)
    assert {"neural+dense+window", "neural+bm25+dense+window"} <= measured
    for r in record["rows"].values():
        assert 0.0 <= r["ece"] <= 1.0 and 0.0 <= r["ndcg10"] <= 1.0
    md = result.with_suffix(".md").read_text()
    assert f"scored by `{LABEL_FREE_AGGREGATION}`" in md and "neural+bm25+dense+window" in md
