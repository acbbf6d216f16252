"""bench/revisions.py times the same paths at two revisions side by side: each worker imports aheadrank from its
own tree (it refuses to run otherwise), and two checkouts of the same code give the same scores."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import revisions  # noqa: E402


def _in_git_checkout() -> bool:
    if shutil.which("git") is None:
        return False
    found = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True)
    return found.returncode == 0


@pytest.mark.skipif(not _in_git_checkout(), reason="needs the project's git history")
def test_two_checkouts_of_the_same_revision_agree(tmp_path):
    out = tmp_path / "rev.json"
    report = revisions.main(
        ["--old", "HEAD", "--new", "HEAD", "--rankers", "tk-1l", "--d", "16", "--n", "5", "--rounds", "2",
         "--repeats", "1", "--out", str(out)]
    )  # fmt: skip
    (row,) = report["rows"]
    assert row["case"] == "tk-1l d=16"
    assert row["max_rel_score_diff"] == 0.0  # the same code on the same inputs: the same bits
    assert row["old_ms_min"] > 0 and row["new_ms_min"] > 0
    assert json.loads(out.read_text())["rows"] == report["rows"]


def test_the_package_folder_maps_every_subpackage(tmp_path):
    folder = revisions.package_folder(ROOT, tmp_path / "pkg")
    for name in ("rankers", "store", "services", "indexer"):
        assert (folder / "aheadrank" / name).resolve() == (ROOT / name).resolve()
    assert (folder / "aheadrank" / "__init__.py").resolve() == (ROOT / "aheadrank" / "__init__.py").resolve()
