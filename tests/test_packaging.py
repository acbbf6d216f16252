"""What the wheel holds is declared, so ``pip install`` prints no setuptools "Package would be ignored" warning:
every folder Python would import as a subpackage of an installed part is in ``[tool.setuptools] packages``, and
the bundled SciFact sample is package data of the package that holds it."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11

REPO = Path(__file__).resolve().parents[1]


def setuptools_config() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def importable_folders(package: str, folder: Path) -> list[str]:
    """``package`` and the folders below ``folder`` that Python imports as its subpackages (identifier names,
    reached through identifier names), as setuptools finds them."""
    found = [package]
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        if sub.name.isidentifier() and sub.name != "__pycache__":
            found += importable_folders(f"{package}.{sub.name}", sub)
    return found


def test_every_importable_folder_is_a_declared_package():
    config = setuptools_config()
    declared = set(config["packages"])
    folders = config["package-dir"]
    roots = [p for p in declared if p in folders]
    assert "aheadrank" in roots
    undeclared = {
        name
        for root in roots
        for name in importable_folders(root, REPO / folders[root])
        if name not in declared
    }
    assert not undeclared, f"add to [tool.setuptools] packages (or setuptools warns and skips): {undeclared}"


def test_the_bundled_sample_is_package_data():
    config = setuptools_config()
    sample = REPO / "aheadrank" / "data" / "scifact-sample"
    files = {p for p in sample.rglob("*") if p.is_file()}
    assert {"corpus.jsonl", "queries.jsonl", "test.tsv"} <= {f.name for f in files}
    globs = config["package-data"].get("aheadrank.data", [])
    packaged = {p for g in globs for p in sample.parent.glob(g)}  # setuptools globs in the package's folder
    assert files <= packaged, f"not package data of aheadrank.data: {sorted(map(str, files - packaged))}"
