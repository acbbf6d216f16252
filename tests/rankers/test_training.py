"""The trainer really learns, resumes where it stopped, and PreTTR's compressor pre-training lowers eq. 2."""

from __future__ import annotations

import random

import pytest
import torch
from aheadrank.rankers import init_ranker, load_ranker
from aheadrank.rankers.training import (
    TrainConfig,
    TrainingData,
    pretrain_compressor,
    rerank_queries,
    state_file,
    train,
)

TOPICS = [
    "insulin glucose",
    "tumour gene",
    "vaccine immune",
    "heart pressure",
    "sleep memory",
    "kidney liver",
    "smoking lung",
    "virus infection",
    "obesity diet",
    "neuron brain",
    "receptor binding",
    "dose therapy",
]
FILLER = "the of and in a to is was for with that by on as are from at an be this which".split()


def planted_data(seed: int = 0) -> TrainingData:
    """Each query's relevant document repeats the query's words; negatives are other topics' documents."""
    rng = random.Random(seed)
    texts, queries, qrels, candidates = {}, {}, {}, {}
    for i, topic in enumerate(TOPICS * 3):
        qid = f"q{i}"
        queries[qid] = f"{topic} {rng.choice(FILLER)}"
        rel = f"d{i}-rel"
        texts[rel] = " ".join([*topic.split(), *rng.sample(FILLER, 6), *topic.split()])
        qrels[qid] = {rel: 1}
        negs = []
        for j in range(12):
            other = TOPICS[(TOPICS.index(topic) + 1 + j % (len(TOPICS) - 1)) % len(TOPICS)]
            neg = f"d{i}-neg{j}"
            texts[neg] = " ".join([*other.split(), *rng.sample(FILLER, 8)])
            negs.append(neg)
        cands = [*negs[:5], rel, *negs[5:]]  # "BM25" put the relevant document at rank 6
        candidates[qid] = cands
    return TrainingData(texts, queries, qrels, candidates)


def mean_rank_of_relevant(ranker, data: TrainingData) -> float:
    run = rerank_queries(ranker, data, sorted(data.queries), depth=20)
    ranks = []
    for qid, scores in run.items():
        order = sorted(scores, key=scores.get, reverse=True)
        ranks.append(order.index(next(iter(data.qrels[qid]))) + 1)
    return sum(ranks) / len(ranks)


@pytest.mark.parametrize(
    ("kind", "opts", "lr", "goal"), [("tk", {"tk_heads": 4}, 1e-2, 2.0), ("mores", {"ibs": 1}, 2e-3, 3.0)]
)
def test_trainer_learns_planted_relevance(tiny_base, tmp_path, kind, opts, lr, goal):
    data = planted_data()
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=32, **opts)
    before = mean_rank_of_relevant(ranker, data)
    cfg = TrainConfig(steps=80, group_size=4, queries_per_step=4, lr=lr, eval_every=40, val_queries=6, seed=1)
    result = train(ranker, data, tmp_path / "ckpt", cfg, progress=False)
    losses = [h["loss"] for h in result.history]
    assert sum(losses[-10:]) / 10 < 0.8 * sum(losses[:10]) / 10, losses  # loss falls
    after = mean_rank_of_relevant(ranker, data)
    assert after < goal < before, (before, after)  # relevant documents move to the top
    best = load_ranker(tmp_path / "ckpt")  # the best checkpoint was kept, with its training config
    assert best.config.extra["train"]["best_step"] == result.best_step
    assert best.config.extra["train"]["val_ndcg10"] == result.best_metric


