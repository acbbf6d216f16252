"""bench/judged_weights.py: the equal weights it compares a judged build's fit with (bench/label_free.py's
``third_share_weights``) are a label-free MORES build's, for the features the build serves."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import judged_weights as jw  # noqa: E402
import label_free as lf  # noqa: E402

from aheadrank.build import LABEL_FREE_WEIGHTS  # noqa: E402


def test_equal_weights_are_a_label_free_mores_builds_for_the_same_features():
    assert lf.third_share_weights(["neural", "bm25", "dense"]) == pytest.approx(
        {"neural": 1 / 3, "bm25": 1 / 3, "dense": 1 / 3}
    )
    assert lf.third_share_weights(["neural", "bm25", "dense"]) == LABEL_FREE_WEIGHTS["neural+bm25+dense"]
    assert lf.third_share_weights(["neural", "bm25", "dense", "window"]) == pytest.approx(
        {"neural": 0.25, "bm25": 0.25, "dense": 0.25, "window": 0.25}
    )


def test_builds_are_given_as_collection_equals_folder():
    args = jw.parse_args(["--builds", "scifact=work/a", "cranfield=/x/b"])
    assert args.builds == {"scifact": "work/a", "cranfield": "/x/b"} and args.collections == [
        "scifact",
        "cranfield",
    ]
    with pytest.raises(SystemExit):
        jw.parse_args(["--builds", "scifact"])
