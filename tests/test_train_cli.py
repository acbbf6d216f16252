"""``aheadrank pretrain-compressor`` then ``aheadrank train --init``: the PreTTR recipe from the command line."""

from __future__ import annotations

import json

import torch
from aheadrank.rankers import load_ranker
from aheadrank.rankers.recipe import RECIPES
from typer.testing import CliRunner

from aheadrank.cli import app

runner = CliRunner()


def invoke(*args: str):
    return runner.invoke(app, list(args))


def data_args(env) -> list[str]:
    """The sample collection and its BM25 index, as both commands take them."""
    return ["--collection", str(env.collection), "--index", str(env.lucene), "--no-progress"]


def test_pretrain_compressor_then_train_from_it(service_env, tiny_base, tmp_path):
    common = data_args(service_env)
    comp = tmp_path / "comp"
    result = invoke(
        "pretrain-compressor", *common, "--out", str(comp), "--base", str(tiny_base),
        "--layer", "2", "--compress", "8", "--max-doc-len", "32", "--steps", "30", "--lr", "1e-2", "--batch", "8",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loss_last"] < 0.8 * report["loss_first"], report  # eq. 2 falls
    pre = load_ranker(comp)
    assert pre.kind == "prettr" and pre.config.compress == 8
    assert pre.config.extra["compressor"]["steps"] == 30

    again = invoke(
        "pretrain-compressor", *common, "--out", str(comp), "--compress", "8", "--base", str(tiny_base)
    )
    assert again.exit_code == 2 and "--overwrite" in again.output  # nothing is replaced silently

    tuned = tmp_path / "tuned"
    result = invoke(
        "train", "--ranker", "prettr", "--init", str(comp), *common, "--out", str(tuned),
        "--steps", "2", "--group-size", "3", "--queries-per-step", "2", "--eval-every", "2", "--val-queries", "4",
        "--lr", "0", "--cpu-amp",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    fine = load_ranker(tuned)
    assert fine.config.extra["train"]["cpu_amp"] is True
    # lr 0: the weights stay where training started, so they are exactly the pre-trained checkpoint's
    assert fine.config.compress == 8 and fine.config.layer == 2
    pre_state = pre.state_dict()
    assert all(torch.equal(p, pre_state[n]) for n, p in fine.state_dict().items())


def test_pretrain_compressor_without_compress_pretrains_prettrs_default(service_env, tmp_path):
    """No --compress and no --init: a fresh PreTTR of the kind's default compressor (it was refused as e = 0)."""
    from aheadrank.rankers.variants import default_variant

    out = tmp_path / "comp"  # on the packaged base: the default's 128 dims need its 384-wide states
    result = invoke(
        "pretrain-compressor", *data_args(service_env), "--out", str(out),
        "--layer", "5", "--max-doc-len", "16", "--steps", "1", "--batch", "2",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert load_ranker(out).config.compress == default_variant("prettr").options["compress"] > 0


def test_pretrain_compressor_refuses_what_has_no_compressor(service_env, tiny_base, tmp_path):
    common = data_args(service_env)
    result = invoke("pretrain-compressor", *common, "--out", str(tmp_path / "a"), "--compress", "0")
    assert result.exit_code == 2 and "--compress E > 0" in result.output
    result = invoke(
        "pretrain-compressor", *common, "--out", str(tmp_path / "b"), "--init", str(service_env.checkpoint)
    )
    assert result.exit_code == 2 and "mores" in result.output and "PreTTR" in result.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_listwise_distillation_from_the_fusion_then_fit_priors(service_env, tiny_base, tmp_path):
    """`train --listwise-weight` with the BM25 + bi-encoder teacher, then `index` (with the dense field) and
    `fit-priors` on the queries the trainer held out: the recipe a user runs on their own collection."""
    from aheadrank.indexer.build import BuildOptions, build_dense

    common = data_args(service_env)
    dense_host = tmp_path / "dense-host"  # any store directory: the dense field lands in dense-host/dense
    build_dense(
        BuildOptions(
            str(service_env.checkpoint), str(service_env.collection), str(dense_host), progress=False
        )
    )
    out = tmp_path / "tk"
    train = [
        "train", "--ranker", "tk", "--base", str(tiny_base), *common, "--out", str(out), "--layers", "1",
        "--steps", "2", "--group-size", "3", "--queries-per-step", "2", "--eval-every", "2", "--val-queries", "6",
    ]  # fmt: skip
    for bad, said in (
        (["--recipe", "tpu"], "unknown recipe 'tpu'"),
        (["--compressor-init", "svd"], "not 'svd'"),
    ):
        refused = invoke(*train, *bad)
        assert refused.exit_code == 2 and said in refused.output, refused.output
        assert not out.exists() and not (tmp_path / "tk.dense").exists()  # refused before anything is written
    result = invoke(*train)  # the CPU recipe: listwise KL from the fusion, its dense field built beside OUT
    assert result.exit_code == 0, result.output
    extra = load_ranker(out).config.extra["train"]
    assert extra["listwise_weight"] == 1.0 and len(extra["val_qids"]) == 6
    cpu = RECIPES["cpu"]
    assert (extra["lr"], extra["cpu_amp"], extra["val_depth"]) == (cpu.lr_tk, cpu.cpu_amp, cpu.val_depth)
    assert (tmp_path / "tk.dense" / "manifest.json").is_file()
    given = [
        "--dense-store",
        str(dense_host / "dense"),
        "--lr",
        "1e-5",
        "--no-cpu-amp",
        "--out",
        str(tmp_path / "k"),
    ]
    result = invoke(*train, *given)  # what is given wins over the recipe
    assert result.exit_code == 0, result.output
    extra = load_ranker(tmp_path / "k").config.extra["train"]
    assert (extra["lr"], extra["cpu_amp"], extra["listwise_weight"]) == (1e-5, False, 1.0)

    store = tmp_path / "store"
    result = invoke(
        "index", "--checkpoint", str(out), "--collection", str(service_env.collection), "--store", str(store),
        "--dense-from", str(dense_host / "dense"), "--no-progress",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "dense field copied" in result.output
    test_split = invoke(
        "fit-priors", "--checkpoint", str(out), "--store", str(store), *common, "--split", "test"
    )
    assert test_split.exit_code == 2 and "test split" in test_split.output
    result = invoke("fit-priors", "--checkpoint", str(out), "--store", str(store), *common)
    assert result.exit_code == 0, result.output
    priors = load_ranker(out).priors
    assert priors["fitted_on"]["held_out"] and priors["fitted_on"]["queries"] <= 6
    assert set(priors["weights"]) == {"neural", "neural+bm25", "neural+dense", "neural+bm25+dense"}


def test_train_with_title_pseudo_queries_first_and_fitted_kernels(service_env, tiny_base, tmp_path):
    """`train --pseudo-steps N`: N steps on the collection's titles as queries, then the judged queries; the
    stage is its own resumable checkpoint (OUT.pseudo) and the final checkpoint records it. `--fit-kernels`:
    TK's kernel weights start from a ridge fit, recorded in the checkpoint."""
    common = data_args(service_env)
    out = tmp_path / "tk"
    args = [
        "train", "--ranker", "tk", "--base", str(tiny_base), *common, "--out", str(out), "--layers", "1",
        "--steps", "2", "--group-size", "3", "--queries-per-step", "2", "--eval-every", "2", "--val-queries", "4",
        "--listwise-weight", "0", "--fit-kernels", "--pseudo-steps", "3",
    ]  # fmt: skip
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    stage = load_ranker(tmp_path / "tk.pseudo").config.extra["train"]
    assert stage["steps"] == 3 and stage["val_queries"] == 0 and stage["val_ndcg10"] is None
    record = load_ranker(out).config.extra["pseudo"]
    sample_titles = sum(
        1 for line in (service_env.collection / "corpus.jsonl").open() if '"title": "' in line
    )
    assert record["steps"] == 3 and 0 < record["queries"] <= sample_titles
    assert load_ranker(out).config.extra["kernel_fit"]["pairs"] > 0
    refused = invoke(*args[:-1], "-1")
    assert refused.exit_code == 2 and "pseudo_steps must be 0 or more" in refused.output


def test_train_refuses_the_wrong_judgments_and_a_checkpoint_it_did_not_write(
    service_env, tiny_base, tmp_path
):
    """`train` refuses, in one line and before anything is written: the test split; a split qrels/ does not hold
    (a typo trained label-free before); judgements none of whose documents is in the collection; --ranker other
    than --init's kind (ignored before); an --out holding a checkpoint this command did not leave (replaced
    before, a build's trained weights and priors with it) unless --overwrite. Compressed qrels are read."""
    import gzip
    import shutil

    common = data_args(service_env)
    args = [
        "train", "--ranker", "tk", "--base", str(tiny_base), *common, "--layers", "1", "--steps", "1",
        "--group-size", "3", "--queries-per-step", "2", "--eval-every", "1", "--val-queries", "4",
        "--listwise-weight", "0",
    ]  # fmt: skip
    out = tmp_path / "tk"
    for more, said in (
        (["--split", "test"], "refusing to train on the test split"),
        (["--split", "trian"], "has no qrels/trian.tsv (its qrels/ holds: test, train)"),
    ):
        result = invoke(*args, "--out", str(out), *more)
        assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output, (
            result.output
        )
        assert f"error: {more[0]} {more[1]}: " in result.output  # the flag given, not build's --labels
    result = invoke(
        "train", "--ranker", "bert", "--init", str(service_env.checkpoint), *common, "--out", str(out)
    )
    assert result.exit_code == 2 and "is a mores checkpoint: give --ranker mores" in result.output
    assert not out.exists()

    mine = tmp_path / "mine"
    shutil.copytree(service_env.checkpoint, mine)
    weights = (mine / "model.safetensors").read_bytes()
    result = invoke(*args, "--out", str(mine))
    assert result.exit_code == 2 and "already exists (pass --overwrite" in result.output
    assert (mine / "model.safetensors").read_bytes() == weights

    beir = (
        tmp_path / "beir"
    )  # the sample with its judgements compressed, then with judgements of another corpus
    (beir / "qrels").mkdir(parents=True)
    for name in ("corpus.jsonl", "queries.jsonl"):
        shutil.copy(service_env.collection / name, beir / name)
    judged = (service_env.collection / "qrels" / "train.tsv").read_bytes()
    (beir / "qrels" / "train.tsv.gz").write_bytes(gzip.compress(judged))
    result = invoke(*[a if a != str(service_env.collection) else str(beir) for a in args], "--out", str(out))
    assert result.exit_code == 0, result.output
    assert "label-free" not in result.output and load_ranker(out).config.extra["train"]["val_qids"]
    (beir / "qrels" / "train.tsv.gz").unlink()
    (beir / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n12\tNODOC1\t1\n15\tNODOC2\t1\n")
    result = invoke(
        *[a if a != str(service_env.collection) else str(beir) for a in args], "--out", str(tmp_path / "o")
    )
    assert (
        result.exit_code == 2 and "none of the 2 documents qrels/train.tsv judges relevant" in result.output
    )
