"""aheadrank/buildtime.py: what the stages of ``aheadrank build`` should cost, from the collection's size and the
plan (the estimate the build prints; tests/test_build.py checks that it prints it)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from aheadrank.rankers.recipe import LABEL_FREE_STEPS, POOL_DOCS, RECIPES

from aheadrank import buildtime
from aheadrank.build import BuildPlan, workload
from aheadrank.buildtime import (
    DENSE_S,
    KIND_COST,
    PROBE_BATCH,
    STORE_S_PER_SEQUENCE,
    ProbeSample,
    Workload,
    estimate_line,
    probe_batches,
    reference_seconds,
    size,
    speed_probe,
    store_bytes,
    stored_sequences,
)

SCIFACT = Workload(
    documents=5183, mean_words=214.6, queries=3000, steps=0, cost="mores", window=128, passages=True
)


def test_the_cost_follows_the_documents_their_length_and_the_steps():
    ref = reference_seconds(SCIFACT)
    double = reference_seconds(dataclasses.replace(SCIFACT, documents=2 * SCIFACT.documents))
    for stage in ("dense", "store"):
        assert double[stage] == pytest.approx(2 * ref[stage])
    assert double["bm25"] > ref["bm25"] and double["train"] == ref["train"]  # no steps: the start only
    trained = reference_seconds(dataclasses.replace(SCIFACT, steps=360))
    assert trained["train"] - ref["train"] == pytest.approx(360 * 2.6)
    # passages are stored only for documents longer than the window, and they cost store time
    plain = dataclasses.replace(SCIFACT, passages=False)
    assert reference_seconds(plain)["store"] < ref["store"]
    short = dataclasses.replace(SCIFACT, mean_words=40.0)
    assert stored_sequences(short) == stored_sequences(dataclasses.replace(short, passages=False))
    assert stored_sequences(plain) == SCIFACT.documents  # the first window only


def test_a_cpu_that_trains_in_float32_is_estimated_at_the_float32_step():
    from aheadrank.buildtime import STEP_S, STEP_S_FLOAT32

    trained = dataclasses.replace(SCIFACT, steps=360)
    f32 = dataclasses.replace(trained, float32_steps=True)
    extra = reference_seconds(f32)["train"] - reference_seconds(trained)["train"]
    assert extra == pytest.approx(360 * (STEP_S_FLOAT32 - STEP_S)) and STEP_S_FLOAT32 > STEP_S
    assert reference_seconds(dataclasses.replace(SCIFACT, float32_steps=True)) == reference_seconds(SCIFACT)


def test_the_reference_reproduces_the_measured_scifact_build_within_its_order():
    """bench/results/label-free/build-time/ at bd750f3 (2 idle cores, 360 steps, no passages): dense 102 s, store
    55 s, training 935 s; passages-served/: the store with passages 277 s. The rates were read off these builds, so
    this checks the arithmetic, not the machine."""
    built = dataclasses.replace(SCIFACT, steps=360, passages=False)
    ref = reference_seconds(built)
    assert ref["dense"] == pytest.approx(102, rel=0.1)
    assert ref["store"] == pytest.approx(55, rel=0.25)
    assert ref["train"] == pytest.approx(935, rel=0.1)
    assert reference_seconds(SCIFACT)["store"] == pytest.approx(277, rel=0.25)


def test_every_ranker_kind_has_a_cost_and_the_line_names_the_stages_left():
    assert set(KIND_COST) >= {"mores", "prettr", "tk", "tk-base", "bert"}
    assert STORE_S_PER_SEQUENCE > 0
    line = estimate_line({"train": 30.0, "store": 300.0, "priors": 0.4}, None)
    assert line.startswith("[estimate] about 6 min left (train 30 s, store 5 min)")
    assert "x 0.5" in estimate_line({"store": 300.0}, 0.5)
    assert estimate_line({"bm25": 0.2, "dense": 0.5}, None).startswith(
        "[estimate] about 1 s left (each under 1 s)"
    )
    assert "earlier run" not in estimate_line({"store": 300.0}, 0.5)
    assert "x 0.5" in estimate_line({"store": 300.0}, 0.5, earlier=True)
    assert "in an earlier run" in estimate_line({"store": 300.0}, 0.5, earlier=True)


def test_a_label_free_plan_estimates_what_the_build_will_run(tmp_path):
    coll = tmp_path / "c.jsonl"
    coll.write_text('{"id": "d1", "contents": "a b c"}\n')
    info = {"documents": 20000, "mean_words": 55.0}
    lf = workload(BuildPlan(str(coll), str(tmp_path / "o"), ranker="prettr", labels="none"), info)
    assert lf.steps == LABEL_FREE_STEPS and lf.queries == 3000 and lf.passages and lf.window == 128
    assert lf.cost == "prettr" and lf.pool_docs == min(POOL_DOCS, 20000)
    tk = workload(BuildPlan(str(coll), str(tmp_path / "o"), ranker="tk", labels="none", steps=36), info)
    assert tk.cost == "tk-base" and tk.steps == 36 and tk.pool_docs == 0  # label-free tk is tk-6l-base
    # with judgments: the recipe's steps and window, the judged queries, no passages
    (tmp_path / "beir" / "qrels").mkdir(parents=True)
    (tmp_path / "beir" / "qrels" / "train.tsv").write_text(
        "query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td1\t1\n"
    )
    judged = workload(BuildPlan(str(tmp_path / "beir"), str(tmp_path / "o"), ranker="tk"), info)
    assert judged.steps == RECIPES["cpu"].steps and judged.queries == 2 and not judged.passages
    # with judgments tk is tk-6l-base-specials (aheadrank.build.JUDGED_VARIANTS): the base's layers' cost
    assert judged.cost == "tk-base" and judged.window == RECIPES["cpu"].max_doc_len
    tk2 = workload(BuildPlan(str(tmp_path / "beir"), str(tmp_path / "o"), ranker="tk-2l"), info)
    assert tk2.cost == "tk" and tk2.steps == RECIPES["cpu"].steps
    # the step's precision as the collection stage found the CPU (a record from before it: the reference's bfloat16)
    assert not judged.float32_steps
    avx2 = workload(
        BuildPlan(str(tmp_path / "beir"), str(tmp_path / "o"), ranker="tk"),
        {**info, "cpu_bf16_native": False},
    )
    assert avx2.float32_steps
    gpu = BuildPlan(str(tmp_path / "beir"), str(tmp_path / "o"), ranker="tk", device="cuda")
    assert not workload(gpu, {**info, "cpu_bf16_native": False}).float32_steps  # the GPU recipe, probe-scaled


def test_the_start_and_the_priors_follow_the_held_out_queries(tmp_path):
    """The start's validation and the priors score the queries the trainer holds out: a collection too small for the
    recipe's 100 holds out a fifth of its queries, and those two stages shrink with it; the rest does not move."""
    from aheadrank.buildtime import HELD_OUT_QUERIES, PRIORS_S

    ref = reference_seconds(SCIFACT)
    assert SCIFACT.held_out == HELD_OUT_QUERIES and ref["priors"] == PRIORS_S
    small = reference_seconds(dataclasses.replace(SCIFACT, held_out=8))
    assert small["priors"] == pytest.approx(PRIORS_S * 8 / HELD_OUT_QUERIES)
    assert small["train"] == pytest.approx(KIND_COST["mores"]["start"] * 8 / HELD_OUT_QUERIES)
    assert {k: v for k, v in small.items() if k not in ("train", "priors")} == {
        k: v for k, v in ref.items() if k not in ("train", "priors")
    }
    trained = dataclasses.replace(SCIFACT, steps=360, held_out=8)  # the steps stay what they cost
    assert reference_seconds(trained)["train"] - small["train"] == pytest.approx(360 * 2.6)
    coll = tmp_path / "c.jsonl"
    coll.write_text('{"id": "d1", "contents": "a b c"}\n')
    plan = BuildPlan(str(coll), str(tmp_path / "o"), labels="none")
    val = RECIPES["cpu"].val_queries
    assert workload(plan, {"documents": 60, "mean_words": 30.0}).held_out == 12  # a fifth of 60
    assert workload(plan, {"documents": 20000, "mean_words": 30.0}).held_out == val  # the recipe's, of 3,000


