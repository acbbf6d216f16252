"""bench/label_free.py's transfer: the collections a target's ranker is trained on, and the merged collection of
their judgments (never the target's)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free  # noqa: E402
from aheadrank.indexer.topics import read_beir_split  # noqa: E402


def beir(root: Path, name: str, docs: list[str], splits: dict[str, dict[str, list[str]]]) -> None:
    d = root / name
    (d / "qrels").mkdir(parents=True)
    (d / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": i, "title": "", "text": f"text of {name} {i}"}) + "\n" for i in docs)
    )
    queries = {q for split in splits.values() for q in split}
    (d / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": f"{name} query {q}"}) + "\n" for q in sorted(queries))
    )
    for split, judged in splits.items():
        rows = [f"{q}\t{doc}\t1" for q, ds in judged.items() for doc in ds]
        (d / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")
    # all.tsv repeats the splits (as Cranfield's and Vaswani's do): not read twice
    rows = [f"{q}\t{doc}\t1" for judged in splits.values() for q, ds in judged.items() for doc in ds]
    (d / "qrels" / "all.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")


def test_sources_never_include_the_target():
    assert label_free.parse_sources(["scifact=cranfield+vaswani"], []) == {
        "scifact": ["cranfield", "vaswani"]
    }
    for bad in ("scifact=scifact+vaswani", "scifact=", "scifact"):
        with pytest.raises(SystemExit, match="TARGET"):
            label_free.parse_sources([bad], [])


def test_each_setting_that_changes_the_ranker_builds_in_a_folder_of_its_own():
    def name(*argv, transfer=False):
        args = label_free.parse_args(["--collections", "scifact", "cranfield", *argv])
        return label_free.build_name(args, "scifact", "mores-2ib-s2", transfer=transfer)

    # the defaults are the build's (teacher positives, passages); the folder names keep the first recipe's
    # settings bare, so that the builds measured with it are found again
    assert name() == "mores-2ib-s2-positive-teacher-passages"
    assert name("--positive", "source", "--no-passages") == "mores-2ib-s2"
    assert name("--lr", "2e-5", "--no-passages") == "mores-2ib-s2-positive-teacher-lr2e-05"
    transfer = name("--sources", "scifact=cranfield", "--transfer-steps", "0", "--no-passages", transfer=True)
    assert transfer == "mores-2ib-s2-from-cranfield-0-positive-teacher"
    assert name("--fit-head") == "mores-2ib-s2-positive-teacher-fit-head-passages"
    assert (
        label_free.plan_for(label_free.parse_args(["--fit-head"]), Path("c"), "m", Path("o")).fit_head is True
    )
    assert label_free.plan_for(label_free.parse_args([]), Path("c"), "m", Path("o")).fit_head is None
    # the rate of what starts from scratch (TK's kernel weights and mix) reaches the build plan
    assert name("--fresh-lr", "1e-3") == "mores-2ib-s2-positive-teacher-fresh-lr0.001-passages"
    fresh = label_free.plan_for(label_free.parse_args(["--fresh-lr", "1e-3"]), Path("c"), "m", Path("o"))
    assert fresh.fresh_lr == 1e-3
    assert label_free.plan_for(label_free.parse_args([]), Path("c"), "m", Path("o")).fresh_lr is None
    settings = [
        (),
        ("--lr", "1e-4"),
        ("--fresh-lr", "1e-4"),
        ("--positive", "source"),
        ("--steps", "120"),
        ("--ce-weight", "0"),
        ("--fit-head",),
    ]
    assert len({name(*s) for s in settings}) == len(settings)
    # passages change the store, not the ranker: their own folder too, and the build plan stores them
    assert name("--no-passages") == "mores-2ib-s2-positive-teacher"
    for argv, stored in (([], True), (["--no-passages"], False)):
        args = label_free.parse_args(argv)
        assert label_free.plan_for(args, Path("c"), "mores-2ib-s2", Path("o")).passages is stored
    # how deep the test queries are reranked is not a setting of the build: the same folder serves any depth
    assert name("--depth", "200") == name() and label_free.parse_args(["--depth", "200"]).depth == 200
    assert label_free.parse_args([]).depth == label_free.DEPTH == 100


def test_merged_collection_keeps_every_judged_query_of_each_source_under_its_name(tmp_path):
    beir(tmp_path, "a", ["1", "2", "3"], {"train": {"1": ["1"], "2": ["2", "3"]}, "test": {"1": ["3"]}})
    beir(tmp_path, "b", ["1", "9"], {"test": {"7": ["9"]}})
    out = label_free.merged_collection(tmp_path, ["a", "b"], tmp_path / "merged" / "collection")
    ids = [json.loads(line)["_id"] for line in (out / "corpus.jsonl").read_text().splitlines()]
    assert ids == ["a/1", "a/2", "a/3", "b/1", "b/9"]  # the same docid in two sources stays two documents
    queries, qrels = read_beir_split(out, "train")
    # a query id repeated across splits (a's "1" in train and test) stays two queries, each with its judgments
    assert qrels == {
        "a/test/1": {"a/3": 1},
        "a/train/1": {"a/1": 1},
        "a/train/2": {"a/2": 1, "a/3": 1},
        "b/test/7": {"b/9": 1},
    }
    assert queries["b/test/7"] == "b query 7"
    # built once: a second call reads what is there
    (out / "corpus.jsonl").write_text("")
    assert label_free.merged_collection(tmp_path, ["a", "b"], out).joinpath("corpus.jsonl").read_text() == ""


def test_pure_and_served_score_the_neural_feature_alone_and_with_the_priors():
    """The probes' evaluation: pure is the neural score's own ranking, served its z-scores with BM25 and the
    bi-encoder's, 1/3 each, each compared with BM25 and the better fusion."""
    import numpy as np

    from aheadrank.priors import QueryFeatures

    docids = ["a", "b", "c", "d"]
    qrels = {"q1": {"a": 1}, "q2": {"d": 1}}
    vf = [  # neural ranks the relevant document first; BM25 last; the bi-encoder in between
        ("q1", QueryFeatures(docids, {"neural": np.array([4.0, 3, 2, 1]), "bm25": np.array([1.0, 2, 3, 4]),
                                      "dense": np.array([0.5, 0.9, 0.1, 0.2])}, qrels["q1"])),
        ("q2", QueryFeatures(docids, {"neural": np.array([1.0, 2, 3, 4]), "bm25": np.array([4.0, 3, 2, 1]),
                                      "dense": np.array([0.1, 0.2, 0.9, 0.5])}, qrels["q2"])),
    ]  # fmt: skip
    baselines = label_free.label_free_baselines(vf)
    rows = label_free.pure_and_served(vf, qrels, baselines, "fusion-equal")
    assert set(rows) == {"pure", "served"}
    assert rows["pure"]["ndcg10"] == pytest.approx(1.0)
    # served: neural's and BM25's equal shares cancel, the bi-encoder's puts the relevant document second
    assert rows["served"]["ndcg10"] == pytest.approx(1 / np.log2(3))
    assert rows["pure"]["vs_bm25"]["diff"] > 0  # BM25 puts the relevant document last for both