def test_cpu_amp_trains_in_bfloat16_and_keeps_float32_weights(tiny_base, tmp_path, monkeypatch):
    import aheadrank.rankers.training as training

    monkeypatch.setattr(training, "cpu_bf16_native", lambda: True)  # as on a CPU with bfloat16 in hardware
    data = planted_data()
    ranker = init_ranker("mores", base=tiny_base, ibs=1, max_doc_len=32)
    before = mean_rank_of_relevant(ranker, data)
    seen: set[torch.dtype] = set()
    linear = next(m for m in ranker.modules() if isinstance(m, torch.nn.Linear))
    linear.register_forward_hook(lambda _m, _i, out: seen.add(out.dtype))
    cfg = TrainConfig(
        steps=80,
        group_size=4,
        queries_per_step=4,
        lr=2e-3,
        eval_every=40,
        val_queries=6,
        seed=1,
        cpu_amp=True,
    )
    result = train(ranker, data, tmp_path / "ckpt", cfg, progress=False)
    assert torch.bfloat16 in seen  # the training forward ran under bfloat16 autocast ...
    assert torch.float32 in seen  # ... and validation in float32
    assert all(p.dtype == torch.float32 for p in ranker.parameters())
    losses = [h["loss"] for h in result.history]
    assert sum(losses[-10:]) / 10 < 0.8 * sum(losses[:10]) / 10, losses
    assert mean_rank_of_relevant(ranker, data) < 3.0 < before


def test_resumed_run_continues_where_it_stopped(tiny_base, tmp_path):
    data = planted_data(1)
    cfg = TrainConfig(steps=8, group_size=3, queries_per_step=2, lr=1e-3, eval_every=4, val_queries=4, seed=3)
    straight = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)
    train(straight, data, tmp_path / "a", cfg, progress=False)

    stopped = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)
    first = train(stopped, data, tmp_path / "b", cfg, progress=False, stop_after=5)  # then the process "dies"
    assert first.steps == 5
    resumed = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)  # a fresh process
    res = train(resumed, data, tmp_path / "b", cfg, progress=False)
    assert res.steps == 8 and [h["step"] for h in res.history] == list(range(1, 9))
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def test_a_run_killed_between_validations_resumes_from_its_last_timed_save(
    tiny_base, tmp_path, monkeypatch, caplog
):
    import aheadrank.rankers.training as training

    data = planted_data(2)
    cfg = TrainConfig(steps=8, group_size=3, queries_per_step=2, lr=1e-3, eval_every=8, val_queries=4, seed=5)
    straight = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)
    train(straight, data, tmp_path / "a", cfg, progress=False)

    monkeypatch.setattr(training, "SAVE_EVERY_S", 0.0)  # a slow machine: every step is past the interval
    monkeypatch.setattr(training, "LOG_EVERY_S", 0.0)
    sample, calls = training.sample_group, []

    def killed_in_step_6(*args):
        calls.append(1)
        if len(calls) > 5 * cfg.queries_per_step:
            raise KeyboardInterrupt  # the process dies in step 6, before any validation but step 0's
        return sample(*args)

    monkeypatch.setattr(training, "sample_group", killed_in_step_6)
    stopped = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)
    with caplog.at_level("INFO", logger="aheadrank.train"), pytest.raises(KeyboardInterrupt):
        train(stopped, data, tmp_path / "b", cfg, progress=False)
    said = [r.getMessage() for r in caplog.records if "s a step so far" in r.getMessage()]
    assert [m.split(" loss")[0] for m in said] == [f"step {i}/8" for i in range(1, 6)], said
    assert torch.load(state_file(tmp_path / "b"), weights_only=False)["step"] == 5
    monkeypatch.setattr(training, "sample_group", sample)
    # killed again while writing the state of step 6: the torn bytes are the temp file's, the state stays step 5
    save = torch.save

    def torn(obj, fh, *args, **kw):
        fh.write(b"torn")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", torn)
    with pytest.raises(KeyboardInterrupt):
        train(
            init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32),
            data,
            tmp_path / "b",
            cfg,
            progress=False,
        )
    monkeypatch.setattr(torch, "save", save)
    assert torch.load(state_file(tmp_path / "b"), weights_only=False)["step"] == 5
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left
    resumed = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)  # a fresh process
    res = train(resumed, data, tmp_path / "b", cfg, progress=False)
    assert res.steps == 8 and [h["step"] for h in res.history] == list(range(1, 9))
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


