"""bench/plots.py: the depth curves rebuild what the service serves at each re-ranking depth, from runs alone."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np

from aheadrank.evaluation import by_score, evaluate, write_run
from aheadrank.priors import Priors

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1] / "bench")
)  # benchkit and plots, beside the scripts

import plots  # noqa: E402
from benchkit import SAMPLE, eval_topics  # noqa: E402

WEIGHTS = {"neural": 0.5, "bm25": 0.3, "dense": 0.2}


def fake_run(tmp_path: Path, depth: int = 20) -> tuple[dict, dict, dict]:
    """An effectiveness run over the sample's test queries: BM25, the bi-encoder, one ranker pure and served
    (the served run computed by the priors over every candidate, as the service scores a full-depth request)."""
    queries, qrels = eval_topics(SAMPLE, "test", None)
    docids = [json.loads(line)["_id"] for line in (SAMPLE / "corpus.jsonl").read_text().splitlines()]
    rng = random.Random(7)
    runs = {"bm25": {}, "bi-encoder": {}, "tk-2l": {}, "tk-2l+priors": {}}
    priors = Priors(weights={"neural+bm25+dense": WEIGHTS})
    for q in queries:
        cands = list(dict.fromkeys([*qrels[q], *rng.sample(docids, depth)]))[:depth]
        rng.shuffle(cands)
        feats = {f: np.array([rng.gauss(0, 1) for _ in cands]) for f in ("neural", "bm25", "dense")}
        runs["bm25"][q] = dict(zip(cands, feats["bm25"].tolist(), strict=True))
        runs["bi-encoder"][q] = dict(
            zip(cands, (2 * feats["dense"] + 1).tolist(), strict=True)
        )  # affine: as z
        runs["tk-2l"][q] = dict(zip(cands, feats["neural"].tolist(), strict=True))
        runs["tk-2l+priors"][q] = dict(zip(cands, priors.combine(feats).tolist(), strict=True))
    files = {}
    for name, run in runs.items():
        files[name] = tmp_path / "runs" / f"{name}.trec"
        write_run(files[name], run, name)
    metrics = {name: evaluate(run, qrels, plots.METRICS) for name, run in runs.items()}
    eff = {
        "settings": {"collection": str(SAMPLE), "split": "test", "depth": depth, "max_doc_len": 128},
        "bm25": {"run_file": str(files["bm25"]), "metrics": metrics["bm25"]},
        "baselines": {"bi-encoder": {"run_file": str(files["bi-encoder"]), "metrics": metrics["bi-encoder"]}},
        "rankers": {
            "tk-2l": {"pure": True, "run_file": str(files["tk-2l"]), "metrics": metrics["tk-2l"]},
            "tk-2l+priors": {
                "pure": False,
                "run_file": str(files["tk-2l+priors"]),
                "metrics": metrics["tk-2l+priors"],
                "priors": {"neural+bm25+dense": WEIGHTS},
            },
        },
    }
    return eff, runs, qrels


def test_depth_curves_rebuild_the_served_run_and_bm25(tmp_path):
    eff, runs, qrels = fake_run(tmp_path)
    speed = {
        "rows": [
            {"ranker": "tk-2l", "d_nominal": 128, "n_docs": 300, "ms_median": 31.0, "query_ms_median": 1.0}
        ]
    }
    result = plots.depth_curves(eff, speed, [0, 1, 5, 10, 50])
    row = result["rankers"]["tk-2l"]
    assert result["depths"] == [0, 1, 5, 10, 20]  # beyond the run's depth dropped, its depth added
    served, pure = row["curves"]["served"], row["curves"]["pure"]
    assert served[0]["nDCG@10"] == pure[0]["nDCG@10"] == result["bm25"]["nDCG@10"]  # depth 0: BM25's order
    assert (
        served[-1]["nDCG@10"] == eff["rankers"]["tk-2l+priors"]["metrics"]["nDCG@10"]
    )  # full depth: served run
    assert pure[-1]["nDCG@10"] == eff["rankers"]["tk-2l"]["metrics"]["nDCG@10"]
    assert row["full_depth_check"]["diff"] == 0
    assert [p["ms"] for p in served] == [1.0 + 0.1 * k for k in result["depths"]]


def test_a_shallow_depth_is_scored_over_its_own_candidates(tmp_path):
    """At depth k the features are z-scored over the first k only (a request of k candidates), and the
    tail keeps BM25's order: not the full-depth served scores cut at k."""
    eff, runs, qrels = fake_run(tmp_path)
    k = 5
    expect = {}
    for q, bm25 in runs["bm25"].items():
        order = [d for d, _ in by_score(bm25.items())]
        head = order[:k]
        feats = {
            "neural": np.array([runs["tk-2l"][q][d] for d in head]),
            "bm25": np.array([bm25[d] for d in head]),
            "dense": np.array([runs["bi-encoder"][q][d] for d in head]),
        }
        scored = dict(zip(head, Priors(weights={"neural+bm25+dense": WEIGHTS}).combine(feats), strict=True))
        ranked = [d for d, _ in by_score(scored.items())] + order[k:]
        expect[q] = {d: float(len(ranked) - i) for i, d in enumerate(ranked)}
    result = plots.depth_curves(eff, None, [k])
    (point,) = [p for p in result["rankers"]["tk-2l"]["curves"]["served"] if p["depth"] == k]
    assert point["nDCG@10"] == evaluate(expect, qrels, plots.METRICS)["nDCG@10"]
    assert point["ms"] is None  # no speed JSON: no time axis


def test_the_plots_are_drawn(tmp_path):
    eff, _, _ = fake_run(tmp_path)
    eff_path = tmp_path / "effectiveness.json"
    eff_path.write_text(json.dumps(eff))
    speed = {
        "machine": {"git_commit": "abc1234", "cpu": "test", "threads": 2},
        "rows": [
            {"ranker": r, "d_nominal": d, "d_pieces": d, "n_docs": 300, "ms_median": ms, "query_ms_median": 1.0,
             "floor_ms": ms / 1.5, "x_floor": 1.5, "stored_dtype": "float16"}
            for r, ms in (("bert", 4000.0), ("tk-2l", 6.0)) for d in (128, 493)
        ]
        + [  # a run timing several paths of one ranker: each drawn, the fastest one on the depth plot's time axis
            {"ranker": "tk-2l", "path": path, "d_nominal": 128, "d_pieces": 128, "n_docs": 300, "ms_median": ms,
             "query_ms_median": 1.0, "floor_ms": 2.0, "x_floor": ms / 2.0, "stored_dtype": "float16"}
            for path, ms in (("reference", 9.0), ("compiled", 4.0))
        ],
    }  # fmt: skip
    speed_path = tmp_path / "speed.json"
    speed_path.write_text(json.dumps(speed))
    assert plots.main(["speed", "--speed", str(speed_path)]) == 0
    assert plots.main(["depth", "--effectiveness", str(eff_path), "--speed", str(speed_path)]) == 0
    assert (tmp_path / "speed.png").stat().st_size > 0 and (tmp_path / "depth.png").stat().st_size > 0
    record = json.loads((tmp_path / "depth.json").read_text())
    assert record["command"].startswith(".venv/bin/python bench/plots.py depth")
    assert record["rankers"]["tk-2l"]["full_depth_check"]["diff"] == 0
    assert (
        record["rankers"]["tk-2l"]["timing"]["path"] == "compiled"
    )  # 4 ms, the fastest of the three tk-2l rows
