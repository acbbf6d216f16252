"""``aheadrank build``: a collection without judgments to a servable directory in resumable stages; ``serve DIR``."""

from __future__ import annotations

import json
import os
import random
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from aheadrank.rankers import load_ranker
from aheadrank.store import StoreReader
from typer.testing import CliRunner

from aheadrank.build import (
    BUILD_FILE,
    BUILD_LOCK,
    STAGES,
    BuildPlan,
    BuildRecord,
    build,
    dense_timed,
    label_free_weights,
    paths,
    read_queries,
    read_record,
    workload,
)
from aheadrank.buildtime import duration, reference_seconds
from aheadrank.cli import app
from aheadrank.cli.serve import from_build
from aheadrank.errors import AheadrankError
from aheadrank.fsfaults import BuildLockedError, exclusive_lock
from aheadrank.passages import LABEL_FREE_AGGREGATION
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
    given = {
        "ranker": "tk-1l",
        "steps": 2,
        "max_queries": 40,
        "base": str(tiny_base),
        "progress": False,
        **kw,
    }
    return BuildPlan(str(passages), str(out), **given)


def test_build_label_free_then_resume_and_serve_settings(passages, tiny_base, tmp_path):
    out = tmp_path / "b"
    said: list[str] = []
    record = build(plan(passages, out, tiny_base), echo=said.append)
    assert list(record.stages) == list(STAGES)
    assert record.stages["queries"]["pseudo_queries"] >= 20
    assert all("seconds" in s for s in record.stages.values())
    if sys.platform == "linux":  # each stage's own peak memory, and the largest named in the last line
        peaks = {k: s["peak_rss_mb"] for k, s in record.stages.items()}
        anon = {k: s["peak_anon_mb"] for k, s in record.stages.items()}
        assert all(v > 0 for v in peaks.values()), peaks
        assert all(0 < anon[k] <= peaks[k] for k in peaks), (anon, peaks)
        top, top_anon = max(peaks, key=peaks.get), max(anon, key=anon.get)
        assert said[-1].endswith(
            f"; peak memory {peaks[top]:,} MB resident ({top} stage), {anon[top_anon]:,} MB anonymous "
            f"({top_anon} stage)"
        ), said[-1]
    p = paths(out)
    ranker = load_ranker(p["checkpoint"])  # fingerprint (priors included) verified on load
    assert ranker.config.extra["label_free"]["queries"] == record.stages["queries"]["pseudo_queries"]
    priors = read_priors(p["checkpoint"])
    # every passage is three sentences, two windows: the store holds them and the served score weighs the best
    assert record.stages["collection"]["multi_window"] == 1.0 and record.stages["store"]["windows"]
    assert priors.weights == label_free_weights("tk", window=True) and priors.dense["fingerprint"]
    assert (
        record.stages["priors"]["weights"]
        == label_free_weights("tk", window=True)["neural+bm25+dense+window"]
    )
    with StoreReader(p["store"]) as reader:
        assert len(reader) == 80
        reader.check_fingerprint(ranker.fingerprint)
    with StoreReader(p["store"] / "windows") as windows:
        assert len(windows) == 160 and windows.docids()[:2] == ["p0#p0", "p0#p1"]
    # the time the stages ahead should take: at the reference rates once the collection is read, then scaled by
    # the dense stage's time against its estimate
    estimates = [line for line in said if line.startswith("[estimate]")]
    assert len(estimates) == 2, said
    assert re.match(r"\[collection\] \d+ s ", said[said.index(estimates[0]) - 1])
    assert re.match(r"\[dense\] \d+ s", said[said.index(estimates[1]) - 1])
    assert "refined after the dense stage" in estimates[0]
    # the first is scaled by the speed probe of the collection stage: the bi-encoder on two batches (fewer here)
    probe = record.stages["collection"]["probe"]
    assert 0 < probe["documents"] <= 128 and probe["seconds"] > 0 and probe["scale"] > 0
    assert probe["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert f"a probe of {probe['documents']} documents ran" in estimates[0]
    first = reference_seconds(workload(plan(passages, out, tiny_base), record.stages["collection"]))
    total = sum(first[s] * probe["scale"] for s in STAGES[1:])
    assert re.match(rf"\[estimate\] about {re.escape(duration(total))} left", estimates[0]), estimates[0]
    assert "bm25" not in estimates[1] and "train" in estimates[1] and "as the dense stage ran" in estimates[1]
    # and the disk the store will take, from the ranker's fields: the same order as what it wrote
    disk = [re.search(r"; the store about (\S+) ([kMG]?B) on disk \(float16\)$", e) for e in estimates]
    assert all(disk) and disk[0].groups() == disk[1].groups(), estimates
    written = record.stages["store"]["store_bytes"]
    assert 0.25 < record.stages["store"]["store_bytes_estimate"] / written < 4
    assert "earlier run" not in estimates[1]
    # a rerun does nothing again: every stage is "done before", nothing is left to estimate
    again: list[str] = []
    build(plan(passages, out, tiny_base), echo=again.append)
    assert sum("done before" in line for line in again) == len(STAGES)
    assert not any(line.startswith("[estimate]") for line in again)
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
    # resumed: the dense stage timed now scales the estimate of the stages after it; timed in an earlier run, the
    # line says so (its time may be another day's)
    said: list[str] = []
    build(plan(passages, out, tiny_base), until="dense", echo=said.append)
    (line,) = [line for line in said if line.startswith("[estimate]")]  # after the collection, done before
    assert "refined after the dense stage" in line and "()" not in line
    said.clear()
    build(plan(passages, out, tiny_base), until="train", echo=said.append)
    (line,) = [line for line in said if line.startswith("[estimate]")]
    assert "train" in line and "as the dense stage ran" in line and "in an earlier run" in line
    dense_done = [x for x in said if x.startswith("[dense] done before")]
    assert said.index(line) == said.index(dense_done[0]) + 1
    with pytest.raises(AheadrankError, match=BUILD_FILE):
        from_build(tmp_path, {"checkpoint": None})
    with pytest.raises(AheadrankError, match="--checkpoint"):
        from_build(None, {"checkpoint": None})


def test_a_dense_field_found_complete_leaves_the_estimate_to_the_probe(passages, tiny_base, tmp_path):
    """A dense stage that found its field complete (linked into the folder, or resumed after its work) took no
    time: the line after it keeps the probe's scale instead of one worked out from those 0 seconds."""
    first, second = tmp_path / "a", tmp_path / "b"
    build(plan(passages, first, tiny_base), until="dense", echo=lambda _: None)
    second.mkdir()
    for key in ("lucene", "dense", "windows"):  # what a bench does to share one field between builds
        paths(second)[key].symlink_to(paths(first)[key].resolve())
    said: list[str] = []
    record = build(plan(passages, second, tiny_base), until="train", echo=said.append)
    assert "docs_per_s" not in record.stages["dense"]
    assert not dense_timed(record.stages["dense"]) and dense_timed(read_record(first).stages["dense"])
    (line,) = [
        x for x in said if x.startswith("[estimate]") and said[said.index(x) - 1].startswith("[dense]")
    ]
    probe = record.stages["collection"]["probe"]
    assert f"a probe of {probe['documents']} documents ran" in line and "as the dense stage ran" not in line
    assert "refined after the dense stage" not in line


def test_dense_timed_only_for_a_stage_that_encoded_all_its_work():
    assert dense_timed({"seconds": 9.0, "docs_per_s": 3.0})
    assert dense_timed({"seconds": 9.0, "docs_per_s": 3.0, "windows": {"windows": 9, "windows_per_s": 2.0}})
    assert not dense_timed({"seconds": 0.1})  # the field was complete
    assert not dense_timed({"seconds": 5.0, "docs_per_s": 3.0, "documents_reused": 1_024})  # resumed in part
    assert not dense_timed(
        {"seconds": 5.0, "docs_per_s": 3.0, "windows": {"seconds": 0.0}}
    )  # windows complete
    windows = {"windows": 9, "windows_per_s": 2.0, "windows_reused": 4}
    assert not dense_timed({"seconds": 5.0, "docs_per_s": 3.0, "windows": windows})


def test_a_build_begun_under_another_shard_size_goes_on_in_it_and_serves(
    passages, tiny_base, tmp_path, monkeypatch
):
    """A build whose dense field was cut into shards of another size (begun under another default) stores its
    ranker's fields in the same shards, so the dense field and the windows bind to the store and are served."""
    import aheadrank.indexer.build as ib
    from aheadrank.store import read_manifest

    from aheadrank.rerank import PriorScorer

    out = tmp_path / "b"
    monkeypatch.setattr(ib, "DEFAULT_SHARD_SIZE", 32)
    build(plan(passages, out, tiny_base, steps=0), until="dense", echo=lambda _: None)
    monkeypatch.setattr(ib, "DEFAULT_SHARD_SIZE", 1_024)
    build(plan(passages, out, tiny_base, steps=0), echo=lambda _: None)
    p = paths(out)
    assert [s.n_docs for s in read_manifest(p["store"]).shards] == [32, 32, 16]  # 80 passages
    assert [s.n_docs for s in read_manifest(p["store"] / "dense").shards] == [32, 32, 16]
    ranker = load_ranker(p["checkpoint"])
    with StoreReader(p["store"]) as main:
        scorer = PriorScorer(ranker, p["store"], main_reader=main)
        assert scorer.dense_reader is not None and scorer.windows is not None, scorer.notices
        scorer.dense_reader.close()
        scorer.windows.reader.close()


def test_a_catalogue_of_short_texts_builds_and_serves(tmp_path, tiny_base):
    """Items of 4-9 words (no document has the 16 words a span query needs), as a TSV with its columns named
    `sku<TAB>name`: every stage runs on keyword pseudo-queries, the score is calibrated on the held-out ones, and
    the build re-ranks by its served score (before keyword queries: refused at the queries stage)."""
    from aheadrank.indexer.bm25 import Bm25Searcher

    from aheadrank.runs import rerank_run

    rng = random.Random(3)
    items = {f"sku{i}": " ".join(rng.choices(WORDS, k=rng.randint(4, 9))) for i in range(150)}
    tsv = tmp_path / "items.tsv"
    tsv.write_text("sku\tname\n" + "".join(f"{k}\t{v}\n" for k, v in items.items()))
    out = tmp_path / "o"
    record = build(plan(tsv, out, tiny_base, steps=0), echo=lambda _: None)
    assert list(record.stages) == list(STAGES)
    assert record.stages["collection"]["documents"] == 150 and record.stages["collection"]["headers"] == 1
    assert record.stages["collection"]["language"]["guess"] == "en"
    assert (
        set(record.stages["queries"]["kinds"]) == {"keywords"}
        and record.stages["queries"]["pseudo_queries"] == 40  # max_queries
    )
    assert record.stages["priors"]["calibration"]["labels"] == "pseudo-queries"
    p = paths(out)
    query = " ".join(items["sku7"].split()[:3])
    with Bm25Searcher(p["lucene"]) as bm25:  # what the service takes its candidates from
        hits = bm25.search(query, 40)
    assert "sku7" in dict(hits)
    run, stats = rerank_run(p["checkpoint"], p["store"], {"q": query}, {"q": hits}, progress=False)
    assert (
        set(run["q"]) == set(dict(hits)) and not stats.notices
    )  # every prior there, the calibration included


def test_a_french_collection_gets_the_french_analyzer_and_the_choice_is_pinned(tmp_path, tiny_base):
    """--language auto (the default): the collection stage's guess picks BM25's analyzer, recorded in the stage and
    the index (so every search analyses queries alike); a rerun with another --language is refused, an unknown
    one before any work, on the command line too."""
    from aheadrank.indexer.bm25 import Bm25Searcher, read_index_meta

    sentences = [
        "Les chevaux courent dans le pré avec les enfants du village.",
        "Le chat dort sur le canapé pendant que la pluie tombe.",
        "Nous avons mangé une soupe chaude dans la cuisine de la maison.",
    ]
    path = tmp_path / "fr.jsonl"
    path.write_text(
        "".join(json.dumps({"id": f"d{i}", "contents": sentences[i % 3]}) + "\n" for i in range(30))
    )
    out = tmp_path / "o"
    record = build(plan(path, out, tiny_base), until="bm25", echo=lambda _: None)
    assert (
        record.stages["collection"]["language"]["guess"] == "fr" and record.stages["bm25"]["language"] == "fr"
    )
    assert read_index_meta(paths(out)["lucene"])["language"] == "fr"
    with Bm25Searcher(paths(out)["lucene"]) as searcher:
        assert searcher.search("le") == [] and searcher.search("cheval")  # French stopwords and stems
    with pytest.raises(AheadrankError, match="other settings .*language: built with 'auto', now 'en'"):
        build(plan(path, out, tiny_base, language="en"), until="bm25", echo=lambda _: None)
    with pytest.raises(AheadrankError, match="--language is auto or one of en, fr"):
        build(plan(path, tmp_path / "x", tiny_base, language="zh"), echo=lambda _: None)
    english = build(plan(path, tmp_path / "e", tiny_base, language="en"), until="bm25", echo=lambda _: None)
    assert english.stages["bm25"]["language"] == "en"
    result = CliRunner().invoke(
        app, ["build", "--collection", str(path), "--out", str(tmp_path / "c"), "--language", "zh"]
    )
    assert (
        result.exit_code != 0
        and "--language is auto or one of" in result.output
        and "Traceback" not in result.output
    )


def test_a_tsv_header_is_recorded_and_never_a_document(passages, tmp_path, tiny_base):
    """A TSV exported with its columns named (`docid<TAB>text`, as pandas writes it): the collection stage counts
    the 80 passages and the header apart, so no document called "docid" reaches BM25, the store or the queries."""
    rows = [json.loads(line) for line in passages.read_text().splitlines()]
    tsv = tmp_path / "passages.tsv"
    tsv.write_text("docid\ttext\n" + "".join(f"{r['id']}\t{r['contents']}\n" for r in rows))
    record = build(plan(tsv, tmp_path / "o", tiny_base), until="collection", echo=lambda _: None)
    stage = record.stages["collection"]
    assert (stage["format"], stage["documents"], stage["headers"], stage["skipped"]) == ("tsv", 80, 1, 0)


def test_a_build_whose_collection_changed_is_refused_not_mixed(passages, tmp_path, tiny_base):
    """A build stopped and run again after its collection was edited would serve a mix (the BM25 index of the old
    documents, a store of the new): it is refused, naming the file and how it changed, before any stage runs, and so
    is a --reuse of it by a build of the new collection. The same content touched goes on without a word."""
    coll = tmp_path / "passages.jsonl"
    coll.write_bytes(passages.read_bytes())
    out = tmp_path / "b"
    build(plan(coll, out, tiny_base), until="bm25", echo=lambda _: None)
    recorded = read_record(out).stages["collection"]["fingerprint"]
    assert list(recorded) == ["passages.jsonl"] and recorded["passages.jsonl"]["bytes"] == coll.stat().st_size
    # touched, the same bytes: goes on, and records the new time (the next run need not read the file again)
    later = recorded["passages.jsonl"]["mtime_ns"] + 10**9
    os.utime(coll, ns=(later, later))
    build(plan(coll, out, tiny_base), until="bm25", echo=lambda _: None)
    assert read_record(out).stages["collection"]["fingerprint"]["passages.jsonl"]["mtime_ns"] == later
    # one document more: refused before any stage, the build left as it was
    size = coll.stat().st_size
    with coll.open("a") as fh:
        fh.write(json.dumps({"id": "new", "contents": "a passage added after the build began."}) + "\n")
    said: list[str] = []
    with pytest.raises(AheadrankError, match=rf"has changed since .*passages.jsonl was {size:,} bytes, now"):
        build(plan(coll, out, tiny_base), echo=said.append)
    assert said == [] and list(read_record(out).stages) == ["collection", "bm25"]
    result = CliRunner().invoke(
        app,
        ["build", "--collection", str(coll), "--out", str(out), "--ranker", "tk-1l", "--base", str(tiny_base)]
        + ["--steps", "2", "--max-queries", "40", "--no-progress"],
    )
    assert result.exit_code == 2 and "has changed since" in result.output and "Traceback" not in result.output
    with pytest.raises(AheadrankError, match="was built from another version"):
        build(plan(coll, tmp_path / "c", tiny_base, reuse=str(out)), until="bm25", echo=lambda _: None)
    # the same size as when built, other bytes: still a change
    original = passages.read_bytes()
    coll.write_bytes(original.replace(b"wing", b"wind", 1))
    assert coll.stat().st_size == len(original)
    with pytest.raises(AheadrankError, match="other content of the same size"):
        build(plan(coll, out, tiny_base), until="bm25", echo=lambda _: None)


def test_a_second_build_of_a_directory_is_refused_while_the_first_runs(passages, tmp_path, tiny_base):
    """Two `aheadrank build` of one --out at once (a command re-run in another terminal, a restarted job): the
    second used to redo the stages the first had not recorded yet, rewriting the BM25 index under it, until the
    store's own lock stopped it at the dense stage. Now it is refused at once, naming the holder."""
    out = tmp_path / "b"
    out.mkdir()
    said: list[str] = []
    with exclusive_lock(out / BUILD_LOCK, "a build elsewhere"):
        with pytest.raises(
            BuildLockedError, match=rf"another build is writing the build {re.escape(str(out))} \(pid"
        ):
            build(plan(passages, out, tiny_base), echo=said.append)
    assert said == [] and read_record(out) is None
    build(plan(passages, out, tiny_base), until="collection", echo=said.append)  # released: it goes on
    assert list(read_record(out).stages) == ["collection"] and not (out / BUILD_LOCK).exists()


def test_an_interrupted_build_says_where_it_stopped_and_resumes(passages, tmp_path, tiny_base, monkeypatch):
    """Ctrl-C in a stage: one line naming the stage and how to go on, the interrupt goes on up (the CLI exits 130),
    the stages before it stay recorded and the directory's lock is released."""
    import aheadrank.build as build_module

    def interrupted(plan):
        raise KeyboardInterrupt

    out = tmp_path / "b"
    said: list[str] = []
    with monkeypatch.context() as patch:
        patch.setattr(build_module, "stage_bm25", interrupted)
        with pytest.raises(KeyboardInterrupt):
            build(plan(passages, out, tiny_base), echo=said.append)
    assert said[-1] == "[bm25] interrupted: what is done is kept (shards too); the same command resumes it"
    assert list(read_record(out).stages) == ["collection"] and not (out / BUILD_LOCK).exists()
    build(plan(passages, out, tiny_base), until="bm25", echo=lambda _: None)
    assert list(read_record(out).stages) == ["collection", "bm25"]


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"plan": {"collection": "c"', "JSONDecodeError"),
        ("[]", "TypeError"),
        ('{"stages": {}}', "KeyError"),
        ('{"plan": [], "stages": {}}', "TypeError"),
        ('{"plan": {}, "stages": {}, "format": 99}', "build format 99, newer"),
    ],
)
def test_an_unreadable_build_record_is_one_line_for_build_and_serve(text, why, passages, tmp_path, tiny_base):
    """A build.json cut short, edited by hand or from a newer aheadrank: `build` and `serve DIR` say so in one
    line (a JSON or type error's traceback before), and the record is left as it is."""
    out = tmp_path / "b"
    out.mkdir()
    (out / BUILD_FILE).write_text(text)
    with pytest.raises(AheadrankError, match=re.escape(why)):
        build(plan(passages, out, tiny_base), echo=lambda _: None)
    result = CliRunner().invoke(app, ["serve", str(out)])
    assert result.exit_code == 2 and BUILD_FILE in result.output and "Traceback" not in result.output
    assert (out / BUILD_FILE).read_text() == text


