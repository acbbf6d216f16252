"""One source of training defaults: rankers/recipe.py ``resolve_training`` gives what `aheadrank train`,
`aheadrank build` and bench/effectiveness.py used to merge each on their own, a flag given wins, and every
training option has its flag in the CLI and the bench.

The tables below are the values the three merges produced before they were replaced (captured at commit
21d6da2 from the old CLI through a mocked ``train_recipe``, the old bench's ``train_config`` and the old
build's ``recipe.train_config``); they are the recipes of docs/training.md."""

from __future__ import annotations

import sys
from dataclasses import asdict, fields
from pathlib import Path

import pytest
from aheadrank.rankers.recipe import (
    LABEL_FREE_DOC_LEN,
    RECIPES,
    STAGE_OPTIONS,
    StageOptions,
    resolve_training,
)
from aheadrank.rankers.training import TrainConfig
from typer.testing import CliRunner

from aheadrank.cli import app

REPO = Path(__file__).resolve().parents[2]

# TrainConfig's own defaults: no recipe sets them
TRAINER = {
    "amp": True,
    "ce_weight": 1.0,
    "distill_weight": 0.0,
    "freeze_embeddings": False,
    "grad_accum": 1,
    "listwise_temperature": 1.0,
    "max_grad_norm": 1.0,
    "neg_depth": 100,
    "negatives": "uniform",
    "seed": 0,
    "validate_initial": True,
    "warmup": 0.1,
    "weight_decay": 0.01,
}
# what each recipe sets (lr: every kind but TK, which starts its layers and kernels from scratch)
RECIPE = {
    "cpu": {
        "steps": 360, "group_size": 8, "queries_per_step": 8, "lr": 1e-4, "eval_every": 120, "val_queries": 100,
        "val_depth": 20, "listwise_weight": 1.0, "cpu_amp": True, "doc_len": None, "fresh_lr": None,
    },
    "gpu": {
        "steps": 240, "group_size": 16, "queries_per_step": 16, "lr": 6e-5, "eval_every": 60, "val_queries": 100,
        "val_depth": 50, "listwise_weight": 1.0, "cpu_amp": False, "doc_len": None, "fresh_lr": None,
    },
}  # fmt: skip
TK_LR = 5e-4
# TK contextualised by the base's layers (tk_base), since the tables were captured: those layers at a small rate,
# its kernel weights and mix at a large one (ablation rows 18-19)
TK_BASE_RATES = {"lr": 2e-5, "fresh_lr": 1e-3}
MAX_DOC_LEN = {"cpu": 128, "gpu": 256}
# (recipe, kind, its options) -> (compressor_steps, compressor_init, pseudo_steps, fit_kernels)
STAGES = {
    ("cpu", "bert", ()): (0, "random", 0, False),
    ("cpu", "mores", ()): (0, "random", 0, False),
    ("cpu", "prettr", (("compress", 128),)): (0, "pca", 0, False),
    ("cpu", "prettr", (("compress", 0),)): (0, "random", 0, False),
    ("cpu", "tk", (("tk_base", False),)): (0, "random", 0, False),
    ("cpu", "tk", (("tk_base", True),)): (0, "random", 0, True),
    ("gpu", "bert", ()): (0, "random", 0, False),
    ("gpu", "mores", ()): (0, "random", 0, False),
    ("gpu", "prettr", (("compress", 128),)): (150, "random", 0, False),
    ("gpu", "tk", (("tk_base", True),)): (0, "random", 0, True),
}


def expected(recipe: str, kind: str, label_free: bool = False, options=(), **given) -> dict:
    """The TrainConfig a recipe gives a ranker of ``kind`` with ``options`` (pairs or a dict), ``given`` winning."""
    lr = (TK_BASE_RATES if dict(options).get("tk_base") else {"lr": TK_LR}) if kind == "tk" else {}
    # without judgments a build does not fine-tune unless told to (LABEL_FREE_STEPS)
    negatives = {"negatives": "spread", "steps": 0} if label_free else {}
    return {**TRAINER, **RECIPE[recipe], **lr, **negatives, **given}


