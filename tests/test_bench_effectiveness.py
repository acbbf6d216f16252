"""bench/effectiveness.py --quick end to end on a tiny setup: a 300-document slice of the bundled SciFact
sample and a tiny random BERT base, five variants (bert, MORES 1×IB S1 and S2, PreTTR with a compressor,
TK), distillation on; then a second run that must reuse every checkpoint, store and run."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from aheadrank.evaluation import ranking, read_run

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "aheadrank" / "data" / "scifact-sample"
VARIANTS = ["bert", "mores-1ib-s1", "mores-1ib-s2", "prettr-l3-e16", "tk-1l"]
METRICS = ("nDCG@10", "MRR@10", "R@100", "MAP")


def small_collection(dst: Path, n_docs: int = 300) -> Path:
    """The sample's queries and qrels, every judged document, and unjudged ones up to ``n_docs``."""
    judged = set()
    for split in ("train", "test"):
        for line in (SAMPLE / "qrels" / f"{split}.tsv").read_text().splitlines()[1:]:
            judged.add(line.split("\t")[1])
    lines = (SAMPLE / "corpus.jsonl").read_text().splitlines()
    keep = [x for x in lines if json.loads(x)["_id"] in judged]
    keep += [x for x in lines if json.loads(x)["_id"] not in judged][: max(0, n_docs - len(keep))]
    (dst / "qrels").mkdir(parents=True)
    (dst / "corpus.jsonl").write_text("\n".join(keep) + "\n")
    shutil.copyfile(SAMPLE / "queries.jsonl", dst / "queries.jsonl")
    for split in ("train", "test"):
        shutil.copyfile(SAMPLE / "qrels" / f"{split}.tsv", dst / "qrels" / f"{split}.tsv")
    return dst


def run_bench(args: list[str]) -> str:
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "effectiveness.py"), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    return out