def test_an_out_that_cannot_be_a_folder_is_one_line(passages, tmp_path, tiny_base):
    """--out a file, or under one: one error line through the CLI, the file untouched (a traceback before)."""
    file = tmp_path / "file"
    file.write_text("precious")
    for out in (file, file / "sub"):
        with pytest.raises(AheadrankError, match=r"cannot make the build folder --out .*file"):
            build(plan(passages, out, tiny_base), echo=lambda _: None)
    result = CliRunner().invoke(
        app, ["build", "--collection", str(passages), "--out", str(file), "--base", str(tiny_base)]
    )
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(errors) == 1 and errors[0].startswith("error: cannot make"), (
        result.output
    )
    assert file.read_text() == "precious"


def test_judgments_added_to_a_label_free_build_are_a_change(passages, tmp_path, tiny_base):
    """With --labels auto a BEIR folder's qrels/train.tsv decides the recipe: one added after the build began is
    refused like an edited corpus. With --labels none the qrels are not read and not watched."""
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    rows = [json.loads(line) for line in passages.read_text().splitlines()]
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": r["id"], "text": r["contents"]}) + "\n" for r in rows)
    )
    build(plan(folder, tmp_path / "auto", tiny_base, labels="auto"), until="collection", echo=lambda _: None)
    build(plan(folder, tmp_path / "none", tiny_base, labels="none"), until="collection", echo=lambda _: None)
    assert read_record(tmp_path / "auto").stages["collection"]["fingerprint"]["qrels/train.tsv"] is None
    (folder / "queries.jsonl").write_text('{"_id": "q1", "text": "wing lift"}\n')
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tp0\t1\n")
    with pytest.raises(AheadrankError, match=r"qrels/train.tsv is new; queries.jsonl is new"):
        build(
            plan(folder, tmp_path / "auto", tiny_base, labels="auto"), until="collection", echo=lambda _: None
        )
    build(plan(folder, tmp_path / "none", tiny_base, labels="none"), until="collection", echo=lambda _: None)