def test_window_table_has_a_row_per_run_of_each_window():
    result = {
        "collection": "cranfield",
        "ranker_window": 128,
        "baselines": {"bm25": 0.3443, "rrf": 0.4022, "fusion-equal": 0.3907},
        "best_baseline": "rrf",
        "windows": {
            "128": {"runs": {"maxp/pure": {"ndcg10": 0.373, "vs_bm25": {"diff": 0.0287, "p": 0.21},
                                           "vs_best_baseline": {"diff": -0.0292, "p": 0.12}}}},
            "sent2": {"runs": {"maxp/pure": {"ndcg10": 0.3847, "vs_bm25": {"diff": 0.0404, "p": 0.069},
                                             "vs_best_baseline": {"diff": -0.0175, "p": 0.33}}}},
        },
    }  # fmt: skip
    md = label_free.window_table([result], "windows", "window")
    assert "### cranfield (the ranker's window 128; BM25 0.3443, rrf 0.4022)" in md
    assert "| 128 | maxp/pure | 0.3730 | +0.0287 (p 0.21) | -0.0292 (p 0.12) |" in md
    assert "| sent2 | maxp/pure | 0.3847 | +0.0404 (p 0.069) | -0.0175 (p 0.33) |" in md
    del result["ranker_window"]
    assert "### cranfield (BM25 0.3443, rrf 0.4022)" in label_free.window_table([result], "windows", "w")