@pytest.mark.slow  # Java (BM25) and a subprocess
def test_effectiveness_quick(tmp_path, tiny_base):
    collection = small_collection(tmp_path / "scifact-slice")
    other = small_collection(tmp_path / "other-slice", n_docs=200)  # zero-shot: another collection
    out_dir, work = tmp_path / "out", tmp_path / "work"
    args = [
        "--quick",
        "--base",
        str(tiny_base),
        "--collection",
        str(collection),
        "--rankers",
        *VARIANTS,
        "--max-queries",
        "8",
        "--distill-weight",
        "0.5",
        "--listwise-weight",
        "0.5",
        "--sim",
        "--eval-collections",
        str(other),
        "--threads",
        "1",
        "--workdir",
        str(work),
        "--out-dir",
        str(out_dir),
        "--no-progress",
    ]
    first = run_bench(args)
    assert "train mores-1ib: 3 steps" in first and "distilled from bert" in first
    assert "teacher: BM25 + bi-encoder fusion" in first

    # runs: BM25 and every variant, 8 queries each, the same BM25 top-100 candidates
    bm25 = read_run(out_dir / "runs" / "bm25.trec")
    assert len(bm25) == 8
    rows = [n for v in VARIANTS for n in (v, f"{v}+priors")]
    baselines = ["bi-encoder", "bm25+bi-encoder", "rrf"]
    runs = {name: read_run(out_dir / "runs" / f"{name}.trec") for name in [*rows, *baselines]}
    for name, run in runs.items():
        assert run.keys() == bm25.keys(), name
        for qid in run:
            assert set(run[qid]) == set(bm25[qid]), (name, qid)

    result = json.loads((out_dir / "effectiveness.json").read_text())
    for key in (
        "command",
        "settings",
        "machine",
        "bm25",
        "rankers",
        "checkpoints",
        "s1_s2",
        "goals",
        "wall_s",
        "baselines",
        "validation",
    ):
        assert key in result
    assert list(result["rankers"]) == rows
    assert list(result["baselines"]) == baselines
    assert set(result["baselines"]["bm25+bi-encoder"]["weights"]) == {"bm25", "dense"}
    for name in VARIANTS:
        pure, priors = result["rankers"][name], result["rankers"][f"{name}+priors"]
        assert pure["pure"] and pure["priors"] is None
        assert not priors["pure"] and set(priors["priors"]) == {
            "neural",
            "neural+bm25",
            "neural+dense",
            "neural+bm25+dense",
        }
        assert priors["rerank"]["notices"] == []
    assert set(result["checkpoints"]) == {"bert", "mores-1ib", "prettr-l3-e16", "tk-1l"}  # S1/S2 share one
    assert result["checkpoints"]["prettr-l3-e16"]["compressor_loss_first"] is not None
    assert result["checkpoints"]["tk-1l"]["key"]["teacher"] == result["rankers"]["bert"]["fingerprint"]
    assert result["checkpoints"]["mores-1ib"]["key"]["options"]["sim"] is True  # --sim: the residual
    assert "sim" not in result["checkpoints"]["tk-1l"]["key"]["options"]
    assert all(0.0 <= result["bm25"]["metrics"][m] <= 1.0 for m in METRICS)
    for name, row in result["rankers"].items():
        assert set(row["metrics"]) == set(METRICS)
        assert all(0.0 <= row["metrics"][m] <= 1.0 for m in METRICS), (name, row["metrics"])
        assert row["train"]["train_seconds"] > 0 and row["store"]["bytes_per_doc"] > 0
        assert row["store"]["documents"] == 300
        if name in ("bert", "bert+priors"):
            assert row["vs_bert"] is None
        else:
            vs = row["vs_bert"]["nDCG@10"]
            assert set(vs["non_inferior"]) == {"0.02", "0.05"}
            assert vs["ratio"] is None or vs["ratio"] >= 0
    assert (
        result["rankers"]["mores-1ib-s2"]["store"]["bytes_per_doc"]
        > (result["rankers"]["mores-1ib-s1"]["store"]["bytes_per_doc"])
    )  # S2 keeps K and V, S1 the states
    goals = {g["goal"] for g in result["goals"]}
    assert {
        "bert ≥ BM25",
        "PreTTR l5/e128 within 10% of bert",
        "MORES 2×IB non-inferior to bert at 5%",
    } <= goals
    assert any(g.startswith("TK above the bi-encoder alone") for g in goals)
    assert any(g["goal"].startswith("with priors, every ranker beats BM25") for g in result["goals"])
    assert all(g["status"] in (True, False, None) for g in result["goals"])

    # S1 and S2 are the same math: the same candidates in the same order, up to float16 near-ties
    check, with_priors = result["s1_s2"]
    assert check["model"] == "mores-1ib" and check["equivalent_fp16"], check
    assert with_priors["model"] == "mores-1ib+priors" and with_priors["equivalent_fp16"], with_priors
    s1, s2 = runs["mores-1ib-s1"], runs["mores-1ib-s2"]
    scale = max(abs(s) for docs in s1.values() for s in docs.values())
    worst = max(abs(s1[q][d] - s2[q][d]) for q in s1 for d in s1[q])
    assert math.isclose(worst, check["max_abs_score_diff"], rel_tol=1e-9)
    assert worst <= 2e-3 * scale
    if check["identical"]:
        assert all(ranking(s1[q]) == ranking(s2[q]) for q in s1)

    (zs,) = result["zero_shot"]
    assert zs["name"] == "other-slice" and zs["queries"] == 8  # --max-queries bounds its queries too
    assert set(zs["rows"]) == {"bm25", "bi-encoder", "bm25+bi-encoder", "rrf", *rows}
    for name in zs["rows"]:
        assert (out_dir / "runs" / "other-slice" / f"{name}.trec").is_file()
    assert any(g["goal"].startswith("zero-shot on other-slice") for g in result["goals"])

    md = (out_dir / "effectiveness.md").read_text()
    assert "## Goals" in md and "bench/effectiveness.py --quick" in md and "| mores-1ib-s2 |" in md

    # a re-run with the same settings reuses everything, BM25 hits included: without the Lucene index
    # (as on a machine with no Java, the hits carried from one that has it) nothing is searched again
    shutil.rmtree(work / "bm25")
    second = run_bench(args)
    assert "building" not in second and "steps ×" not in second and "bm25 index" not in second
    assert not (work / "bm25").exists()
    for name in VARIANTS:
        assert f"rerank {name}: cached" in second and f"store {name}: cached" in second
        assert f"rerank {name}+priors: cached" in second
    assert "held-out validation queries" not in second  # nothing refitted
    again = json.loads((out_dir / "effectiveness.json").read_text())
    assert again["rankers"]["tk-1l"]["metrics"] == result["rankers"]["tk-1l"]["metrics"]

    # the time-budget evaluation over the same checkpoints and stores
    tb_out = tmp_path / "tb.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "time_budget.py"), "--quick", "--threads", "1", "--no-progress",
         "--effectiveness", str(out_dir / "effectiveness.json"), "--out", str(tb_out)],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    tb = json.loads(tb_out.read_text())
    assert list(tb["rankers"]) == rows and tb_out.with_suffix(".png").stat().st_size > 0
    depth = tb["settings"]["depth"]
    for name, row in tb["rankers"].items():
        assert row["timing"]["per_doc_ms"] > 0, name
        depths = [b["depth"] for b in row["budgets"]]
        assert depths == sorted(depths) and all(0 <= k <= depth for k in depths), (name, depths)
        assert depths[-1] == depth  # the largest budget re-ranks everything ...
        assert row["budgets"][-1]["nDCG@10"] == pytest.approx(
            row["full_depth"]["nDCG@10"]
        )  # ... = the full run
        for b in row["budgets"]:
            if b["depth"] == 0:  # nothing re-ranked: BM25's own order
                assert b["nDCG@10"] == pytest.approx(tb["bm25"]["nDCG@10"]), name