def test_the_window_prior_adds_its_windows_to_the_dense_stage(tmp_path):
    from aheadrank.buildtime import WINDOW_S

    ref = reference_seconds(SCIFACT)
    windowed = reference_seconds(dataclasses.replace(SCIFACT, windows=43_000))
    assert windowed["dense"] - ref["dense"] == pytest.approx(43_000 * WINDOW_S)
    assert {k: v for k, v in windowed.items() if k != "dense"} == {
        k: v for k, v in ref.items() if k != "dense"
    }
    coll = tmp_path / "c.jsonl"
    coll.write_text('{"id": "d1", "contents": "a b c"}\n')
    plan = BuildPlan(str(coll), str(tmp_path / "o"), labels="none")
    info = {"documents": 100, "mean_words": 55.0}
    assert workload(plan, {**info, "multi_window": 0.9, "windows": 400}).windows == 400
    assert workload(plan, {**info, "multi_window": 0.1, "windows": 40}).windows == 0  # one-window documents
    assert workload(plan, info).windows == 0  # a record from before the window prior
    off = BuildPlan(str(coll), str(tmp_path / "o"), labels="none", windows=False)
    assert workload(off, {**info, "multi_window": 0.9, "windows": 400}).windows == 0


def test_the_probe_sample_is_a_seeded_reservoir_of_the_whole_collection():
    few = ProbeSample(size=10)
    for i in range(4):
        few.add(f"t{i}")
    assert few.texts == ["t0", "t1", "t2", "t3"]  # fewer than the pool: every text
    many = [ProbeSample(size=10), ProbeSample(size=10)]
    for s in many:
        for i in range(1000):
            s.add(f"t{i}")
    assert many[0].texts == many[1].texts and len(many[0].texts) == 10 and many[0].seen == 1000
    assert (
        max(int(t[1:]) for t in many[0].texts) >= 100
    )  # not the first ten: the later texts got their chance


