"""Dependencies point one way (docs/architecture.md, "Layers"): every import in the libraries, the CLI and the
benchmarks, found by walking their syntax trees (imports inside functions included), goes to the same part
or a lower one; ``rankers`` and ``store`` know nothing of each other; nothing but the CLI imports the CLI;
nobody imports a part by a top-level name (``store``, ``rankers``, ...) instead of ``aheadrank.<part>``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"rankers": "aheadrank.rankers", "store": "aheadrank.store", "indexer": "aheadrank.indexer"}
FOLDERS["services"] = "aheadrank.services"

# (module prefix, layer): a module may import its own layer or a lower one; the longest prefix decides
LAYERS = {
    # 0: what every part may use: errors, file-system faults, the line reader, run/qrels conventions, the C build,
    # the build's estimates, the passage split, memory and device checks, logging ("aheadrank" is the package's
    # own __init__ only: a new top-level module is placed here by name, or the layer test fails)
    "aheadrank": 0,
    "aheadrank.buildtime": 0,
    "aheadrank.passages": 0,
    "aheadrank.memory": 0,
    "aheadrank.devices": 0,
    "aheadrank.logs": 0,
    "aheadrank.errors": 0,
    "aheadrank.fsfaults": 0,
    "aheadrank.textio": 0,
    "aheadrank.evaluation": 0,
    "aheadrank.cbuild": 0,
    "aheadrank.kernels": 0,  # the kernels' interface: reference, compiled (torch.compile) and native paths
    # 1: the models and the store, side by side
    "aheadrank.rankers": 1,
    "aheadrank.store": 1,
    # 2: batch index builds, the BM25 part (Java, Lucene index, searcher) included
    "aheadrank.indexer": 2,
    # 3: the rerank core (fetch, score, priors, one order) and the batch jobs over it
    "aheadrank.priors": 3,
    "aheadrank.rerank": 3,
    "aheadrank.baselines": 3,
    "aheadrank.runs": 3,
    "aheadrank.build": 3,  # corpus -> served: the stages over the parts below
    # 4: the HTTP service
    "aheadrank.services": 4,
    # 5: applications: the CLI, the demo, the benchmarks
    "aheadrank.cli": 5,
    "aheadrank.demo": 5,
    "bench": 5,
    "benchkit": 5,  # bench/benchkit.py, the scripts' helpers, imported as `benchkit` (not in the wheel)
}
SIBLINGS = {("aheadrank.rankers", "aheadrank.store"), ("aheadrank.store", "aheadrank.rankers")}
CLI = "aheadrank.cli"


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[0] in FOLDERS:
        parts = [*FOLDERS[parts[0]].split("."), *parts[1:]]
    return ".".join(parts)


def part_of(module: str) -> str | None:
    """The LAYERS entry of ``module``: the longest prefix that holds it (``aheadrank`` holds only itself)."""
    best = None
    for prefix in LAYERS:
        inside = module.startswith(prefix + ".") and prefix != "aheadrank"
        if (module == prefix or inside) and (best is None or len(prefix) > len(best)):
            best = prefix
    return best


def sources() -> list[Path]:
    folders = ["aheadrank", *FOLDERS, "bench"]
    return sorted(p for f in folders for p in (REPO / f).rglob("*.py") if "__pycache__" not in p.parts)


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # `from aheadrank import cli` names a module too
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def violations(path: Path) -> list[str]:
    here = module_name(path)
    mine = part_of(here)
    assert mine is not None, f"{path}: module {here} belongs to no layer; add it to LAYERS"
    out = []
    for line, target in imports(path):
        where = f"{path.relative_to(REPO)}:{line}: {here} imports {target}"
        if target.split(".")[0] in FOLDERS:
            out.append(f"{where}: use aheadrank.{target} (the installed name)")
            continue
        theirs = part_of(target)
        if theirs is None:
            continue  # outside aheadrank (stdlib, third party), or a name imported from a module
        if (theirs == CLI or target.startswith(CLI + ".")) and mine != CLI:
            out.append(f"{where}: nothing but the CLI imports the CLI")
        elif LAYERS[theirs] > LAYERS[mine]:
            out.append(f"{where}: layer {LAYERS[mine]} may not import layer {LAYERS[theirs]} ({theirs})")
        elif (mine, theirs) in SIBLINGS:
            out.append(f"{where}: {mine} and {theirs} know nothing of each other")
    return out


def test_every_source_file_belongs_to_a_layer():
    for path in sources():
        assert part_of(module_name(path)) is not None, path
    # a top-level module nobody placed has no layer (the package's name is not a catch-all)
    assert part_of("aheadrank.newly_added") is None and part_of("aheadrank.newly_added.x") is None
    assert part_of("aheadrank") == "aheadrank" and part_of("aheadrank.kernels.tk") == "aheadrank.kernels"


def test_imports_point_down():
    found = [v for path in sources() for v in violations(path)]
    assert not found, "imports against the architecture:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("from aheadrank.services.app import create_app\n", "layer 1 may not import layer 4"),
        ("import aheadrank.cli\n", "nothing but the CLI imports the CLI"),
        ("from benchkit import write_json\n", "layer 1 may not import layer 5"),
        ("from aheadrank.store import StoreReader\n", "know nothing of each other"),
        ("from indexer.bm25 import Bm25Searcher\n", "use aheadrank.indexer.bm25"),
        ("def f():\n    from aheadrank.runs import rerank_run\n", "layer 1 may not import layer 3"),
    ],
)
def test_the_checker_catches_an_upward_import(tmp_path, monkeypatch, source, message):
    fake = REPO / "rankers" / "_architecture_probe.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source if self == fake else _read(self))
    assert any(message in v for v in violations(fake)), violations(fake)


_read = Path.read_text


def _outside_path() -> list[str]:
    """sys.path without the repository's own folders (its root, bench/, tests/...): where standard and installed
    modules are found (a virtual environment inside the repository included)."""
    import sys

    def own(p: str) -> bool:
        path = Path(p or ".").resolve()
        return path == REPO or (
            path.is_relative_to(REPO) and path.parts[len(REPO.parts)] in ("bench", "tests")
        )

    return [p for p in sys.path if p and not own(p)]


def _module_names(folder: Path) -> set[str]:
    """The top-level module names a folder offers when it is on sys.path: its .py files and its packages."""
    names = {p.stem for p in folder.glob("*.py")}
    return names | {p.name for p in folder.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}


def test_no_bench_or_test_module_takes_the_name_of_an_installed_or_standard_one():
    """``python bench/X.py`` and pytest put bench/ and the test folders first on sys.path: a module there named
    like a standard module or an installed package's is imported in its place by every library that imports that
    name. bench/kernels.py did that to the ``kernels`` package transformers 5.25 imports (every test that loaded a
    model failed with ImportError); it is bench/online_kernels.py now."""
    import importlib.machinery
    import sys

    outside = _outside_path()
    folders = [REPO / "bench", REPO / "tests", *(p for p in (REPO / "tests").iterdir() if p.is_dir())]
    taken = []
    for folder in folders:
        for name in sorted(_module_names(folder) - {"conftest"}):
            standard = name in sys.stdlib_module_names or name in sys.builtin_module_names
            if standard or importlib.machinery.PathFinder.find_spec(name, outside) is not None:
                taken.append(f"{folder.relative_to(REPO)}/{name}")
    assert not taken, f"these shadow a standard or installed module: {taken}"


def test_the_shadowing_check_sees_an_installed_name():
    import importlib.machinery
    import sys

    outside = _outside_path()
    assert importlib.machinery.PathFinder.find_spec("numpy", outside) is not None  # what the check relies on
    assert importlib.machinery.PathFinder.find_spec("online_kernels", outside) is None
    assert "json" in sys.stdlib_module_names
