"""bench/label_free_loo.py: a collection's neural share is chosen on the other collections only, ties go to the
larger share, and a folder whose committed runs do not recompute is refused."""

from __future__ import annotations

import json
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import label_free_loo as loo  # noqa: E402
from label_free import label_free_baselines, runs_from, write_zst_run  # noqa: E402

THIRD, SIXTH, ZERO = Fraction(1, 3), Fraction(1, 6), Fraction(0)


def test_the_share_is_chosen_on_the_other_collections_and_ties_go_to_the_larger():
    margins = {
        "a": {ZERO: 0.0, SIXTH: 0.01, THIRD: 0.02},
        "b": {ZERO: 0.0, SIXTH: 0.03, THIRD: -0.05},
        "t": {ZERO: 0.9, SIXTH: -0.9, THIRD: -0.9},  # the target's own margins must not matter
    }
    assert loo.choose(margins, ["a", "b"]) == SIXTH  # mean 0.02 against -0.015 and 0
    assert loo.choose(margins, ["a"]) == THIRD
    assert loo.choose({"a": dict.fromkeys(loo.SHARES, 0.0)}, ["a"]) == THIRD  # a tie: the larger share
    assert loo.choose(margins, ["t"]) == ZERO
    for s in loo.SHARES:
        assert sum(loo.weights(s).values()) == pytest.approx(1.0)
    assert loo.weights(THIRD) == pytest.approx({"neural": 1 / 3, "bm25": 1 / 3, "dense": 1 / 3})
    assert loo.weights(ZERO) == {"neural": 0.0, "bm25": 0.5, "dense": 0.5}


def _collection(root: Path, name: str, rng, neural_gain: float, tamper: bool = False) -> None:
    """A BEIR folder with judged test queries and a bench folder's committed runs over BM25's candidates."""
    from aheadrank.priors import QueryFeatures

    data, runs = root / "data" / name, root / "bench" / name / "runs"
    (data / "qrels").mkdir(parents=True)
    runs.mkdir(parents=True)
    qids = [str(i) for i in range(1, 13)]
    (data / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": q, "text": f"q {q}"}) + "\n" for q in qids)
    )
    qrels = {q: {f"d{q}-{j}": 1 for j in range(2)} for q in qids}
    (data / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t1\n" for q in qids for d in qrels[q])
    )
    features = []
    for q in qids:
        docs = [f"d{q}-{j}" for j in range(20)]
        rel = np.array([1.0 if d in qrels[q] else 0.0 for d in docs])
        f = {
            "bm25": rng.normal(size=20) + 0.8 * rel,
            "dense": rng.normal(size=20) + 0.8 * rel,
            "neural": rng.normal(size=20) + neural_gain * rel,
        }
        features.append((q, QueryFeatures(docs, f, qrels[q])))
    base = label_free_baselines(features)
    for k in ("bm25", "bi-encoder", "rrf", "fusion-equal"):
        write_zst_run(runs / f"{k}.trec.zst", base[k], k)
    write_zst_run(runs / "toy.trec.zst", runs_from(features, {"neural": 1.0}), "toy")
    served = runs_from(features, loo.weights(THIRD))
    if tamper:  # a served run from another build: its top document per query swapped to the worst
        served = {q: {d: -s for d, s in r.items()} for q, r in served.items()}
    write_zst_run(runs / "toy+priors.trec.zst", served, "toy_priors")


def test_the_bench_end_to_end_on_committed_style_runs(tmp_path, capsys):
    rng = np.random.default_rng(0)
    for name, gain in (("one", 3.0), ("two", 3.0), ("three", -1.0)):
        _collection(tmp_path, name, rng, gain)
    out = tmp_path / "out"
    argv = ["--data", str(tmp_path / "data"), "--collections", "one", "two", "three"]
    assert loo.main([*argv, "--neural", f"{tmp_path / 'bench'}:toy", "--out", str(out)]) == 0
    got = json.loads((out / "label_free_loo.json").read_text())["results"]["toy"]
    rows = got["collections"]
    # a strong neural score on "one" and "two" gives "three" the largest share, whatever "three" says of it
    assert rows["three"]["share"] == "1/3" and rows["three"]["chosen_on"] == ["one", "two"]
    assert rows["three"]["margin_by_share"]["1/3"] < rows["three"]["margin_by_share"]["0"]
    # each served run is the one at its chosen share
    for c, row in rows.items():
        assert row["served"] == row["served_by_share"][row["share"]]
        assert (out / c / "runs" / "toy+priors.trec.zst").exists()
        assert set(row["checked_against_committed"]) == {"fusion-equal", "rrf", "toy+priors"}
    assert "| toy | three |" in capsys.readouterr().out


def test_a_folder_whose_served_run_does_not_recompute_is_refused(tmp_path):
    rng = np.random.default_rng(1)
    _collection(tmp_path, "one", rng, 3.0, tamper=True)
    _collection(tmp_path, "two", rng, 3.0)
    argv = ["--data", str(tmp_path / "data"), "--collections", "one", "two", "--out", str(tmp_path / "o")]
    with pytest.raises(SystemExit, match=r"toy\+priors.trec.zst: committed nDCG@10 .* recomputed"):
        loo.main([*argv, "--neural", f"{tmp_path / 'bench'}:toy"])


def test_one_collection_cannot_choose_for_itself(capsys):
    with pytest.raises(SystemExit):
        loo.parse_args(["--collections", "scifact", "--neural", "a:mores-2ib-s2"])
    assert "--collections: at least two" in capsys.readouterr().err


def test_the_label_free_build_serves_each_kind_at_the_share_the_committed_rule_chose():
    """``aheadrank.build.label_free_weights`` holds the shares bench/results/label-free/loo/ chose over every
    collection (the rule's product default), and its feature subsets are the full weights renormalised."""
    from aheadrank.build import LABEL_FREE_WEIGHTS, label_free_weights

    committed = Path(__file__).resolve().parents[1] / "bench" / "results" / "label-free" / "loo"
    results = json.loads((committed / "label_free_loo.json").read_text())["results"]
    assert {v.split("-")[0] for v in results} == {"mores", "prettr", "tk"}
    for variant, r in results.items():
        w = label_free_weights(variant.split("-")[0])
        assert w["neural+bm25+dense"]["neural"] == pytest.approx(float(Fraction(r["default_share"])))
    for kind in ("mores", "prettr", "tk", "bert", None):
        w = label_free_weights(kind)
        full = w["neural+bm25+dense"]
        assert sum(full.values()) == pytest.approx(1.0) and full["bm25"] == full["dense"]
        for sub in w.values():
            assert sum(sub.values()) == pytest.approx(1.0)
            assert sub["neural"] / sub.get("bm25", sub.get("dense", 1)) == pytest.approx(
                full["neural"] / full["bm25"] if len(sub) > 1 else 1.0
            )
    assert label_free_weights("mores") == LABEL_FREE_WEIGHTS == label_free_weights(None)
    assert LABEL_FREE_WEIGHTS["neural+bm25+dense"] == {"neural": 1 / 3, "bm25": 1 / 3, "dense": 1 / 3}
