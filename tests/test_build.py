"""``aheadrank build``: a collection without judgments to a servable directory in resumable stages; ``serve DIR``."""

from __future__ import annotations

import json
import random

import pytest
from aheadrank.rankers import load_ranker
from aheadrank.store import StoreReader
from typer.testing import CliRunner

from aheadrank.build import BUILD_FILE, LABEL_FREE_WEIGHTS, STAGES, BuildPlan, build, paths, read_record
from aheadrank.cli import app
from aheadrank.cli.serve import from_build
from aheadrank.errors import AheadrankError
from aheadrank.priors import read_priors

pytestmark = pytest.mark.slow  # Java (the BM25 stage)

WORDS = (
    "wing lift drag shock flow boundary layer heat plate cone pressure supersonic laminar turbulent nozzle "
    "jet vortex panel flutter buckling shell"
).split()


@pytest.fixture(scope="module")
def passages(tmp_path_factory):
    """80 passages without titles or judgments, as a plain JSONL (the label-free journey)."""
    rng = random.Random(7)
    path = tmp_path_factory.mktemp("coll") / "passages.jsonl"
    lines = []
    for i in range(80):
        sentences = [" ".join(rng.choices(WORDS, k=rng.randint(7, 12))) for _ in range(3)]
        lines.append(json.dumps({"id": f"p{i}", "contents": ". ".join(sentences) + "."}))
    path.write_text("\n".join(lines) + "\n")
    return path


def plan(passages, out, tiny_base, **kw) -> BuildPlan:
    return BuildPlan(
        str(passages),
        str(out),
        ranker="tk-1l",
        steps=2,
        max_queries=40,
        base=str(tiny_base),
        progress=False,
        **kw,
    )


def test_build_label_free_then_resume_and_serve_settings(passages, tiny_base, tmp_path):
    out = tmp_path / "b"
    said: list[str] = []
    record = build(plan(passages, out, tiny_base), echo=said.append)
    assert list(record.stages) == list(STAGES)
    assert record.stages["queries"]["pseudo_queries"] >= 20
    assert all("seconds" in s for s in record.stages.values())
    p = paths(out)
    ranker = load_ranker(p["checkpoint"])  # fingerprint (priors included) verified on load
    assert ranker.config.extra["label_free"]["queries"] == record.stages["queries"]["pseudo_queries"]
    priors = read_priors(p["checkpoint"])
    assert priors.weights == LABEL_FREE_WEIGHTS and priors.dense["fingerprint"]
    with StoreReader(p["store"]) as reader:
        assert len(reader) == 80
        reader.check_fingerprint(ranker.fingerprint)
    # a rerun does nothing again: every stage is "done before"
    again: list[str] = []
    build(plan(passages, out, tiny_base), echo=again.append)
    assert sum("done before" in line for line in again) == len(STAGES)
    # other settings for a finished build are refused, not mixed in
    with pytest.raises(AheadrankError, match="other settings"):
        build(plan(passages, out, tiny_base, seed=1), echo=lambda _: None)
    settings = from_build(out, {"checkpoint": None, "store": None, "index": None, "port": 1})
    assert settings == {"checkpoint": p["checkpoint"], "store": p["store"], "index": p["lucene"], "port": 1}


def test_serve_refuses_an_unfinished_build_and_a_plain_folder(passages, tiny_base, tmp_path):
    out = tmp_path / "half"
    build(plan(passages, out, tiny_base), until="queries", echo=lambda _: None)
    assert list(read_record(out).stages) == ["collection", "bm25", "queries"]
    with pytest.raises(AheadrankError, match="stages left: dense, train, store, priors"):
        from_build(out, {"checkpoint": None})
    with pytest.raises(AheadrankError, match=BUILD_FILE):
        from_build(tmp_path, {"checkpoint": None})
    with pytest.raises(AheadrankError, match="--checkpoint"):
        from_build(None, {"checkpoint": None})


def test_a_collection_that_cannot_be_used_is_one_error_line(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text('{"id": "a", "contents": ""}\n{not json\n')
    result = CliRunner().invoke(app, ["build", "--collection", str(empty), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "no usable document" in result.output and "Traceback" not in result.output