@pytest.mark.parametrize(("recipe", "kind", "options"), list(STAGES))
@pytest.mark.parametrize("label_free", [False, True])
def test_the_recipe_resolves_what_the_old_merges_gave(recipe, kind, options, label_free):
    r = resolve_training(RECIPES[recipe], kind, {}, ranker=dict(options), label_free=label_free)
    assert asdict(r.train) == expected(recipe, kind, label_free, options)
    assert (r.compressor_steps, r.compressor_init, r.pseudo_steps, r.fit_kernels) == STAGES[
        recipe, kind, options
    ]
    assert RECIPES[recipe].init_options({"max_doc_len": None}) == {"max_doc_len": MAX_DOC_LEN[recipe]}
    # without judgments every recipe reads the window chosen label-free (Cranfield); a given length still wins
    assert (
        RECIPES[recipe].init_options(label_free=True)
        == {"max_doc_len": LABEL_FREE_DOC_LEN}
        == {"max_doc_len": 128}
    )
    assert RECIPES[recipe].init_options({"max_doc_len": 64}, label_free=True) == {"max_doc_len": 64}


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_a_label_free_build_trains_only_when_told(recipe):
    rec = RECIPES[recipe]
    assert resolve_training(rec, "mores", {}, label_free=True).train.steps == 0
    assert resolve_training(rec, "mores", {"steps": 36}, label_free=True).train.steps == 36
    # judged queries: the recipe's budget
    assert resolve_training(rec, "mores", {}).train.steps == rec.steps > 0


def test_given_options_win_and_bad_ones_are_refused():
    from aheadrank.errors import AheadrankError

    given = {"lr": 1e-5, "steps": 7, "cpu_amp": False, "doc_len": 64, "negatives": "spread", "seed": None}
    r = resolve_training(RECIPES["cpu"], "tk", given)
    assert asdict(r.train) == expected(
        "cpu", "tk", lr=1e-5, steps=7, cpu_amp=False, doc_len=64, negatives="spread"
    )
    assert (
        resolve_training(RECIPES["cpu"], "bert", {"eval_every": 0, "steps": 7}).train.eval_every == 7
    )  # at the end
    # a compressor's options apply to a ranker that has one; a checkpoint given as the start keeps its compressor
    prettr = {"compress": 128}
    assert resolve_training(RECIPES["cpu"], "mores", {"compressor_steps": 5}).compressor_steps == 0
    assert resolve_training(RECIPES["gpu"], "prettr", {}, ranker=prettr, fresh=False).compressor_steps == 0
    assert (
        resolve_training(RECIPES["gpu"], "prettr", {"compressor_steps": 5}, ranker=prettr).compressor_steps
        == 5
    )
    for bad, said in (
        ({"compressor_init": "svd"}, "not 'svd'"),
        ({"negatives": "hardest"}, "not 'hardest'"),
        ({"group_size": 0}, "group_size must be 2 or more"),
        ({"pseudo_steps": -1}, "pseudo_steps must be 0 or more"),
        ({"learning_rate": 1}, "unknown training options"),
    ):
        with pytest.raises(AheadrankError, match=said):
            resolve_training(RECIPES["cpu"], "bert", bad)


@pytest.mark.parametrize("recipe", list(RECIPES))
def test_tk_from_the_base_trains_its_layers_slowly_and_its_kernels_fast(recipe):
    """The base's layers at lr_tk_base, the kernels and mix at fresh_lr_tk_base; TK's layers from scratch keep
    lr_tk for all; a rate given wins."""
    rec = RECIPES[recipe]
    base = resolve_training(rec, "tk", {}, ranker={"tk_base": True, "tk_layers": 6}).train
    scratch = resolve_training(rec, "tk", {}, ranker={"tk_layers": 2}).train
    assert (base.lr, base.fresh_lr) == (rec.lr_tk_base, rec.fresh_lr_tk_base) == (2e-5, 1e-3)
    assert (scratch.lr, scratch.fresh_lr) == (rec.lr_tk, None)
    given = resolve_training(rec, "tk", {"lr": 1e-5, "fresh_lr": 5e-3}, ranker={"tk_base": True}).train
    assert (given.lr, given.fresh_lr) == (1e-5, 5e-3)
    assert resolve_training(rec, "mores", {}, ranker={"tk_base": True}).train.fresh_lr is None