def test_the_probe_times_two_batches_of_neighbours_in_length():
    lengths = list(range(1000))  # document i is i pieces long
    picks = probe_batches(lengths)
    assert len(picks) == 2 * PROBE_BATCH and len(set(picks)) == len(picks)
    first, second = sorted(picks[:PROBE_BATCH]), sorted(picks[PROBE_BATCH:])
    assert first == list(range(686, 750)) and second == list(
        range(186, 250)
    )  # at the quartiles, longest first
    assert sorted(probe_batches([5, 3, 9])) == [0, 1, 2]  # a small pool: all of it, once
    assert probe_batches([]) == []


class _Encoder:
    """A bi-encoder's interface (rankers/dense.py): a piece a word; records the batches it was given."""

    def __init__(self):
        self.calls = []

    def tokenize_documents(self, texts):
        return [[1] * len(t.split()) for t in texts]

    def encode(self, seqs, batch_size=64):
        self.calls.append((len(seqs), batch_size))


def test_the_probe_scales_the_reference_by_its_time_against_the_reference_for_the_same_documents(monkeypatch):
    texts = [" ".join(["w"] * (10 + i)) for i in range(300)]
    clock = iter([100.0, 103.0])  # the timed encode takes 3 s (the warm-up is not timed)
    monkeypatch.setattr(buildtime.time, "perf_counter", lambda: next(clock))
    enc = _Encoder()
    got = speed_probe(texts, enc)
    assert enc.calls == [(8, 8), (2 * PROBE_BATCH, PROBE_BATCH)]  # a warm-up batch, then the two batches
    picks = probe_batches([10 + i for i in range(300)])
    ref = DENSE_S[0] * len(picks) + DENSE_S[1] * sum(10 + i for i in picks)
    assert got == {
        "documents": 2 * PROBE_BATCH,
        "seconds": 3.0,
        "scale": float(f"{3.0 / ref:.4g}"),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
    with pytest.raises(ValueError, match="at least one document"):
        speed_probe([], _Encoder())


def test_the_line_says_what_scaled_it():
    probed = estimate_line({"store": 300.0}, 2.0, probe=128)
    assert probed.startswith("[estimate] about 5 min left (store 5 min)")  # the times are given scaled
    assert "x 2, as a probe of 128 documents ran on the bi-encoder" in probed
    assert probed.endswith("refined after the dense stage")
    assert "in an earlier run" in estimate_line({"store": 300.0}, 2.0, earlier=True, probe=128)
    assert "refined" not in estimate_line({"store": 300.0}, 2.0) and "probe" not in estimate_line(
        {"s": 1}, 2.0
    )


def test_a_resumed_train_stage_is_estimated_from_the_steps_its_saved_state_has_left(tmp_path):
    """A train stage stopped part-way resumes from its saved state (rankers.training): the estimate counts only the
    steps after it, and says where it resumes."""
    from aheadrank.rankers.training import state_file

    from aheadrank.build import paths

    trained = dataclasses.replace(SCIFACT, steps=360)
    resumed = dataclasses.replace(trained, steps_done=149)
    saved = reference_seconds(trained)["train"] - reference_seconds(resumed)["train"]
    assert saved == pytest.approx(149 * 2.6)
    assert reference_seconds(dataclasses.replace(trained, steps_done=360))["train"] == pytest.approx(
        KIND_COST["mores"]["start"]
    )
    coll = tmp_path / "c.jsonl"
    coll.write_text('{"id": "d1", "contents": "a b c"}\n')
    plan = BuildPlan(str(coll), str(tmp_path / "o"), labels="none", steps=200)
    info = {"documents": 100, "mean_words": 55.0}
    assert workload(plan, info).steps_done == 0  # nothing saved
    state = state_file(paths(plan.out)["checkpoint"])
    state.parent.mkdir(parents=True)
    state.write_bytes(b"not a state")  # unreadable: the estimate does not count on it (training refuses it)
    assert workload(plan, info).steps_done == 0
    torch.save({"step": 149, "model": {"w": torch.zeros(3)}}, state)
    assert workload(plan, info).steps_done == 149
    torch.save({"step": 900}, state)  # never more than the plan's steps
    assert workload(plan, info).steps_done == 200
    line = estimate_line({"train": 600.0}, None, resumed=(149, 360))
    assert line.startswith("[estimate] about 10 min left (train 10 min; train resumes at step 149 of 360)")
    assert "resumes" not in estimate_line(
        {"store": 600.0}, None, resumed=(149, 360)
    )  # the train stage is done


def test_the_store_estimate_follows_the_stored_sequences_their_length_and_the_dtype():
    """Short documents are stored at their length, long ones as their first window and passages of the window's
    length; the bytes scale with the value's size, with the allowance for unequal lengths."""
    short = Workload(documents=1000, mean_words=50, queries=0, steps=0, cost="tk", window=128, passages=True)
    assert store_bytes(short, 2.0) == pytest.approx(buildtime.STORE_BYTES_SLACK * 1000 * 50 * 1.36 * 2.0)
    assert stored_sequences(SCIFACT) > SCIFACT.documents  # passages: each window-long
    assert store_bytes(SCIFACT, 1.0) == pytest.approx(
        buildtime.STORE_BYTES_SLACK * stored_sequences(SCIFACT) * 128
    )
    # MORES 2xIB S2's four 384-wide fields in float16: SciFact's 5,183 abstracts with passages, about 9 GB
    mores = 4 * 384 * buildtime.VALUE_BYTES["float16"]
    assert 8e9 < store_bytes(SCIFACT, mores) < 10e9
    assert store_bytes(SCIFACT, 4 * 384 * buildtime.VALUE_BYTES["book4"]) == pytest.approx(
        store_bytes(SCIFACT, mores) / 4
    )
    assert [size(n) for n in (8.97e9, 4.2e8, 12_345, 7)] == ["8.97 GB", "420 MB", "12.3 kB", "7 B"]


@pytest.mark.parametrize("name", ["mores-2ib-s2", "mores-2ib-s1", "prettr-l2-e16", "tk-2l", "bert"])
def test_a_variants_stored_fields_are_known_before_any_weight_is_read(name, tiny_base):
    """What the estimate reads the store's size from: the fields a new ranker of the variant stores (its store
    strategy's: MORES S1 the states, S2 each block's keys and values)."""
    from aheadrank.rankers.variants import parse_variant

    variant = parse_variant(name)
    ranker = variant.init(base=tiny_base)
    ranker.strategy = variant.strategy or ranker.strategy
    assert variant.field_dims(tiny_base) == ranker.field_dims()