def judged_beir(
    passages: Path, folder: Path, queries: dict[str, str], train: str, documents: int = 80
) -> Path:
    """A BEIR folder of the first ``documents`` passages, ``queries`` and ``train`` as its qrels/train.tsv rows."""
    (folder / "qrels").mkdir(parents=True)
    rows = [json.loads(line) for line in passages.read_text().splitlines()][:documents]
    (folder / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": r["id"], "text": r["contents"]}) + "\n" for r in rows)
    )
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": t}) + "\n" for q, t in queries.items())
    )
    (folder / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + train)
    return folder


def test_a_judged_build_reuses_a_label_free_builds_index_and_dense_field_and_makes_its_own_queries(
    passages, tmp_path, tiny_base
):
    """A user who built label-free and then judged some queries builds again with --labels train --reuse: the
    BM25 index and the dense field are the same and are linked; the collection stage (whose fingerprint now holds
    the qrels) and the queries stage are its own, each saying why. The other way round a label-free build links
    the judged build's dense field and embeds the sentence windows the judged build did not store."""
    queries = {"q1": "wing lift", "q2": "heat"}
    folder = judged_beir(passages, tmp_path / "beir", queries, "q1\tp0\t1\nq2\tp3\t1\n")
    free, judged, again = tmp_path / "free", tmp_path / "judged", tmp_path / "again"
    build(plan(folder, free, tiny_base, labels="none", windows=True), until="dense", echo=lambda _: None)
    said: list[str] = []
    build(plan(folder, judged, tiny_base, labels="train", reuse=str(free)), until="dense", echo=said.append)
    stages = read_record(judged).stages
    assert [s for s in stages if "reused" in stages[s]] == ["bm25", "dense"]
    assert (
        stages["queries"] == {**stages["queries"], "judged_split": "train"}
        and "windows" not in stages["dense"]
    )
    assert stages["collection"]["fingerprint"]["qrels/train.tsv"] is not None
    assert any("[collection] not reused" in line and "labels='none', not 'train'" in line for line in said)
    assert any("[queries] not reused" in line for line in said)
    mine, theirs = paths(judged), paths(free)
    assert mine["lucene"].is_symlink() and mine["lucene"].resolve() == theirs["lucene"].resolve()
    assert mine["dense"].is_symlink() and not mine["windows"].exists() and not mine["queries"].exists()
    # a label-free build reusing the judged one: its field linked, its windows embedded here, its own queries
    said.clear()
    build(
        plan(folder, again, tiny_base, labels="none", windows=True, reuse=str(judged)),
        until="dense",
        echo=said.append,
    )
    stages = read_record(again).stages
    assert [s for s in stages if "reused" in stages[s]] == ["bm25"]
    assert paths(again)["dense"].is_symlink() and paths(again)["windows"].is_dir()
    assert not paths(again)["windows"].is_symlink() and stages["dense"]["windows"]["windows"] > 0
    assert any("the sentence windows are embedded here" in line for line in said)
    assert read_queries(again)["queries"] and stages["queries"]["pseudo_queries"] > 0
    # another collection: refused
    with pytest.raises(AheadrankError, match="was built with collection="):
        build(plan(passages, tmp_path / "c", tiny_base, reuse=str(free)), echo=lambda _: None)