@pytest.mark.parametrize("legacy", [False, True])
def test_resuming_another_rankers_state_is_refused(tiny_base, tmp_path, legacy):
    """A stopped run's state is never loaded into a ranker of another shape (a build whose kind now resolves to
    another variant): the state names the ranker it was written for; one written before it did (``legacy``) is
    checked by its parameters."""
    data = planted_data(1)
    cfg = TrainConfig(steps=8, group_size=3, queries_per_step=2, lr=1e-3, eval_every=4, val_queries=4, seed=3)
    stopped = init_ranker("tk", base=tiny_base, tk_heads=4, tk_layers=2, max_doc_len=32)
    train(stopped, data, tmp_path / "b", cfg, progress=False, stop_after=3)
    path = state_file(tmp_path / "b")
    if legacy:
        state = torch.load(path, weights_only=False)
        del state["ranker"]
        torch.save(state, path)
    saved = path.read_bytes()
    other = init_ranker("tk", base=tiny_base, tk_heads=4, tk_layers=1, max_doc_len=32)
    with pytest.raises(ValueError, match="written for another ranker"):
        train(other, data, tmp_path / "b", cfg, progress=False)
    assert path.read_bytes() == saved  # nothing lost: the stopped run still resumes with its own ranker
    same = init_ranker("tk", base=tiny_base, tk_heads=4, tk_layers=2, max_doc_len=32)
    assert train(same, data, tmp_path / "b", cfg, progress=False).steps == 8


def test_pretrain_compressor_lowers_attention_mse(tiny_base):
    data = planted_data(2)
    ranker = init_ranker("prettr", base=tiny_base, layer=2, compress=8, max_doc_len=32)
    losses = pretrain_compressor(ranker, data, steps=60, lr=1e-2, batch=8, progress=False)
    assert sum(losses[-5:]) / 5 < 0.7 * sum(losses[:5]) / 5, losses
    assert all(p.requires_grad for p in ranker.parameters())  # frozen layers are given back


def test_freeze_embeddings_keeps_the_tables_and_trains_the_rest(tiny_base, tmp_path):
    data = planted_data(3)
    ranker = init_ranker("mores", base=tiny_base, ibs=1, max_doc_len=32)
    before = {n: p.detach().clone() for n, p in ranker.named_parameters()}
    cfg = TrainConfig(
        steps=3,
        group_size=3,
        queries_per_step=2,
        lr=1e-3,
        eval_every=3,
        val_queries=4,
        freeze_embeddings=True,
    )
    train(ranker, data, tmp_path / "ckpt", cfg, progress=False)
    frozen = [n for n in before if "embeddings" in n]
    assert frozen and all(torch.equal(before[n], dict(ranker.named_parameters())[n]) for n in frozen)
    moved = [
        n for n, p in ranker.named_parameters() if "embeddings" not in n and not torch.equal(before[n], p)
    ]
    assert len(moved) > len(before) // 2
    assert all(p.requires_grad for p in ranker.parameters())


def test_initial_weights_are_kept_when_no_step_beats_them(tiny_base, tmp_path):
    data = planted_data(4)
    ranker = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)
    cfg = TrainConfig(steps=4, group_size=3, queries_per_step=2, lr=0.0, eval_every=2, val_queries=6)
    result = train(ranker, data, tmp_path / "ckpt", cfg, progress=False)  # lr 0: no step can be better
    assert result.best_step == 0
    kept = load_ranker(tmp_path / "ckpt")
    assert kept.config.extra["train"]["best_step"] == 0
    assert kept.config.extra["train"]["val_ndcg10"] == result.best_metric


def test_listwise_kl_is_zero_at_the_teacher_and_positive_elsewhere():
    from aheadrank.rankers.training import listwise_kl

    teacher = torch.tensor([[3.0, 1.0, 0.0, -1.0], [0.5, 0.2, 0.1, 0.0]])
    assert listwise_kl(teacher.clone(), teacher).item() == pytest.approx(0.0, abs=1e-6)
    assert listwise_kl(teacher / 2, teacher, temperature=2.0).item() == pytest.approx(0.0, abs=1e-6)
    assert listwise_kl(teacher.flip(-1), teacher).item() > 0.1