def captured_train(monkeypatch, tmp_path, tiny_base, *flags: str) -> dict:
    """`aheadrank train` up to the training itself: the TrainConfig and stages it hands to train_recipe
    (the training data and the listwise teacher faked)."""
    import aheadrank.rankers.recipe as recipe
    from aheadrank.rankers.training import TrainingData

    import aheadrank.baselines
    import aheadrank.runs

    seen: dict = {}

    def train_recipe(model, data, out, cfg, **kw):
        seen.update(kind=model.kind, max_doc_len=model.config.max_doc_len, train=asdict(cfg), **kw)
        raise SystemExit(0)

    data = TrainingData({}, {}, {}, {})
    monkeypatch.setattr(recipe, "train_recipe", train_recipe)
    monkeypatch.setattr(aheadrank.runs, "build_training_data", lambda *a, **k: data)
    monkeypatch.setattr(aheadrank.baselines, "fusion_teacher", lambda *a, **k: ({}, {}))
    (tmp_path / "qrels").mkdir(exist_ok=True)
    (tmp_path / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    args = [
        "train",
        "--collection",
        str(tmp_path),
        "--index",
        str(tmp_path / "none"),
        "--out",
        str(tmp_path / "o"),
    ]
    args += ["--base", str(tiny_base), "--dense-store", str(tmp_path / "dense"), "--no-progress", *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0 and seen, result.output
    return seen


@pytest.mark.parametrize(
    ("recipe", "kind", "flags", "options"),
    [
        ("cpu", "mores", [], ()),
        ("cpu", "prettr", ["--layer", "2", "--compress", "8"], (("compress", 128),)),
        ("gpu", "prettr", ["--layer", "2", "--compress", "8"], (("compress", 128),)),
        (
            "cpu",
            "tk",
            ["--layers", "1", "--tk-base", "--tk-heads", "4", "--tk-ffn", "64"],
            (("tk_base", True),),
        ),
        ("gpu", "bert", [], ()),
    ],
)
def test_train_cli_trains_with_the_resolved_options(
    monkeypatch, tmp_path, tiny_base, minilm_dir, recipe, kind, flags, options
):
    base = (
        minilm_dir if recipe == "gpu" else tiny_base
    )  # the gpu recipe's 256 pieces need MiniLM's 512 positions
    seen = captured_train(monkeypatch, tmp_path, base, "--ranker", kind, "--recipe", recipe, *flags)
    assert seen["train"] == expected(recipe, kind, options=options)
    stages = (seen["compressor_steps"], seen["compressor_init"], seen["pseudo_steps"], seen["fit_kernels"])
    assert stages == STAGES[recipe, kind, options]
    assert seen["max_doc_len"] == MAX_DOC_LEN[recipe]  # the recipe's document length for a new ranker


def test_a_train_flag_overrides_the_recipe(monkeypatch, tmp_path, tiny_base):
    flags = ["--lr", "1e-5", "--no-cpu-amp", "--train-doc-len", "64", "--warmup", "0.2", "--no-fit-kernels"]
    seen = captured_train(
        monkeypatch, tmp_path, tiny_base, "--ranker", "tk", "--tk-base", "--layers", "1", *flags
    )
    assert seen["train"] == expected(
        "cpu", "tk", options={"tk_base": True}, lr=1e-5, cpu_amp=False, doc_len=64, warmup=0.2
    )
    assert seen["fit_kernels"] is False
    monkeypatch.setenv("AHEADRANK_STEPS", "9")  # every flag mirrored by its environment variable
    seen = captured_train(monkeypatch, tmp_path, tiny_base, "--ranker", "bert", "--max-doc-len", "32")
    assert seen["train"]["steps"] == 9 and seen["max_doc_len"] == 32


def test_every_training_option_has_a_flag_in_the_cli_and_the_bench():
    import typer.main

    train = typer.main.get_command(app).commands["train"]
    names = {p.name for p in train.params}
    options = [f.name for f in fields(TrainConfig)] + [f.name for f in fields(StageOptions)]
    assert set(options) <= names, set(options) - names
    flags = {o for p in train.params for o in p.opts + p.secondary_opts}
    assert {
        "--train-doc-len",
        "--freeze-embeddings",
        "--train-embeddings",
        "--cpu-amp",
        "--no-cpu-amp",
    } <= flags

    sys.path.insert(0, str(REPO / "bench"))
    import effectiveness

    parser_dests = set(vars(effectiveness.parse_args(["--quick"])))
    assert set(options) - {"pseudo_steps"} <= parser_dests  # the bench runs no pseudo-query stage
    assert set(STAGE_OPTIONS) - {"pseudo_steps"} <= parser_dests


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize(
    ("variant", "options"),
    [
        ("bert", ()),
        ("mores-2ib-s2", ()),
        ("prettr-l5-e128", (("compress", 128),)),
        ("tk-2l-base", (("tk_base", True),)),
    ],
)
def test_bench_effectiveness_trains_with_the_resolved_options(device, variant, options):
    sys.path.insert(0, str(REPO / "bench"))
    import effectiveness

    recipe = "gpu" if device == "cuda" else "cpu"
    args = effectiveness.parse_args(["--device", device])
    r = effectiveness.resolved_training(args, effectiveness.parse_variant(variant))
    kind = variant.split("-")[0]
    assert asdict(r.train) == expected(recipe, kind, options=options)
    assert (r.compressor_steps, r.compressor_init, r.pseudo_steps, r.fit_kernels) == STAGES[
        recipe, kind, options
    ]
    assert args.max_doc_len == MAX_DOC_LEN[recipe]
    # --quick: its small budget below what is given, the recipe below it; bert (the teacher) is not distilled
    quick = effectiveness.parse_args(
        ["--device", device, "--quick", "--steps", "5", "--distill-weight", "0.5"]
    )
    q = effectiveness.resolved_training(quick, effectiveness.parse_variant(variant))
    small = {
        "steps": 5,
        "queries_per_step": 2,
        "group_size": 4,
        "eval_every": 5,
        "val_queries": 4,
        "val_depth": 50,
    }
    distill = {"distill_weight": 0.0 if kind == "bert" else 0.5}
    assert asdict(q.train) == expected(
        recipe, kind, options=options, listwise_weight=0.0, cpu_amp=False, **small, **distill
    )
    assert quick.max_doc_len == 128 and quick.max_queries == 20
    lr = effectiveness.parse_args(
        ["--device", device, "--lr", "1e-5", "--lr-tk", "2e-5", "--fresh-lr-mores", "1e-3"]
    )
    assert effectiveness.resolved_training(lr, "tk").train.lr == 2e-5
    assert effectiveness.resolved_training(lr, "mores").train.fresh_lr == 1e-3
    assert effectiveness.resolved_training(lr, "bert").train.lr == 1e-5


def test_the_build_help_quotes_the_recipe_s_rates_for_tk_from_the_base():
    """``aheadrank build --help`` names the two rates as literals (deriving them would import torch into the CLI):
    they must be the recipe's."""
    import re

    import typer.main
    from aheadrank.rankers.recipe import recipe_for

    from aheadrank.cli import app

    build = typer.main.get_command(app).commands["build"]
    helps = {p.name: p.help for p in build.params if p.name in ("lr", "fresh_lr")}
    quoted = {
        name: float(re.search(r"([0-9.]+e-?[0-9]+) for TK from the base", text).group(1))
        for name, text in helps.items()
    }
    for name in ("cpu", "gpu"):
        rec = recipe_for(name)
        assert quoted == {"lr": rec.lr_tk_base, "fresh_lr": rec.fresh_lr_tk_base}