def test_auto_labels_build_label_free_where_too_few_queries_are_judged(
    passages, tmp_path, tiny_base, monkeypatch
):
    """A ranker trained on a few judged queries served far below the label-free build (bench/results/
    few-judged-training/): --labels auto trains on judgments only where qrels/train.tsv judges MIN_JUDGED_QUERIES
    queries with a relevant document, and says why it does not; --labels train trains on any number. A build begun
    under the other meaning of auto is refused on resume, not finished with the other recipe."""
    from aheadrank.build import MIN_JUDGED_QUERIES, auto_labels_note, judged_split

    monkeypatch.delenv("AHEADRANK_MIN_JUDGED_QUERIES")
    queries = {f"q{i}": f"wing lift {i}" for i in range(3)}
    train = "q0\tp0\t1\nq1\tp3\t2\nq2\tp5\t0\n"  # q2: no relevant document
    folder = judged_beir(passages, tmp_path / "beir", queries, train)
    assert MIN_JUDGED_QUERIES > 2 and judged_split(folder, "auto") is None
    assert judged_split(folder, "train") == "train" and auto_labels_note(folder, "train") is None
    note = auto_labels_note(folder, "auto")
    assert f"judges 2 queries, fewer than the {MIN_JUDGED_QUERIES}" in note and "--labels train" in note
    monkeypatch.setenv("AHEADRANK_MIN_JUDGED_QUERIES", "2")
    assert judged_split(folder, "auto") == "train" and auto_labels_note(folder, "auto") is None
    for bad in ("0", "many"):
        monkeypatch.setenv("AHEADRANK_MIN_JUDGED_QUERIES", bad)
        with pytest.raises(AheadrankError, match="AHEADRANK_MIN_JUDGED_QUERIES"):
            judged_split(folder, "auto")
    monkeypatch.delenv("AHEADRANK_MIN_JUDGED_QUERIES")
    out, said = tmp_path / "auto", []
    build(plan(folder, out, tiny_base, labels="auto"), until="queries", echo=said.append)
    assert any(line.startswith("[labels] qrels/train.tsv judges 2 queries") for line in said)
    assert read_record(out).stages["queries"]["pseudo_queries"] > 0
    # the same command where auto now means the judged recipe: refused, naming how to go on
    monkeypatch.setenv("AHEADRANK_MIN_JUDGED_QUERIES", "1")
    with pytest.raises(
        AheadrankError,
        match="was built label-free; --labels auto now builds on qrels/train: resume it with "
        "AHEADRANK_MIN_JUDGED_QUERIES=3",
    ):
        build(plan(folder, out, tiny_base, labels="auto"), echo=lambda _: None)
    monkeypatch.setenv("AHEADRANK_MIN_JUDGED_QUERIES", "3")  # as it says: the build goes on label-free
    build(plan(folder, out, tiny_base, labels="auto"), until="queries", echo=lambda _: None)
    judged = tmp_path / "judged"
    build(plan(folder, judged, tiny_base, labels="train"), until="queries", echo=lambda _: None)
    assert read_record(judged).stages["queries"]["judged_split"] == "train"
    # a collection with too little text for pseudo-queries: the error says its judgments can train it
    monkeypatch.delenv("AHEADRANK_MIN_JUDGED_QUERIES")
    small = judged_beir(passages, tmp_path / "small", queries, train, documents=8)
    with pytest.raises(AheadrankError, match="its 2 judged queries can: --labels train"):
        build(
            plan(small, tmp_path / "small-build", tiny_base, labels="auto"),
            until="queries",
            echo=lambda _: None,
        )