def test_listwise_distillation_alone_teaches_the_teachers_order(tiny_base, tmp_path):
    """No labels used (ce_weight 0): a teacher that puts the planted relevant document first is learned."""
    data = planted_data()
    data.teacher = {
        q: {d: (5.0 if d in data.qrels[q] else -float(i)) for i, d in enumerate(c)}
        for q, c in data.candidates.items()
    }
    ranker = init_ranker("tk", base=tiny_base, max_doc_len=32, tk_heads=4)
    before = mean_rank_of_relevant(ranker, data)
    cfg = TrainConfig(
        steps=80, group_size=4, queries_per_step=4, lr=1e-2, eval_every=80, val_queries=6, seed=1,
        ce_weight=0.0, listwise_weight=1.0,
    )  # fmt: skip
    train(ranker, data, tmp_path / "ckpt", cfg, progress=False)
    after = mean_rank_of_relevant(ranker, data)
    assert after < 2.0 < before, (before, after)
    with pytest.raises(ValueError, match="teacher"):
        bare = planted_data()
        train(ranker, bare, tmp_path / "other", cfg, progress=False)


def test_doc_len_cuts_training_documents_and_the_checkpoint_reads_its_full_length(tiny_base, tmp_path):
    """TrainConfig.doc_len: every document the steps and validation see has at most doc_len pieces; the ranker
    reads its own max_doc_len again afterwards, and so does the checkpoint."""
    import aheadrank.rankers.training as training

    data = planted_data(4)
    ranker = init_ranker("bert", base=tiny_base, max_doc_len=32)
    seen: list[int] = []
    real = training.group_scores

    def spy(r, queries, groups, texts):
        seen.append(r._text().max_doc_len)
        return real(r, queries, groups, texts)

    cfg = TrainConfig(
        steps=2, group_size=3, queries_per_step=2, lr=1e-3, eval_every=2, val_queries=4, doc_len=5
    )
    training.group_scores = spy
    try:
        train(ranker, data, tmp_path / "ckpt", cfg, progress=False)
    finally:
        training.group_scores = real
    assert seen and set(seen) == {5}
    assert ranker._text().max_doc_len == 32
    assert load_ranker(tmp_path / "ckpt")._text().max_doc_len == 32
    # the documents really are cut: a 20-word document becomes 5 pieces + [SEP] while training
    with training.doc_len_limited(ranker, 5):
        assert len(ranker.tokenize_documents([" ".join(FILLER)])[0]) == 6
    assert len(ranker.tokenize_documents([" ".join(FILLER)])[0]) > 6


@pytest.mark.parametrize(
    ("kind", "opts"), [("tk", {"tk_base": True, "tk_layers": 1}), ("tk", {"tk_heads": 4}), ("bert", {})]
)
def test_fresh_lr_trains_the_fresh_parameters_at_their_own_rate(tiny_base, tmp_path, kind, opts):
    """lr 0 with fresh_lr > 0: exactly the parameters that start from scratch move (TK's kernel weights and
    mix, plus its layers when they are not the base's; bert's head), the base's weights stay."""
    data = planted_data(5)
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=32, **opts)
    fresh = set(ranker.fresh_parameter_names())
    expected = {"dense_log", "dense_len", "dense_comb", "mixer"} if kind == "tk" else {"head"}
    if kind == "tk" and not opts.get("tk_base"):
        expected.add("layers")
    assert {n.split(".")[0] for n in fresh} == expected
    before = {n: p.detach().clone() for n, p in ranker.named_parameters()}
    cfg = TrainConfig(
        steps=3, group_size=3, queries_per_step=2, lr=0.0, fresh_lr=1e-2, eval_every=3, val_queries=0,
        validate_initial=False, warmup=0.0,
    )  # fmt: skip
    train(ranker, data, tmp_path / "ckpt", cfg, progress=False)
    after = dict(ranker.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and moved <= fresh, moved - fresh
    assert {n.split(".")[0] for n in moved} == expected


def test_pseudo_stage_trains_first_and_is_recorded(tiny_base, tmp_path):
    from aheadrank.rankers.recipe import train_recipe

    pseudo, data = planted_data(5), planted_data(6)
    ranker = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)
    start = {n: p.detach().clone() for n, p in ranker.state_dict().items()}
    cfg = TrainConfig(steps=4, group_size=3, queries_per_step=2, lr=1e-2, eval_every=2, val_queries=4, seed=2)
    out = tmp_path / "ckpt"
    # no fine-tuning: what is saved is the model as the pseudo stage left it
    train_recipe(ranker, data, out, cfg, progress=False, fine_tune=False, pseudo=pseudo, pseudo_steps=6)
    stage = load_ranker(tmp_path / "ckpt.pseudo")
    saved = load_ranker(out)
    assert stage.config.extra["train"]["steps"] == 6
    assert stage.config.extra["train"]["listwise_weight"] == 0.0  # titles have no teacher scores
    assert saved.config.extra["pseudo"]["steps"] == 6 and saved.config.extra["pseudo"]["queries"] == 36
    moved = [n for n, p in saved.state_dict().items() if not torch.equal(p, start[n])]
    assert moved  # the pseudo stage trained the model ...
    for n, p in saved.state_dict().items():  # ... and the fine-tuning starts from exactly where it ended
        assert torch.equal(p, stage.state_dict()[n]), n

    with pytest.raises(Exception, match="pseudo_steps must be 0 or more"):
        train_recipe(ranker, data, out, cfg, progress=False, pseudo=pseudo, pseudo_steps=-1)