@pytest.mark.slow  # Java (BM25)
def test_pooled_similarity_bench(tmp_path, tiny_base):
    """bench/pooled_similarity.py on a slice: the three orderings are scored, the map's fit is recorded, and the
    step-0 ranker's ordering is the store path's (not the layer-l pooling the map replaces)."""
    sys.path.insert(0, str(REPO / "bench"))
    import pooled_similarity

    collection = small_collection(tmp_path / "slice", n_docs=120)
    out = tmp_path / "pooled.json"
    args = ["--base", str(tiny_base), "--collection", str(collection), "--layers", "1", "2", "--max-queries", "10",
            "--fit-docs", "60", "--workdir", str(tmp_path / "work"), "--out", str(out), "--no-progress"]  # fmt: skip
    assert pooled_similarity.main(args) == 0
    record = json.loads(out.read_text())
    assert [r["layer"] for r in record["rows"]] == [1, 2]
    for r in record["rows"]:
        assert r["fit"]["documents"] == 60 and r["fit"]["r2"] <= 1.0
        for name in ("layer_l_pooled", "mapped_step0", "bi_encoder"):
            assert 0.0 <= r[name] <= 1.0
    assert 0.0 <= record["bm25"] <= 1.0


def test_goal_verdicts_follow_issue_14():
    """The verdicts read the numbers: each goal flips when its number crosses the line, and a ranker that was
    not run is "not run" (None), never met."""
    sys.path.insert(0, str(REPO / "bench"))
    import effectiveness as eff

    def row(v, ratio=1.0, ni5=True, vs_fusion=(0.0, 1.0)):
        diff, p = vs_fusion
        return {
            "metrics": {"nDCG@10": v},
            "vs_bm25": {"nDCG@10": {"p": 0.5}},
            "vs_bert": {
                "nDCG@10": {"ratio": ratio, "non_inferior": {"0.05": ni5}, "p_non_inferior": {"0.05": 0.01}}
            },
            "vs_fusion": {"nDCG@10": {"mean_diff": diff, "p": p, "significant": p < 0.05}},
        }

    bm25 = {"metrics": {"nDCG@10": 0.68}}
    baselines = {
        "bi-encoder": {"metrics": {"nDCG@10": 0.67}},
        "bm25+bi-encoder": {"metrics": {"nDCG@10": 0.736}},
    }
    rows = {
        "bert": row(0.70),
        "mores-2ib-s2": row(0.69, ni5=True),
        "prettr-l5-e128": row(0.64, ratio=0.914),
        "tk-2l": row(0.671),
        "mores-2ib-s2+priors": row(0.76, vs_fusion=(0.02, 0.01)),
        "prettr-l5-e128+priors": row(0.751, vs_fusion=(0.015, 0.03)),
    }
    verdict = {g["goal"].split(" (")[0]: g["status"] for g in eff.goal_verdicts(rows, bm25, baselines)}
    assert all(verdict.values()), verdict
    rows["bert"] = row(0.679)
    rows["prettr-l5-e128"] = row(0.60, ratio=0.899)
    rows["tk-2l"] = row(0.669)
    rows["prettr-l5-e128+priors"] = row(0.7499, vs_fusion=(0.014, 0.009))
    verdict = {g["goal"].split(" (")[0]: g["status"] for g in eff.goal_verdicts(rows, bm25, baselines)}
    assert verdict["bert ≥ BM25"] is False
    assert verdict["PreTTR l5/e128 within 10% of bert"] is False
    assert verdict["TK above the bi-encoder alone"] is False
    assert verdict["MORES 2×IB non-inferior to bert at 5%"] is True
    assert [v for k, v in verdict.items() if k.startswith("with priors")] == [False]
    del rows["prettr-l5-e128"], rows["mores-2ib-s2"]
    verdict = {g["goal"].split(" (")[0]: g["status"] for g in eff.goal_verdicts(rows, bm25, baselines)}
    assert verdict["PreTTR l5/e128 within 10% of bert"] is None
    assert verdict["MORES 2×IB non-inferior to bert at 5%"] is None
