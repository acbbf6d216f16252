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


BEFORE_RENAME = "e951f5f"  # the last commit whose benchmark of the online kernels was bench/kernels.py


def _has_commit(rev: str) -> bool:
    return _in_git_checkout() and (
        subprocess.run(
            ["git", "-C", str(ROOT), "cat-file", "-e", f"{rev}^{{commit}}"], capture_output=True
        ).returncode
        == 0
    )


@pytest.mark.skipif(not _has_commit(BEFORE_RENAME), reason="needs the project's git history")
def test_a_revision_from_before_the_rename_of_bench_kernels_still_compares(tmp_path):
    """bench/kernels.py is bench/online_kernels.py now (a module named ``kernels`` first on sys.path stood in for
    the package transformers imports); an older revision's worker loads its bench/kernels.py under the new name,
    with the installed ``kernels`` package left in place."""
    report = revisions.main(
        ["--old", BEFORE_RENAME, "--new", "HEAD", "--rankers", "tk-1l", "--d", "16", "--n", "5", "--rounds", "1",
         "--repeats", "1", "--out", str(tmp_path / "rev.json")]
    )  # fmt: skip
    (row,) = report["rows"]
    assert row["case"] == "tk-1l d=16" and row["old_ms_min"] > 0 and row["new_ms_min"] > 0
    assert row["max_rel_score_diff"] < 1e-5  # TK's code is the same in both: the same scores