def test_spread_negatives_draw_documents_near_many_queries_less():
    from aheadrank.rankers.training import candidate_counts, sample_group

    texts = {"hub": "x"} | {f"d{q}-{j}": "x" for q in range(50) for j in range(10)}
    queries = {f"q{q}": "x" for q in range(50)}
    qrels = {f"q{q}": {f"d{q}-0": 1} for q in range(50)}
    candidates = {
        f"q{q}": ["hub", *(f"d{q}-{j}" for j in range(10))] for q in range(50)
    }  # hub: near every query
    data = TrainingData(texts, queries, qrels, candidates)
    counts = candidate_counts(data, sorted(queries), depth=100)
    assert counts["hub"] == 50 and counts["d3-4"] == 1

    def hub_share(counts):
        rng = random.Random(0)
        groups = [sample_group(data, f"q{i % 50}", 4, 100, rng, counts) for i in range(2000)]
        assert all(
            len(set(g)) == 4 and g[0] == f"q{i % 50}".replace("q", "d") + "-0" for i, g in enumerate(groups)
        )
        return sum("hub" in g for g in groups) / len(groups)

    uniform, spread = hub_share(None), hub_share(counts)
    assert 0.25 < uniform < 0.42  # 3 of 10 negatives: 0.3
    assert spread < uniform / 5  # weight 1/50 against 1


def test_unknown_negative_sampling_is_refused(tiny_base, tmp_path):
    ranker = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)
    cfg = TrainConfig(steps=1, group_size=3, queries_per_step=2, val_queries=0, negatives="hardest")
    with pytest.raises(ValueError, match="not 'hardest'"):
        train(ranker, planted_data(), tmp_path / "x", cfg, progress=False)
    assert not (tmp_path / "x").exists()


def test_kernel_weights_fitted_to_the_judgments_rank_the_planted_relevant_first(tiny_base, tmp_path):
    from aheadrank.rankers.recipe import kernel_fit_lists, train_recipe

    data = planted_data(7)
    ranker = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)
    layers = {n: p.detach().clone() for n, p in ranker.state_dict().items() if not n.startswith("dense")}
    before = mean_rank_of_relevant(ranker, data)
    cfg = TrainConfig(steps=0, val_queries=6, seed=1)
    lists = kernel_fit_lists(data, cfg)
    assert len(lists) == len(data.queries) - 6  # the held-out queries are not fitted on
    assert all(t == [float(d.endswith("-rel")) for d in data.candidates[q][:30]] for (_, _, t), q in
               zip(lists, sorted(set(data.queries) - set(split_val(data, cfg))), strict=True))  # fmt: skip
    trained = train_recipe(
        ranker, data, tmp_path / "tk", cfg, progress=False, fine_tune=False, fit_kernels=True
    )
    assert trained.kernel_fit["r2"] > 0.2 and trained.kernel_fit["queries"] == len(lists)
    after = mean_rank_of_relevant(ranker, data)
    assert after < 1.5 < before, (before, after)  # exact matches of the query's words, found by the fit alone
    assert all(torch.equal(p, layers[n]) for n, p in ranker.state_dict().items() if n in layers)
    assert load_ranker(tmp_path / "tk").config.extra["kernel_fit"] == trained.kernel_fit


