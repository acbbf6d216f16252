"""The documentation stays usable: the top-level README is a user's page (at most 300 lines), every relative
link in README.md and docs/*.md leads to a file (and heading) that exists, every bench/results path the docs and
the parts' READMEs name is in the tree, and no tracked file labels work by ordinal sessions: the project speaks of
commits, dates and commands."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README_MAX_LINES = 300
ORDINAL_LABEL = re.compile(r"[0-9]+(st|nd|rd|th) session", re.IGNORECASE)
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def tracked_files() -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [REPO / name for name in out.decode().split("\0") if name]


def prose(text: str) -> str:
    """``text`` without its fenced code blocks (a link inside a code block is not a link)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", prose(path.read_text()), re.M)}


def broken_links(path: Path, root: Path = REPO) -> list[str]:
    broken = []
    for match in LINK.finditer(prose(path.read_text())):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif not dest.is_relative_to(root):
            broken.append(f"{target} (outside the repository)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(root)})")
    return broken


def cited_results(path: Path, root: Path = REPO) -> list[str]:
    """The ``bench/results/...`` paths the prose of ``path`` names (``results/...`` too in ``bench/README.md``),
    braces expanded (``speed-rerun{,2}.json``), that match no file or folder; a ``*`` must match at least one.
    A path right after ``REV:`` (``git show 6087d9c:bench/results/...``) is a file in git history, one with a
    capitalised placeholder (``bench/results/FILE``) a pattern: neither is checked."""
    prefix = (
        r"(?:bench/)?results/"
        if path.resolve() == (root / "bench" / "README.md").resolve()
        else "bench/results/"
    )
    missing = []
    for match in re.finditer(r"(?<![\w:/.-])" + prefix + r"[\w.+{},*/-]*", prose(path.read_text())):
        cited = match.group(0).rstrip(".,-")
        rel = cited[cited.index("results/") :]
        if re.search(r"\b[A-Z]{2,}\b", rel):  # a placeholder: bench/results/FILE, results/DIR/
            continue
        for name in expand_braces(rel):
            if not list((root / "bench").glob(name.rstrip("/"))):
                missing.append(f"{cited} ({name} not found)" if name != rel else f"{cited} (not found)")
    return missing


def expand_braces(text: str) -> list[str]:
    match = re.search(r"\{([^{}]*)\}", text)
    if not match:
        return [text]
    head, tail = text[: match.start()], text[match.end() :]
    return [name for alt in match.group(1).split(",") for name in expand_braces(head + alt + tail)]


def results_citing_documents() -> list[Path]:
    parts = ["bench", "bench/device", "services", "store", "indexer", "docker"]
    return [
        *documents(),
        *(REPO / part / "README.md" for part in parts if (REPO / part / "README.md").is_file()),
    ]


@pytest.mark.parametrize("path", results_citing_documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_cited_bench_results_exist(path):
    """What the docs cite under bench/results/ is in the tree (what is no longer cited may go: git keeps it)."""
    assert cited_results(path) == []


def test_readme_is_a_users_page():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; docs/ holds the rest"


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_lead_somewhere(path):
    assert broken_links(path) == []


def test_readme_keeps_the_first_two_commands():
    text = (REPO / "README.md").read_text()
    first_block = text.split("```", 2)[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:] if line.strip()]
    assert commands[:2] == ["make demo", "make test"]


def test_no_ordinal_session_labels_in_tracked_files():
    found = []
    for path in tracked_files():
        if not path.is_file():
            continue
        data = path.read_bytes()
        if b"\0" in data:  # binary (compressed runs, images)
            continue
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if ORDINAL_LABEL.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}")
    assert found == [], "label work by commit, date or command instead:\n" + "\n".join(found)


def test_the_checks_catch_what_they_are_for(tmp_path):
    """The link check and the label pattern are not vacuous: a broken link, a missing heading and an ordinal
    label are each found."""
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("# A heading → here\n")
    page.write_text(
        "[ok](there.md#a-heading--here) [gone](missing.md) [bad anchor](there.md#nope)\n"
        "```\n[in code](missing-too.md)\n```\n"
    )
    assert broken_links(page, tmp_path) == [
        "missing.md (no such file)",
        "there.md#nope (no heading #nope in there.md)",
    ]
    assert ORDINAL_LABEL.search("measured in the " + str(21) + "st" + " session")


def test_the_results_check_finds_a_missing_file(tmp_path):
    """A cited result that is not there is found, with braces and globs expanded; history and folders pass."""
    (tmp_path / "bench" / "results" / "gpu").mkdir(parents=True)
    for name in ("speed.json", "speed-b.json", "gpu/speed-cuda.json"):
        (tmp_path / "bench" / "results" / name).write_text("{}")
    page = tmp_path / "page.md"
    page.write_text(
        "`bench/results/speed{,-b}.json`, `bench/results/gpu/`, bench/results/gpu/speed-*.json and "
        "`git show 1234567:bench/results/gone.json`, bench/results/FILE exist; `bench/results/speed{,-c}.json`, "
        "bench/results/kernels-*.json and (`bench/results/stale.png`) do not.\n```\nbench/results/in-code.json\n```\n"
    )
    assert cited_results(page, tmp_path) == [
        "bench/results/speed{,-c}.json (results/speed-c.json not found)",
        "bench/results/kernels-*.json (not found)",
        "bench/results/stale.png (not found)",
    ]


def unlisted_benchmarks(root: Path = REPO) -> list[str]:
    """The scripts in ``bench/`` (``*.py`` but the helpers, ``*.sh``) that ``bench/README.md`` does not name as
    ``bench/<script>`` (docs/architecture.md: a new benchmark is listed there)."""
    text = (root / "bench" / "README.md").read_text()
    scripts = [*(root / "bench").glob("*.py"), *(root / "bench").glob("*.sh")]
    return sorted(
        p.name
        for p in scripts
        if p.name not in ("benchkit.py", "__init__.py") and f"bench/{p.name}" not in text
    )


def test_every_benchmark_is_listed_in_bench_readme():
    assert unlisted_benchmarks() == []


def test_the_listing_check_finds_a_script_the_readme_leaves_out(tmp_path):
    (tmp_path / "bench").mkdir()
    for name in ("listed.py", "gone.py", "run.sh", "benchkit.py"):
        (tmp_path / "bench" / name).write_text("")
    (tmp_path / "bench" / "README.md").write_text("| `bench/listed.py` | ... |\n")
    assert unlisted_benchmarks(tmp_path) == ["gone.py", "run.sh"]