def test_a_collection_that_cannot_be_used_is_one_error_line(tmp_path):
    """One error line, and no empty --out left behind by the build that made it; an --out that was there stays."""
    unusable = tmp_path / "unusable.jsonl"
    unusable.write_text('{"id": "a", "contents": ""}\n{not json\n')
    result = CliRunner().invoke(app, ["build", "--collection", str(unusable), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "no usable document" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()
    (tmp_path / "mine").mkdir()
    for text in (
        "",
        "\n  \n",
    ):  # empty, or blank lines only: said so, not "no JSON object in the first 100 lines"
        empty = tmp_path / "empty.jsonl"
        empty.write_text(text)
        result = CliRunner().invoke(
            app, ["build", "--collection", str(empty), "--out", str(tmp_path / "mine")]
        )
        assert result.exit_code == 2 and "holds no documents (it is empty or blank)" in result.output
        assert (tmp_path / "mine").is_dir()


def test_build_bounds_the_jvm_heap_it_is_given_and_refuses_a_malformed_one(passages, tmp_path, monkeypatch):
    """--java-heap (or AHEADRANK_JAVA_HEAP) reaches the JVM's -Xmx before the build starts it; a size that is
    not one is one error line, before any work."""
    from aheadrank.indexer import bm25

    import aheadrank.build

    heaps, plans = [], []
    monkeypatch.setattr(bm25, "set_java_heap", lambda size: heaps.append(size))
    finished = BuildRecord({}, dict.fromkeys(STAGES, {}))
    monkeypatch.setattr(aheadrank.build, "build", lambda plan, **kw: plans.append(plan) or finished)
    args = ["build", "--collection", str(passages), "--out", str(tmp_path / "o")]
    assert CliRunner().invoke(app, [*args, "--java-heap", "1g"]).exit_code == 0
    assert CliRunner().invoke(app, args, env={"AHEADRANK_JAVA_HEAP": "700m"}).exit_code == 0
    assert CliRunner().invoke(app, args, env={"AHEADRANK_JAVA_HEAP": None}).exit_code == 0
    assert heaps == ["1g", "700m", None] and len(plans) == 3
    monkeypatch.undo()  # the real check of the size
    result = CliRunner().invoke(app, [*args, "--java-heap", "lots"])
    assert result.exit_code == 2 and "512m or 2g" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


@pytest.fixture(scope="module")
def built(passages, tiny_base, tmp_path_factory):
    """A finished tiny label-free build (default priors)."""
    out = tmp_path_factory.mktemp("built") / "b"
    record = build(plan(passages, out, tiny_base), echo=lambda _: None)
    return out, record


def test_a_label_free_build_serves_scores_calibrated_on_its_held_out_pseudo_queries(built):
    """No judgments: the served score's calibration is fitted on the pseudo-queries the trainer held out, saved
    in priors.json (verified on load with the checkpoint), and /rerank's relevance_score is then each text's own
    probability, the same alone as among others; /v1/info says it is calibrated, from pseudo-queries."""
    import httpx
    from services_testkit import Server

    from aheadrank.build import NEAR_SOURCE, near_source_labels, pseudo_validation
    from aheadrank.rerank import collect_features

    out, record = built
    p = paths(out)
    load_ranker(p["checkpoint"])  # the fingerprint covers priors.json, calibration included
    priors = read_priors(p["checkpoint"])
    cal = priors.calibrated()
    assert cal is not None, "a label-free build served relative scores"
    # fitted on MaxP passage scores, and served so unless told otherwise (aheadrank.passages.served_aggregation)
    assert priors.fitted_on["passage_aggregation"] == "maxp" == LABEL_FREE_AGGREGATION
    held_out, cands, qrels = pseudo_validation(out)
    assert cal.fitted_on["labels"] == "pseudo-queries" and cal.fitted_on["queries"] == len(held_out) > 0
    assert cal.fitted_on["near_source"] == NEAR_SOURCE
    assert len(held_out) <= cal.fitted_on["relevant"] < cal.fitted_on["candidates"]
    # the relevant ones: each source, and the candidates whose dense embedding is near the source's
    feats, _ = collect_features(p["checkpoint"], p["store"], held_out, cands, qrels)

    def relevant(queries):
        return [sum(q.qrels.get(d, 0) > 0 for d in q.docids) for q in queries]

    assert all(len(q.qrels) == 1 for q in feats) and set(relevant(feats)) == {1}  # the sources
    for near, expect in (
        (None, relevant(feats)),
        (1.01, relevant(feats)),
        (-1.0, [len(q.docids) for q in feats]),
    ):
        labelled, used = near_source_labels(p["store"], feats, near)
        assert used == near and relevant(labelled) == expect
    assert sum(relevant(near_source_labels(p["store"], feats)[0])) == cal.fitted_on["relevant"]
    # the calibrated combination keeps the build's default weights; only statistics and Platt are fitted
    assert {k: cal.weights[k] for k in cal.platt} == {
        k: label_free_weights("tk", window=True)[k] for k in cal.platt
    }
    assert "neural+bm25+dense+window" in cal.platt and all("dense" in k for k in cal.platt if "window" in k)
    assert record.stages["priors"]["calibration"]["labels"] == "pseudo-queries"
    texts = [json.loads(line)["contents"] for line in open(record.plan["collection"])][:12]
    query = "supersonic flow over a cone"
    srv = Server(str(out), "--no-warmup").wait_ready()
    try:
        client = httpx.Client(base_url=srv.url, timeout=120)
        info = client.get("/v1/info").json()
        assert info["relevance_score"] == "calibrated" and info["model"]["passage_aggregation"] == "maxp"
        assert info["priors"]["calibration"]["fitted_on"]["labels"] == "pseudo-queries"
        many = client.post("/v1/rerank", json={"query": query, "documents": texts}).json()
        assert many["meta"]["relevance_score"] == "calibrated"
        together = {r["index"]: r["relevance_score"] for r in many["results"]}
        assert len(set(together.values())) > 1
        for i in (0, 5, 11):
            one = client.post("/v1/rerank", json={"query": query, "documents": [texts[i]]}).json()
            assert one["results"][0]["relevance_score"] == pytest.approx(together[i], abs=1e-6)
    finally:
        srv.stop()


def test_a_build_without_usable_held_out_pseudo_queries_serves_relative_scores_with_a_warning(
    built, tmp_path, monkeypatch, caplog
):
    """Where no held-out pseudo-query can be fitted on (here: none has its source among its candidates), the
    priors stage says so in a WARNING and in priors.json, and the service warns that its scores are relative."""
    import shutil

    import aheadrank.build as build_module
    from aheadrank.rerank import PriorScorer

    out = tmp_path / "b"
    shutil.copytree(built[0], out)
    record = json.loads((out / BUILD_FILE).read_text())
    del record["stages"]["priors"]
    (out / BUILD_FILE).write_text(json.dumps(record))
    real = build_module.pseudo_validation

    def sources_not_found(path):
        val, cands, qrels = real(path)
        return val, cands, {q: {"not-a-candidate": 1} for q in qrels}

    monkeypatch.setattr(build_module, "pseudo_validation", sources_not_found)
    with caplog.at_level("WARNING", logger="aheadrank.build"):
        again = build(BuildPlan(**{**record["plan"], "out": str(out)}), echo=lambda _: None)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("no calibration" in m and "relative" in m for m in warned), warned
    assert again.stages["priors"]["calibration"] == "none (relative scores)"
    p = paths(out)
    ranker = load_ranker(p["checkpoint"])
    priors = read_priors(p["checkpoint"])
    assert priors.calibrated() is None and priors.fitted_on["calibration"].startswith("none: ")
    assert priors.weights == label_free_weights("tk", window=True)
    scorer = PriorScorer(ranker, p["store"])
    assert any("no calibration (none: " in n and "relative" in n for n in scorer.notices), scorer.notices


def test_a_build_starts_from_a_trained_checkpoint_and_refuses_another_variant(
    built, passages, tiny_base, tmp_path
):
    """``--init``: a ranker trained elsewhere (another collection's judgments) is this build's start; with
    ``steps=0`` its weights are served unchanged, only the store and the priors are this collection's."""
    import torch

    source = paths(built[0])["checkpoint"]
    out = tmp_path / "from"
    record = build(plan(passages, out, tiny_base, steps=0, init=str(source)), echo=lambda _: None)
    measured = ("seconds", "peak_rss_mb", "peak_anon_mb")  # what the stage took, beside what it did
    assert {k: v for k, v in record.stages["train"].items() if k not in measured} == {
        "variant": "tk-1l",
        "steps": 0,
        "init": str(source),
    }
    assert "seconds" in record.stages["train"]
    a, b = load_ranker(source), load_ranker(paths(out)["checkpoint"])
    assert b.config.extra["init"]["fingerprint"] == a.fingerprint
    # the queries held out for the priors are this build's own pseudo-queries, none trained on
    held_out = b.config.extra["train"]["val_qids"]
    assert held_out and set(held_out) <= set(read_queries(out)["queries"])
    assert b.config.extra["init"]["train"]["steps"] == a.config.extra["train"]["steps"]
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    with StoreReader(paths(out)["store"]) as reader:
        reader.check_fingerprint(b.fingerprint)
    # adapted further: training moves the weights away from the start
    moved = tmp_path / "moved"
    build(plan(passages, moved, tiny_base, steps=2, init=str(source)), echo=lambda _: None)
    c = load_ranker(paths(moved)["checkpoint"])
    assert c.config.extra["init"]["checkpoint"] == str(source)
    # a checkpoint of another variant is refused with one line, before anything is trained
    with pytest.raises(AheadrankError, match="is a tk ranker.*not tk-2l"):
        build(
            plan(passages, tmp_path / "wrong", tiny_base, ranker="tk-2l", init=str(source)),
            echo=lambda _: None,
        )


def test_a_label_free_build_trains_on_the_teachers_best_other_document_by_default(
    built, passages, tiny_base, tmp_path
):
    """The default positive is ``teacher``: the pseudo-queries are trained on the fusion's best document other than
    their source (recorded in the checkpoint). ``--positive source`` trains on the source; another positive on a
    finished build is refused, an unknown one named; a build recorded before the setting existed was built with
    source positives and reads so."""
    import shutil

    assert BuildPlan("c", "o").positive == "teacher"
    assert load_ranker(paths(built[0])["checkpoint"]).config.extra["label_free"]["positive"] == "teacher"
    other = tmp_path / "source"
    build(plan(passages, other, tiny_base, positive="source"), echo=lambda _: None)
    assert load_ranker(paths(other)["checkpoint"]).config.extra["label_free"]["positive"] == "source"
    with pytest.raises(AheadrankError, match="positive: built with 'source'"):
        build(plan(passages, other, tiny_base), echo=lambda _: None)
    older = tmp_path / "older"
    shutil.copytree(other, older)
    record = json.loads((older / BUILD_FILE).read_text())
    del record["plan"]["positive"]
    (older / BUILD_FILE).write_text(json.dumps(record))
    said: list[str] = []
    build(plan(passages, older, tiny_base, positive="source"), echo=said.append)
    assert sum("done before" in line for line in said) == len(STAGES)
    with pytest.raises(AheadrankError, match="positive: built with 'source'"):
        build(plan(passages, older, tiny_base), echo=lambda _: None)
    with pytest.raises(AheadrankError, match="--positive is source or teacher"):
        build(plan(passages, other, tiny_base, positive="best"), echo=lambda _: None)


def test_a_label_free_build_stores_long_documents_as_passages_by_default(built, tmp_path):
    """Passages are on by default where the build is label-free (measured there) and off where it trains on
    judgments (its priors were measured without them); asked for either way, they are as asked."""
    from aheadrank.build import stores_passages

    store = built[1].stages["store"]
    assert store["passages"] is True and 0 < store["passages_bytes"] < store["store_bytes"]
    assert (paths(built[0])["store"] / "passages" / "manifest.json").is_file()
    # the other setting on the finished build is refused, not silently kept
    with pytest.raises(AheadrankError, match="--passages to resume"):
        build(BuildPlan(**{**read_record(built[0]).plan, "passages": False}), echo=lambda _: None)
    judged = tmp_path / "judged"
    (judged / "qrels").mkdir(parents=True)
    (judged / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq\td\t1\n")
    assert stores_passages(BuildPlan(str(judged), "o")) is False
    assert stores_passages(BuildPlan(str(judged), "o", labels="none")) is True
    assert stores_passages(BuildPlan(str(judged), "o", passages=True)) is True
    assert stores_passages(BuildPlan(str(tmp_path), "o", passages=False)) is False


def test_a_build_trains_at_the_learning_rate_it_is_given_and_pins_it(passages, tiny_base, tmp_path):
    out = tmp_path / "lr"
    build(plan(passages, out, tiny_base, lr=1e-5), echo=lambda _: None)
    assert load_ranker(paths(out)["checkpoint"]).config.extra["train"]["lr"] == 1e-5
    with pytest.raises(AheadrankError, match="lr: built with 1e-05"):
        build(plan(passages, out, tiny_base, lr=2e-5), echo=lambda _: None)
    out = tmp_path / "fresh-lr"
    build(plan(passages, out, tiny_base, fresh_lr=1e-3), echo=lambda _: None)
    assert load_ranker(paths(out)["checkpoint"]).config.extra["train"]["fresh_lr"] == 1e-3
    with pytest.raises(AheadrankError, match="fresh_lr: built with 0.001, now not given"):
        build(plan(passages, out, tiny_base), echo=lambda _: None)


def test_a_build_trained_as_another_variant_of_its_kind_is_refused(
    passages, tiny_base, tmp_path, monkeypatch
):
    """A kind means the variant of its day (``tk`` with judgments was ``tk-2l`` until JUDGED_VARIANTS): a build
    whose train stage made another variant is refused with what it trained, never stored or served as the new one."""
    import aheadrank.build as build_module

    out = tmp_path / "kind"
    build(plan(passages, out, tiny_base, ranker="tk"), until="train", echo=lambda _: None)
    trained = read_record(out).stages["train"]["variant"]
    assert trained.endswith("l-base")
    # the same plan again: it resumes
    build(plan(passages, out, tiny_base, ranker="tk"), until="train", echo=lambda _: None)
    monkeypatch.setitem(build_module.LABEL_FREE_VARIANTS, "tk", "tk-1l")
    with pytest.raises(AheadrankError, match=f"trained {trained}; --ranker tk now builds tk-1l"):
        build(plan(passages, out, tiny_base, ranker="tk"), echo=lambda _: None)
    assert "store" not in read_record(out).stages


def test_a_finished_train_stage_removes_its_resumable_state(passages, tiny_base, tmp_path):
    """The train stage's resumable state (the model and its optimizer's moments) is never read once build.json marks
    the stage done: the build removes it and says so; a rerun removes one an older build left behind, and keeps the
    checkpoint it trained."""
    from aheadrank.rankers.training import state_file

    out = tmp_path / "state"
    lines: list[str] = []
    build(plan(passages, out, tiny_base, steps=2), until="train", echo=lines.append)
    checkpoint = paths(out)["checkpoint"]
    state = state_file(checkpoint)
    assert read_record(out).stages["train"]["steps"] == 2
    assert not state.exists() and load_ranker(checkpoint).config.extra["train"]["steps"] == 2
    removed = [line for line in lines if line.startswith("[train] removed its resumable state")]
    assert len(removed) == 1 and state.name in removed[0]
    state.write_bytes(b"left by an older build")
    lines.clear()
    build(plan(passages, out, tiny_base, steps=2), until="train", echo=lines.append)
    assert not state.exists() and any("removed its resumable state" in line for line in lines)
    assert (
        "[train] done before" in "\n".join(lines)
        and load_ranker(checkpoint).config.extra["train"]["steps"] == 2
    )
    lines.clear()
    build(plan(passages, out, tiny_base, steps=2), until="train", echo=lines.append)
    assert not any("removed" in line for line in lines)  # nothing left: nothing said


def test_a_build_fits_the_score_head_when_asked_and_pins_it(passages, tiny_base, tmp_path):
    """--fit-head reaches the trainer (the fit is recorded in the checkpoint) and a finished train stage refuses the
    other setting; without it nothing is fitted."""
    out = tmp_path / "head"
    kw = {"ranker": "mores-1ib-s2", "steps": 0, "max_queries": 40}
    build(plan(passages, out, tiny_base, fit_head=True, **kw), echo=lambda _: None)
    fit = load_ranker(paths(out)["checkpoint"]).config.extra["head_fit"]
    assert fit["queries"] > 0 and "alpha" in fit
    with pytest.raises(AheadrankError, match="fit_head"):
        build(plan(passages, out, tiny_base, **kw), echo=lambda _: None)
    plain = tmp_path / "plain"
    build(plan(passages, plain, tiny_base, **kw), until="train", echo=lambda _: None)
    assert "head_fit" not in load_ranker(paths(plain)["checkpoint"]).config.extra


def test_a_label_free_build_fits_to_the_teacher_it_is_given_and_pins_it(built, passages, tiny_base, tmp_path):
    """--teacher fusion-passages reaches the train stage (the teacher is named in the checkpoint, the default's
    is the fusion); a finished train stage refuses the other teacher and an unknown one is named."""
    from aheadrank.build import TEACHER_NAMES

    assert BuildPlan("c", "o").teacher == "fusion"
    extra = load_ranker(paths(built[0])["checkpoint"]).config.extra["label_free"]
    assert extra["teacher"] == TEACHER_NAMES["fusion"]
    out = tmp_path / "windows"
    build(plan(passages, out, tiny_base, teacher="fusion-passages"), echo=lambda _: None)
    extra = load_ranker(paths(out)["checkpoint"]).config.extra["label_free"]
    assert extra["teacher"] == TEACHER_NAMES["fusion-passages"]
    with pytest.raises(AheadrankError, match="teacher: built with 'fusion-passages'"):
        build(plan(passages, out, tiny_base), echo=lambda _: None)
    with pytest.raises(AheadrankError, match="--teacher is fusion or fusion-passages"):
        build(plan(passages, tmp_path / "x", tiny_base, teacher="cross-encoder"), echo=lambda _: None)


def test_a_label_free_build_reads_the_label_free_window_under_every_recipe(passages, tiny_base, tmp_path):
    """The GPU recipe's 256-piece window served below 128 label-free (bench/results/label-free/gpu-recipe/), so a
    build without judgments reads ``LABEL_FREE_DOC_LEN`` pieces under it too; the recipe's other settings stay."""
    from aheadrank.rankers.recipe import LABEL_FREE_DOC_LEN, RECIPES

    out = tmp_path / "gpu"
    build(plan(passages, out, tiny_base, recipe="gpu", steps=1), until="train", echo=lambda _: None)
    ranker = load_ranker(paths(out)["checkpoint"])
    assert ranker.config.max_doc_len == LABEL_FREE_DOC_LEN < RECIPES["gpu"].max_doc_len
    assert ranker.config.extra["train"]["group_size"] == RECIPES["gpu"].group_size


def test_a_build_stores_at_the_dtype_it_is_given_and_pins_it(passages, tiny_base, tmp_path):
    from aheadrank.store import read_manifest

    with pytest.raises(AheadrankError, match="--dtype is float16, int8"):
        build(plan(passages, tmp_path / "bad", tiny_base, dtype="int4"), echo=lambda _: None)
    assert not (tmp_path / "bad").exists()  # refused before any work
    out = tmp_path / "int8"
    record = build(plan(passages, out, tiny_base, steps=0, dtype="int8"), echo=lambda _: None)
    store = paths(out)["store"]
    assert record.stages["store"]["dtype"] == "int8"
    assert read_manifest(store).spec.dtype == "int8"
    assert read_manifest(store / "dense").spec.dtype == "float16"  # the bi-encoder's field as it always is
    with StoreReader(store) as reader:
        assert len(reader) == 80
    # a finished build at another dtype is refused, not overwritten
    with pytest.raises(AheadrankError, match="dtype: built with 'int8'"):
        build(plan(passages, out, tiny_base, steps=0), echo=lambda _: None)


def test_a_store_that_cannot_fit_is_refused_before_it_writes_and_the_build_resumes(
    passages, tiny_base, tmp_path, monkeypatch
):
    """The store stage says what it will write and what is free; where the disk has too little room it stops with
    one line naming the smaller dtypes, before writing, and the stages done are kept for the same command."""
    import aheadrank.indexer.build as indexing

    import aheadrank.build as build_module

    out = tmp_path / "b"
    said: list[str] = []
    with monkeypatch.context() as patch:
        patch.setattr(indexing, "free_bytes", lambda path: 1000)
        with pytest.raises(
            AheadrankError, match=r"kB free at .*not enough room.*--dtype int8 about .*book4 about"
        ):
            build(plan(passages, out, tiny_base, steps=0), echo=said.append)
    assert said[-1] == "[store] ..." and list(read_record(out).stages) == list(
        STAGES[: STAGES.index("store")]
    )
    assert not paths(out)["store"].exists()
    said.clear()
    record = build(plan(passages, out, tiny_base, steps=0), echo=said.append)
    room = said[said.index("[store] ...") + 1]
    assert re.match(r"\[store\] about \S+ [kM]?B to write \(float16\); \S+ [kMG]?B free at ", room), room
    store = record.stages["store"]
    # a word piece: TK's one field, 32 wide on the tiny base, in float16: from the checkpoint as from the variant
    given = plan(passages, out, tiny_base, steps=0)
    assert build_module.piece_bytes(given, paths(out)["checkpoint"]) == build_module.piece_bytes(given) == 64
    # the estimate is from the mean length and leaves out the bi-encoder's windows: the same order as the bytes written
    assert 0.25 < store["store_bytes_estimate"] / store["store_bytes"] < 4, store


def test_a_label_free_builds_priors_refit_on_judged_queries_says_to_use_all_of_them(
    built, passages, tmp_path
):
    """`fit-priors` on a label-free build's checkpoint: its held-out queries are pseudo-queries, none judged, so
    the line says to give --all-queries (a ValueError traceback before)."""
    out, _ = built
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    rows = [json.loads(line) for line in passages.read_text().splitlines()]
    (beir / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": r["id"], "text": r["contents"]}) + "\n" for r in rows)
    )
    (beir / "queries.jsonl").write_text('{"_id": "q1", "text": "wing lift"}\n')
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\tp0\t1\n")
    args = ["fit-priors", "--checkpoint", str(out / "checkpoint"), "--store", str(out / "store"),
            "--collection", str(beir), "--index", str(out / "lucene"), "--no-progress"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert (
        result.exit_code == 2 and "give --all-queries" in result.output and "Traceback" not in result.output
    )


def test_judged_queries_refit_a_label_free_builds_weights_only_where_they_serve_better_out_of_sample(
    built, passages, tmp_path
):
    """`fit-priors --all-queries` on a label-free build keeps its default weights unless cross-validation on the
    judged queries shows the fitted ones better (one judged query cannot), records the defaults so that a later
    refit guards against them too, and fits the calibration either way; --replace-weights takes the plain fit."""
    import shutil

    from aheadrank.priors import LABEL_FREE_DEFAULTS, read_priors

    out = tmp_path / "b"
    shutil.copytree(built[0], out)
    defaults = read_priors(out / "checkpoint")
    assert defaults.fitted_on["label_free"] == LABEL_FREE_DEFAULTS and defaults.defaults() == defaults.weights
    beir = tmp_path / "beir"
    (beir / "qrels").mkdir(parents=True)
    first = json.loads(passages.read_text().splitlines()[0])
    (beir / "queries.jsonl").write_text(
        json.dumps({"_id": "q1", "text": first["contents"].split(".")[0]}) + "\n"
    )
    (beir / "qrels" / "mine.tsv").write_text(f"query-id\tcorpus-id\tscore\nq1\t{first['id']}\t1\n")
    args = ["fit-priors", "--checkpoint", str(out / "checkpoint"), "--store", str(out / "store"),
            "--collection", str(beir), "--index", str(out / "lucene"), "--no-progress", "--split", "mine",
            "--all-queries"]  # fmt: skip
    for _ in range(2):  # the second refit reads the defaults from the first one's record
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        got = read_priors(out / "checkpoint")
        assert got.weights == defaults.weights and got.defaults() == defaults.weights
        guard = got.fitted_on["guard"][max(got.weights, key=len)]
        assert not guard["fitted"] and guard["why"] == "fewer than 2 queries"
        assert got.fitted_on["split"] == "mine" and got.calibration is not None
    result = CliRunner().invoke(app, [*args, "--replace-weights"])
    assert result.exit_code == 0, result.output
    replaced = read_priors(out / "checkpoint")
    assert "guard" not in replaced.fitted_on and replaced.defaults() is None  # later refits are plain fits


def test_a_build_refuses_an_out_of_other_files_and_the_test_split(passages, tmp_path, tiny_base):
    """--out a folder holding a checkpoint/ of its own and no build.json is refused before anything is written (the
    train stage replaced it before); --labels test is refused."""
    mine = tmp_path / "mine"
    (mine / "checkpoint").mkdir(parents=True)
    (mine / "checkpoint" / "config.json").write_text("{}")
    with pytest.raises(AheadrankError, match=r"holds a checkpoint/ but no build.json: not a build's"):
        build(plan(passages, mine, tiny_base), echo=lambda _: None)
    assert sorted(p.name for p in mine.iterdir()) == ["checkpoint"]
    with pytest.raises(AheadrankError, match="refusing to train on the test split"):
        build(plan(passages, tmp_path / "t", tiny_base, labels="test"), echo=lambda _: None)
    # what the queries or train stage found minutes in, refused before any stage
    built_elsewhere = tmp_path / "b"
    (built_elsewhere / "checkpoint").mkdir(parents=True)
    (built_elsewhere / "build.json").write_text("{}")
    for kw, said in (
        ({"ranker": "mores-9ib-s2"}, "ibs"),
        ({"recipe": "bogus"}, "unknown recipe 'bogus'"),
        ({"init": str(tmp_path / "nowhere")}, "does not exist"),
        ({"init": str(built_elsewhere)}, "is a build folder: give its checkpoint"),
        ({"base": str(tmp_path / "nowhere")}, "nowhere"),
    ):
        with pytest.raises(AheadrankError, match=said):
            build(plan(passages, tmp_path / "e", tiny_base, **kw), echo=lambda _: None)
        assert not (tmp_path / "e").exists()


def test_a_stage_whose_output_was_deleted_is_done_again(passages, tmp_path, tiny_base):
    """A build whose store/ (or checkpoint/) was deleted by hand said "done before" for every stage and `serve`
    failed; the stage is now done again, with the stages after it, saying so."""
    import shutil

    out = tmp_path / "b"
    build(plan(passages, out, tiny_base), echo=lambda _: None)
    fingerprint = read_record(out).stages["collection"]["fingerprint"]
    shutil.rmtree(out / "store")
    said: list[str] = []
    record = build(plan(passages, out, tiny_base), echo=said.append)
    assert any("[store] recorded done, but" in x and "store/manifest.json is gone: doing store, priors again" in x
               for x in said), said  # fmt: skip
    assert "[train] done before" in " ".join(said) and (out / "store" / "manifest.json").is_file()
    assert set(record.stages) == set(STAGES) and record.stages["collection"]["fingerprint"] == fingerprint
    shutil.rmtree(out / "checkpoint")
    said.clear()
    build(plan(passages, out, tiny_base), echo=said.append)
    assert any("doing train, store, priors again" in x for x in said), said
    assert any(x.startswith("[store] removed") for x in said), (
        said
    )  # the old store was bound to the lost weights
    assert load_ranker(out / "checkpoint").kind == "tk" and (out / "store" / "manifest.json").is_file()
    said.clear()
    build(plan(passages, out, tiny_base), echo=said.append)  # whole again: nothing redone
    assert not any("recorded done, but" in x for x in said)


@pytest.fixture(scope="module")
def built_long(tmp_path_factory, tiny_base):
    """A tiny label-free build of 40 passages, every other one longer than the ranker's window."""
    rng = random.Random(11)
    root = tmp_path_factory.mktemp("long")
    lines = []
    for i in range(40):
        sentences = [" ".join(rng.choices(WORDS, k=rng.randint(7, 12))) for _ in range(3 if i % 2 else 24)]
        lines.append(json.dumps({"id": f"p{i}", "contents": ". ".join(sentences) + "."}))
    (root / "long.jsonl").write_text("\n".join(lines) + "\n")
    record = build(plan(root / "long.jsonl", root / "b", tiny_base), echo=lambda _: None)
    return root / "b", record


def test_a_long_text_sent_ad_hoc_scores_as_the_document_the_store_holds(built_long, monkeypatch):
    """A text longer than the ranker's window is scored the docid's way whether the store holds it or not: its
    passages' neural scores aggregated, the whole text's dense cosine, then the calibration (not each passage
    calibrated with its own cosine, then aggregated); the whole text's embedding is cached like its passages';
    a text cut by max_tokens_per_doc is read as the cut text, its dense prior included."""
    from aheadrank.services.backend import RerankBackend
    from aheadrank.services.settings import ServiceSettings

    from aheadrank.passages import aggregate, split_passages

    out, record = built_long
    p = paths(out)
    given = {"checkpoint": p["checkpoint"], "store": p["store"], "device": "cpu", "access_log": False}
    assert ServiceSettings(**given).ad_hoc_windows is False  # off by default (the cost: services/README.md)
    backend = RerankBackend.load(ServiceSettings(**given, ad_hoc_windows=True))
    try:
        text = backend.ranker._text()
        window = backend.max_doc_len()
        texts = [json.loads(line)["contents"] for line in open(record.plan["collection"])]
        lengths = [len(p) for p in text.all_pieces(texts)]
        long = [t for t, n in zip(texts, lengths, strict=True) if n > window + window // 2][:4]
        assert len(long) >= 2, (window, max(lengths))
        query = "supersonic flow over a cone"
        stats = backend.text_cache.stats
        stored, _ = backend.score_texts(query, long)
        assert stats()["texts"]["stored"] == len(long)
        monkeypatch.setattr(backend.reader, "text_shards", 0)
        ad_hoc, _ = backend.score_texts(query, long)
        assert ad_hoc == pytest.approx(stored, abs=5e-3)  # float32 online, float16 stored
        # the docid's way spelled out: the passages' neural scores aggregated, the whole text's cosine and its
        # best sentence window's (cut as the store's windows are), then the calibration
        from aheadrank.indexer.pseudo_queries import stored_windows

        scorer, opts = backend.scorer, backend.passage_options()
        qvec = scorer.query_vector(query)
        assert scorer.windows is not None  # the build stored windows: the priors weigh them
        size = scorer.windows.record["sentences"]

        def docid_way(t: str, windows: bool) -> float:
            parts = split_passages(text.tokenizer, [t], opts)[0]
            neural = backend.ranker.score_pairs(query, parts).detach().numpy().astype(float)
            how = backend.settings.passage_aggregation
            features = {
                "neural": np.array(aggregate(neural, [0] * len(parts), 1, how)),
                "dense": scorer.text_dense(qvec, [t]).astype(float),
            }
            if windows:
                best = scorer.text_dense(qvec, stored_windows("", t, size)).max()
                features["window"] = np.array([best], dtype=float)
            return float(scorer.calibration.logits(features)[0])

        assert ad_hoc == pytest.approx([docid_way(t, True) for t in long], abs=1e-4)
        # --no-ad-hoc-windows: no window for any text sent ad hoc, stored or not (a text's score is its own)
        backend.settings.ad_hoc_windows = False
        without, _ = backend.score_texts(query, long)
        assert without == pytest.approx([docid_way(t, False) for t in long], abs=1e-4)
        monkeypatch.undo()  # the store's text lookup back: the stored texts without their windows too
        stored_without, _ = backend.score_texts(query, long)
        assert stored_without == pytest.approx(without, abs=5e-3) and stats()["texts"]["stored"] == 2 * len(
            long
        )
        backend.settings.ad_hoc_windows = True
        monkeypatch.setattr(backend.reader, "text_shards", 0)
        # the per-passage way would read other cosines: it is not what is served
        per_passage = []
        for t in long:
            parts = split_passages(text.tokenizer, [t], opts)[0]
            features = {"neural": backend.ranker.score_pairs(query, parts).detach().numpy().astype(float)}
            features["dense"] = scorer.text_dense(qvec, parts).astype(float)
            calibrated = scorer.calibration.logits(features).tolist()
            per_passage.append(
                aggregate(calibrated, [0] * len(parts), 1, backend.settings.passage_aggregation)[0]
            )
        assert max(abs(a - b) for a, b in zip(per_passage, ad_hoc, strict=True)) > 5e-2
        # sent again: nothing is embedded again (its passages' fields and its whole text's vector are cached)
        embedded = []
        real = scorer.encoder().encode_documents
        monkeypatch.setattr(
            scorer.encoder(), "encode_documents", lambda x, *a, **k: embedded.append(x) or real(x, *a, **k)
        )
        again, _ = backend.score_texts(query, long)
        assert again == pytest.approx(ad_hoc, abs=1e-9) and embedded == []
        # max_tokens_per_doc: the text cut (at a word) and read as that text, whole-text cosine included
        cut = backend.passage_options(max_tokens=window + window // 4)
        (as_cut,), _ = backend.score_texts(query, [long[0]], passages=cut)
        ((head,),) = split_passages(text.tokenizer, [long[0]], cut.head())
        assert len(head) < len(long[0]) and len(split_passages(text.tokenizer, [head], opts)[0]) == 2
        (of_head,), _ = backend.score_texts(query, [head])
        assert as_cut == pytest.approx(of_head, abs=1e-6)
    finally:
        backend.close()


def test_a_long_texts_dense_priors_are_embedded_in_turns_and_stop_when_the_client_goes(
    built_long, monkeypatch
):
    """The whole-text cosines and the sentence windows (--ad-hoc-windows) of long texts sent ad hoc are embedded a
    chunk at a time with a turn for other requests before each, as the ranker's own chunks are; a request whose
    client went away stops at the next turn (before: all of them in one go on the model thread)."""
    from aheadrank.services.backend import Cancelled, RerankBackend, StageClock, Work
    from aheadrank.services.settings import ServiceSettings
    from aheadrank.services.texts import WINDOWS_PER_DOC_BATCH, TextCache

    out, record = built_long
    p = paths(out)
    given = {"checkpoint": p["checkpoint"], "store": p["store"], "device": "cpu", "access_log": False}
    backend = RerankBackend.load(ServiceSettings(**given, ad_hoc_windows=True, doc_batch_size=2))
    try:
        monkeypatch.setattr(backend.reader, "text_shards", 0)  # every text unknown to the store
        window = backend.max_doc_len()
        lines = [json.loads(line)["contents"] for line in open(record.plan["collection"])]
        pieces = backend.ranker._text().all_pieces(lines)
        long = [t for t, n in zip(lines, pieces, strict=True) if len(n) > window]
        assert len(long) >= 10
        log: list = []
        encoder = backend.scorer.encoder()
        real = encoder.encode_documents
        monkeypatch.setattr(
            encoder, "encode_documents", lambda x, *a, **k: log.append(len(x)) or real(x, *a, **k)
        )

        def drive(work: Work, stop_after: int | None = None) -> list[float]:
            steps = backend.score_texts_steps("supersonic flow over a cone", long, StageClock(), work)
            while True:
                try:
                    next(steps)
                    log.append("turn")
                    if stop_after is not None and sum(isinstance(x, int) for x in log) >= stop_after:
                        work.cancel("client")
                except StopIteration as stop:
                    return stop.value[0]

        work = Work()
        scores = drive(work)
        embeds = [x for x in log if isinstance(x, int)]
        # every whole text (2 a chunk) and every window (8 a chunk) embedded once, a turn before each chunk
        assert len(scores) == len(long) and sum(embeds) > len(long)
        assert max(embeds) <= 2 * WINDOWS_PER_DOC_BATCH and embeds[: len(long) // 2] == [2] * (len(long) // 2)
        assert all(a == "turn" for a, b in zip(log, log[1:], strict=False) if isinstance(b, int))
        assert work.chunks_done == work.chunks_total
        # another request of other long texts: its client goes after the first embedding, the second never runs
        log.clear()
        cache = backend.text_cache
        backend.text_cache = TextCache(
            cache.max_entries, cache.max_bytes
        )  # nothing of the first request kept
        with pytest.raises(Cancelled):
            drive(Work(), stop_after=1)
        assert sum(isinstance(x, int) for x in log) == 1
    finally:
        backend.close()


def _stored(path: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every document's fields in the store at ``path``, as float32."""
    with StoreReader(path) as reader:
        ids = reader.docids()
        batch = reader.fetch(ids)
        return {
            d: {k: v[row, : int(batch.lengths[row])].astype(np.float32) for k, v in batch.fields.items()}
            for row, d in enumerate(batch.docids)
        }


def test_a_build_on_a_local_dask_cluster_stores_what_one_process_does(built_long, tiny_base, tmp_path):
    """--workers N: the dense and store stages encode their shards on a local Dask cluster, and store what the
    build in one process stored (its store, passages, dense field and windows); the stages record it, and the
    build resumes with or without it (not a setting of what is built). --scheduler and --workers together are
    refused before any work."""
    ref, ref_record = built_long
    out = tmp_path / "dask"
    record = build(plan(ref_record.plan["collection"], out, tiny_base, workers=2), echo=lambda _: None)
    assert record.stages["dense"]["workers"] == 2 and record.stages["store"]["workers"] == 2
    assert "workers" not in ref_record.stages["store"]
    assert record.stages["store"]["passages"] and record.stages["store"]["windows"]
    a, b = paths(ref), paths(out)
    assert load_ranker(a["checkpoint"]).fingerprint == load_ranker(b["checkpoint"]).fingerprint
    for sub in ("", "passages", "dense", "windows"):
        mine, theirs = _stored(b["store"] / sub), _stored(a["store"] / sub)
        assert list(mine) == list(theirs) and mine, sub
        for d in mine:
            for k in mine[d]:  # float16 values: the same, whatever the threads that summed them
                np.testing.assert_allclose(
                    mine[d][k], theirs[d][k], rtol=2e-3, atol=2e-3, err_msg=f"{sub} {d} {k}"
                )
    said: list[str] = []
    build(plan(ref_record.plan["collection"], out, tiny_base), echo=said.append)
    assert sum("done before" in line for line in said) == len(STAGES)
    with pytest.raises(AheadrankError, match="--scheduler or --workers, not both"):
        build(
            plan(
                ref_record.plan["collection"],
                tmp_path / "x",
                tiny_base,
                scheduler="tcp://127.0.0.1:1",
                workers=2,
            )
        )
    assert not (tmp_path / "x").exists()


def test_a_text_the_store_holds_is_scored_with_its_documents_bm25_on_rerank(built):
    """/rerank (Cohere, Jina, TEI...) of a label-free build served with its index: a text the store holds gets its
    document's BM25 score (the one BM25's own candidates carry) beside its neural and dense scores, calibrated with
    the weights and Platt fitted for that feature set; a text it does not hold gets the BM25 score it would have as
    one more document of the index, and the same calibration: the store's texts sent as unknown ones score as they
    do when found; each text's score is still its own (the same alone as among others)."""
    import time

    from aheadrank.indexer.bm25 import Bm25Searcher
    from aheadrank.services.backend import RerankBackend, StageClock
    from aheadrank.services.settings import ServiceSettings

    out, record = built
    p = paths(out)
    lines = [json.loads(line) for line in open(record.plan["collection"])]
    stored = {d["id"]: d["contents"] for d in lines[:6]}
    unknown = "supersonic cone flow in a boundary layer of a shell with laminar heat"
    query = "supersonic flow over a cone"
    with Bm25Searcher(p["lucene"]) as searcher:
        bm25 = dict(searcher.search(query, 1000))
        unknown_bm25 = searcher.text_scores(query, [unknown])
    settings = ServiceSettings(
        checkpoint=p["checkpoint"], store=p["store"], index=p["lucene"], access_log=False
    )
    backend = RerankBackend.load(settings)
    try:
        cal = backend.scorer.calibration
        assert cal is not None and "neural+bm25+dense" in cal.platt and "neural+dense" in cal.platt
        texts = [*stored.values(), unknown]
        scores, _ = backend.score_texts(query, texts)
        # the stored documents' parts as /v1/rerank gives them for the same docids
        outcome = backend.rerank(query, list(stored), 100, None, time.perf_counter(), StageClock())
        neural = np.array([outcome.parts[d][0] for d in stored])
        dense = np.array([outcome.parts[d][1] for d in stored])
        b = np.array([bm25.get(d, 0.0) for d in stored])  # a document without the query's terms: 0
        assert {d: s for d, _, s in outcome.ranked} == pytest.approx(
            dict(zip(stored, b, strict=True)), abs=1e-4
        )
        expected = cal.logits({"neural": neural, "bm25": b, "dense": dense})
        assert scores[:6] == pytest.approx(expected.tolist(), abs=1e-3)
        without = cal.logits({"neural": neural, "dense": dense})
        assert np.max(np.abs(np.array(scores[:6]) - without)) > 1e-2  # BM25 moved them
        # the unknown text: its neural score (pure), its dense cosine and its BM25 as one more document
        (own,), _ = backend.score_texts(query, [unknown], pure=True)
        cosine = backend.scorer.text_dense(backend.scorer.query_vector(query), [unknown])
        assert unknown_bm25[0] > 0
        parts = {
            "neural": np.array([own]),
            "bm25": np.array(unknown_bm25),
            "dense": cosine.astype(np.float64),
        }
        assert scores[6] == pytest.approx(float(cal.logits(parts)[0]), abs=1e-3)
        alone, _ = backend.score_texts(query, [unknown])
        assert scores[6] == pytest.approx(alone[0], abs=1e-5)
        one, _ = backend.score_texts(query, [texts[2]])
        assert scores[2] == pytest.approx(one[0], abs=1e-5)
        # the store's texts, not looked up: encoded online, their BM25 from their text; the same scores
        backend.reader.text_shards = 0
        as_unknown, _ = backend.score_texts(query, texts[:6])
        assert as_unknown == pytest.approx(scores[:6], abs=2e-2)
    finally:
        backend.close()