def split_val(data, cfg):
    from aheadrank.rankers.training import split_queries

    return split_queries(data, cfg.val_queries, cfg.seed)[1]


def test_recipe_fits_tk_kernels_by_default_only_for_tk_from_the_base(tiny_base):
    import dataclasses

    from aheadrank.rankers.recipe import RECIPES

    cpu = RECIPES["cpu"]
    base_tk = init_ranker("tk", base=tiny_base, tk_layers=1, tk_base=True, max_doc_len=32)
    scratch_tk = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)
    mores = init_ranker("mores", base=tiny_base, ibs=1, max_doc_len=32)
    fits = [cpu.fits_kernels(m.kind, m.config.tk_base) for m in (base_tk, scratch_tk, mores)]
    assert fits == [True, False, False]
    assert not dataclasses.replace(cpu, fit_kernels=False).fits_kernels("tk", True)
    assert not dataclasses.replace(cpu, fit_kernels=True).fits_kernels("mores", None)


@pytest.mark.parametrize(
    ("kind", "opts"),
    [("mores", {"ibs": 1, "sim": True}), ("prettr", {"layer": 3, "compress": 16}), ("bert", {})],
)
def test_score_head_fitted_to_the_judgments_raises_the_planted_relevant(tiny_base, tmp_path, kind, opts):
    """The head (and the residual's α) alone, in closed form: the planted relevant document moves up, nothing
    below the head changes, the record travels with the checkpoint."""
    from aheadrank.rankers.fit import head_features
    from aheadrank.rankers.recipe import kernel_fit_lists, train_recipe
    from aheadrank.rankers.text import pad

    data = planted_data(7)
    ranker = init_ranker(kind, base=tiny_base, max_doc_len=32, **opts)
    cfg = TrainConfig(steps=0, val_queries=6, seed=1)
    if kind == "prettr":  # its pooled map first, as train_recipe fits it (the residual's cosine reads it)
        ranker.fit_pool_map(list(data.texts.values())[:40])
    below = {
        n: p.detach().clone() for n, p in ranker.state_dict().items() if not n.startswith(("head", "sim"))
    }
    before = mean_rank_of_relevant(ranker, data)
    trained = train_recipe(ranker, data, tmp_path / kind, cfg, progress=False, fine_tune=False, fit_head=True)
    fit = trained.head_fit
    assert fit["queries"] == len(kernel_fit_lists(data, cfg)) and fit["r2"] > 0.05
    assert ("alpha" in fit) == bool(ranker.config.sim)
    after = mean_rank_of_relevant(ranker, data)
    assert after < 0.7 * before, (before, after)  # a 32-wide random base: a clear move, not the top
    assert all(torch.equal(p, below[n]) for n, p in ranker.state_dict().items() if n in below)
    # the features are what the score is linear in: the fitted score is head · h + α · cos
    ranker.eval()
    q_ids, q_mask = pad(ranker.tokenize_queries(["alpha beta"] * 3), ranker.device)
    d_ids, d_mask = pad(ranker.tokenize_documents(list(data.texts.values())[:3]), ranker.device)
    x = head_features(ranker, q_ids, q_mask, d_ids, d_mask)
    w = [*ranker.head.weight[0].tolist(), *([float(ranker.sim.scale.detach())] if ranker.config.sim else [])]
    with torch.no_grad():
        score = ranker.forward_pairs(q_ids, q_mask, d_ids, d_mask)
    assert torch.allclose(x @ torch.tensor(w) + ranker.head.bias, score, atol=1e-4)
    assert load_ranker(tmp_path / kind).config.extra["head_fit"] == fit


def test_prettr_start_is_drawn_from_the_documents_not_their_copies(tiny_base, tmp_path, monkeypatch):
    """PreTTR's compressor PCA and pooled map are fitted on the collection's documents: a label-free build's copies
    of its pseudo-queries' sources (``TrainingData.copies``) would draw those documents twice."""
    from aheadrank.rankers.prettr import PrettrRanker
    from aheadrank.rankers.recipe import train_recipe

    data = planted_data(4)
    copies = {f"pq:{d}": t for d, t in list(data.texts.items())[:30]}
    data.texts.update(copies)
    data.copies = frozenset(copies)
    seen: dict[str, list[str]] = {}
    pca, pool = PrettrRanker.init_compressor_pca, PrettrRanker.fit_pool_map
    monkeypatch.setattr(
        PrettrRanker,
        "init_compressor_pca",
        lambda self, t, **k: seen.setdefault("pca", t) and pca(self, t, **k),
    )
    monkeypatch.setattr(
        PrettrRanker, "fit_pool_map", lambda self, t, **k: seen.setdefault("pool", t) and pool(self, t, **k)
    )
    ranker = init_ranker("prettr", base=tiny_base, layer=2, compress=8, sim=True, max_doc_len=32)
    cfg = TrainConfig(steps=0, val_queries=6, seed=1)
    train_recipe(ranker, data, tmp_path / "p", cfg, progress=False, fine_tune=False, compressor_init="pca")
    originals = [t for d, t in data.texts.items() if d not in copies]
    assert sorted(seen["pool"]) == sorted(originals)  # every document once (fewer than POOL_DOCS)
    assert len(seen["pca"]) == len(set(seen["pca"])) and set(seen["pca"]) <= set(originals)


def test_a_loss_that_is_not_a_number_stops_training_and_keeps_the_best_checkpoint(
    tiny_base, tmp_path, monkeypatch
):
    """A step whose loss is NaN or infinite (here: scores made NaN) stops the run with one error naming the step,
    before the optimiser applies it; the checkpoint at --out stays the best one before it (the initial weights).
    A validation whose scores are not finite never counts as an improvement."""
    from aheadrank.rankers import training

    from aheadrank.errors import TrainingError

    ranker = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)
    before = {k: v.clone() for k, v in ranker.state_dict().items()}
    real = training.group_scores
    monkeypatch.setattr(training, "group_scores", lambda *a, **k: real(*a, **k) * float("nan"))
    cfg = TrainConfig(steps=3, group_size=3, queries_per_step=2, lr=1e-3, eval_every=1, val_queries=6)
    with pytest.raises(TrainingError, match=r"step 1: the loss is nan .* stays at .*ckpt \(step 0\)"):
        train(ranker, planted_data(), tmp_path / "ckpt", cfg, progress=False)
    kept = load_ranker(tmp_path / "ckpt")
    assert kept.config.extra["train"]["best_step"] == 0
    assert all(torch.equal(v, before[k]) for k, v in kept.state_dict().items())
    assert training.validation_metric({"q": {"a": float("nan"), "b": 1.0}}, {"q": {"b": 1}}) == float("-inf")


def test_training_needs_a_negative_within_the_negative_depth(tiny_base, tmp_path):
    """--neg-depth 1 where every query's first candidate is its relevant document: one error that says why (an
    IndexError from sampling before)."""
    from aheadrank.errors import TrainingError

    data = planted_data()
    data.candidates = {q: [next(iter(data.qrels[q])), *c] for q, c in data.candidates.items()}
    ranker = init_ranker("tk", base=tiny_base, tk_heads=4, max_doc_len=32)
    cfg = TrainConfig(steps=1, group_size=3, queries_per_step=2, val_queries=0, neg_depth=1)
    with pytest.raises(TrainingError, match="among its first 1 candidates"):
        train(ranker, data, tmp_path / "x", cfg, progress=False)
