"""``aheadrank train``, ``pretrain-compressor`` and ``rerank-run``: batch jobs over a collection's queries."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer

from aheadrank.cli.app import app
from aheadrank.cli.options import env, user_errors, with_options
from aheadrank.cli.rankers import RANKER_OPTIONS, Kind, init_options, ranker_options_block


@app.command("train")
@user_errors
@with_options(RANKER_OPTIONS)
def train_cmd(
    ranker: Kind = typer.Option(..., "--ranker", envvar=env("ranker"), help="ranker kind"),
    collection: Path = typer.Option(..., "--collection", envvar=env("collection"), help="BEIR directory"),
    index: Path = typer.Option(..., "--index", envvar=env("index"), help="its BM25 Lucene index (negatives)"),
    out: Path = typer.Option(
        ..., "--out", envvar=env("out"), help="checkpoint directory (best by validation)"
    ),
    split: str = typer.Option("train", "--split", envvar=env("split")),
    init: Path | None = typer.Option(None, "--init", envvar=env("init"), help="start from this checkpoint"),
    base: Path | None = typer.Option(None, "--base", envvar=env("base")),
    steps: int = typer.Option(1000, "--steps", envvar=env("steps")),
    group_size: int = typer.Option(8, "--group-size", envvar=env("group-size")),
    queries_per_step: int = typer.Option(8, "--queries-per-step", envvar=env("queries-per-step")),
    grad_accum: int = typer.Option(1, "--grad-accum", envvar=env("grad-accum")),
    lr: float = typer.Option(3e-5, "--lr", envvar=env("lr")),
    warmup: float = typer.Option(0.1, "--warmup", envvar=env("warmup")),
    eval_every: int = typer.Option(200, "--eval-every", envvar=env("eval-every")),
    val_queries: int = typer.Option(50, "--val-queries", envvar=env("val-queries")),
    seed: int = typer.Option(0, "--seed", envvar=env("seed")),
    teacher: Path | None = typer.Option(
        None, "--teacher", envvar=env("teacher"), help="bert checkpoint to distil"
    ),
    distill_weight: float = typer.Option(0.0, "--distill-weight", envvar=env("distill-weight")),
    listwise_weight: float = typer.Option(
        0.0,
        "--listwise-weight",
        envvar=env("listwise-weight"),
        help="> 0: add listwise KL distillation from the BM25 + bi-encoder fusion (needs --dense-store)",
    ),
    listwise_temperature: float = typer.Option(
        1.0, "--listwise-temperature", envvar=env("listwise-temperature")
    ),
    ce_weight: float = typer.Option(
        1.0, "--ce-weight", envvar=env("ce-weight"), help="weight of the cross-entropy on the judged positive"
    ),
    dense_store: Path | None = typer.Option(
        None,
        "--dense-store",
        envvar=env("dense-store"),
        help="the collection's dense field (a store's dense/ folder, from `aheadrank index`): the teacher's",
    ),
    device: str = typer.Option("cpu", "--device", envvar=env("device")),
    progress: bool = typer.Option(True, "--progress/--no-progress", envvar=env("progress")),
    freeze_embeddings: bool = typer.Option(
        False,
        "--freeze-embeddings/--train-embeddings",
        envvar=env("freeze-embeddings"),
        help="keep the embedding tables as initialised (less memorisation on small training sets)",
    ),
    cpu_amp: bool = typer.Option(
        False,
        "--cpu-amp/--no-cpu-amp",
        envvar=env("cpu-amp"),
        help="bfloat16 autocast on CPU (faster steps where the CPU has AVX512-BF16 or AMX)",
    ),
    compressor_steps: int = typer.Option(
        0,
        "--compressor-steps",
        envvar=env("compressor-steps"),
        help="PreTTR: attention-MSE pre-training steps before fine-tuning",
    ),
    *,
    ranker_options: dict,
) -> None:
    """Train a ranker on a BEIR collection: 1 relevant + n BM25 negatives per group, best checkpoint kept."""
    from aheadrank.rankers import init_ranker, load_ranker
    from aheadrank.rankers.recipe import train_recipe
    from aheadrank.rankers.training import TrainConfig
    from aheadrank.runs import build_training_data

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    data = build_training_data(collection, split, index)
    if init is not None:
        model = load_ranker(init, device=device)
    else:
        model = init_ranker(
            ranker.value, base=base, seed=seed, **init_options(ranker.value, ranker_options)
        ).to(device)
    cfg = TrainConfig(
        steps=steps,
        group_size=group_size,
        queries_per_step=queries_per_step,
        grad_accum=grad_accum,
        lr=lr,
        warmup=warmup,
        eval_every=eval_every,
        val_queries=val_queries,
        seed=seed,
        distill_weight=distill_weight,
        listwise_weight=listwise_weight,
        listwise_temperature=listwise_temperature,
        ce_weight=ce_weight,
        freeze_embeddings=freeze_embeddings,
        cpu_amp=cpu_amp,
    )
    if listwise_weight > 0:
        from aheadrank.baselines import fusion_teacher
        from aheadrank.errors import AheadrankError
        from aheadrank.rankers.training import split_queries

        if dense_store is None:
            raise AheadrankError("--listwise-weight needs --dense-store (the collection's dense field)")
        _, val_q = split_queries(data, cfg.val_queries, cfg.seed)
        from aheadrank.rankers.dense import base_of

        data.teacher, weights = fusion_teacher(dense_store, index, data, val_q, base=base_of(model.config))
        logging.getLogger("aheadrank.train").info("listwise teacher: BM25 + bi-encoder fusion %s", weights)
    teacher_model = load_ranker(teacher, device=device) if teacher else None
    result = train_recipe(
        model, data, out, cfg, compressor_steps=compressor_steps, teacher=teacher_model, progress=progress
    ).result
    typer.echo(
        json.dumps(
            {
                "out": str(out),
                "steps": result.steps,
                "best_val_ndcg10": result.best_metric,
                "best_step": result.best_step,
                "seconds": round(result.seconds, 1),
            }
        )
    )


@app.command("pretrain-compressor")
@user_errors
@with_options(ranker_options_block("layer", "compress", "max_query_len", "max_doc_len"))
def pretrain_compressor_cmd(
    collection: Path = typer.Option(..., "--collection", envvar=env("collection"), help="BEIR directory"),
    index: Path = typer.Option(..., "--index", envvar=env("index"), help="its BM25 Lucene index (pairs)"),
    out: Path = typer.Option(..., "--out", envvar=env("out"), help="PreTTR checkpoint directory to write"),
    split: str = typer.Option(
        "train", "--split", envvar=env("split"), help="queries whose BM25 pairs are used"
    ),
    init: Path | None = typer.Option(
        None, "--init", envvar=env("init"), help="a PreTTR checkpoint to start from (else a fresh one)"
    ),
    base: Path | None = typer.Option(None, "--base", envvar=env("base")),
    steps: int = typer.Option(200, "--steps", envvar=env("steps")),
    lr: float = typer.Option(1e-3, "--lr", envvar=env("lr")),
    batch: int = typer.Option(16, "--batch", envvar=env("batch"), help="(query, document) pairs per step"),
    seed: int = typer.Option(0, "--seed", envvar=env("seed")),
    device: str = typer.Option("cpu", "--device", envvar=env("device")),
    overwrite: bool = typer.Option(False, "--overwrite", envvar=env("overwrite")),
    progress: bool = typer.Option(True, "--progress/--no-progress", envvar=env("progress")),
    *,
    ranker_options: dict,
) -> None:
    """PreTTR: train only the compressor on the collection's (query, BM25 candidate) pairs with the
    attention-MSE loss; then ``train --ranker prettr --init OUT`` fine-tunes the whole ranker."""

    from aheadrank.errors import AheadrankError
    from aheadrank.rankers import init_ranker, load_ranker
    from aheadrank.rankers.recipe import train_recipe
    from aheadrank.rankers.training import TrainConfig, loss_ends
    from aheadrank.runs import build_training_data

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise AheadrankError(f"{out} exists and is not empty; pass --overwrite to replace it")
    if init is not None:
        model = load_ranker(init, device=device)
        if model.kind != "prettr" or not model.config.compress:
            raise AheadrankError(
                f"--init {init} is a {model.kind} checkpoint without a compressor; give a PreTTR one"
            )
    else:
        if not ranker_options["compress"]:
            raise AheadrankError("give --compress E > 0: PreTTR with e = 0 has no compressor to pre-train")
        model = init_ranker(
            "prettr",
            base=base,
            seed=seed,
            **init_options("prettr", ranker_options),
        ).to(device)
    data = build_training_data(collection, split, index)
    done = train_recipe(
        model,
        data,
        out,
        TrainConfig(seed=seed),
        compressor_steps=steps,
        compressor_lr=lr,
        compressor_batch=batch,
        progress=progress,
        fine_tune=False,
    )
    first, last = loss_ends(done.compressor_losses)
    seconds = done.compressor_seconds
    typer.echo(
        json.dumps(
            {
                "out": str(out),
                "steps": steps,
                "loss_first": first,
                "loss_last": last,
                "seconds": round(seconds, 1),
            }
        )
    )


@app.command("rerank-run")
@user_errors
def rerank_run_cmd(
    checkpoint: Path = typer.Option(..., "--checkpoint", envvar=env("checkpoint")),
    store: Path = typer.Option(..., "--store", envvar=env("store")),
    queries: Path = typer.Option(
        ..., "--queries", envvar=env("queries"), help="queries.jsonl, TSV or BEIR dir"
    ),
    out: Path = typer.Option(..., "--out", envvar=env("out"), help="TREC run file to write"),
    index: Path | None = typer.Option(None, "--index", envvar=env("index"), help="BM25 index (candidates)"),
    candidates: Path | None = typer.Option(
        None, "--candidates", envvar=env("candidates"), help="first-stage TREC run to re-rank instead of BM25"
    ),
    depth: int = typer.Option(100, "--depth", envvar=env("depth")),
    split: str | None = typer.Option(
        None,
        "--split",
        envvar=env("split"),
        help="with a BEIR dir: only the queries judged in qrels/<split>.tsv",
    ),
    device: str = typer.Option("cpu", "--device", envvar=env("device")),
    tag: str = typer.Option("aheadrank", "--tag", envvar=env("tag")),
    pure: bool = typer.Option(
        False,
        "--pure/--with-priors",
        envvar=env("pure"),
        help="rank by the neural score alone (default: the served score, neural + the checkpoint's priors)",
    ),
) -> None:
    """Re-rank BM25 top-depth (or a given first-stage run) through the stored representations; scores are
    the served ones (the neural score combined with the BM25 and dense priors fitted into the checkpoint)
    unless --pure."""
    from aheadrank.errors import AheadrankError
    from aheadrank.evaluation import write_run
    from aheadrank.indexer.topics import read_beir_split, read_queries
    from aheadrank.runs import bm25_candidates, read_first_stage, rerank_run

    qs = read_beir_split(queries, split)[0] if split else read_queries(queries)
    if candidates is not None:
        cands = read_first_stage(candidates, depth)
    elif index is not None:
        cands = bm25_candidates(index, qs, depth)
    else:
        raise AheadrankError("give --index (BM25 candidates) or --candidates (a first-stage run)")
    run, stats = rerank_run(checkpoint, store, qs, cands, device=device, pure=pure)
    write_run(out, run, tag)
    typer.echo(
        json.dumps(
            {
                "out": str(out),
                "pure": pure,
                "notices": stats.notices,
                "queries": stats.queries,
                "candidates": stats.candidates,
                "unknown_docids": stats.unknown,
                "seconds": {k: round(v, 2) for k, v in stats.seconds.items()},
            }
        )
    )


@app.command("fit-priors")
@user_errors
def fit_priors_cmd(
    checkpoint: Path = typer.Option(..., "--checkpoint", envvar=env("checkpoint")),
    store: Path = typer.Option(..., "--store", envvar=env("store"), help="its store (with the dense field)"),
    collection: Path = typer.Option(..., "--collection", envvar=env("collection"), help="BEIR directory"),
    index: Path = typer.Option(..., "--index", envvar=env("index"), help="its BM25 index (candidates)"),
    split: str = typer.Option(
        "train",
        "--split",
        envvar=env("split"),
        help="qrels split of the validation queries (never the test split)",
    ),
    all_queries: bool = typer.Option(
        False,
        "--all-queries",
        envvar=env("all-queries"),
        help="use every query of --split (e.g. a dev split); default: the queries the trainer held out",
    ),
    depth: int = typer.Option(100, "--depth", envvar=env("depth"), help="BM25 candidates per query"),
    device: str = typer.Option("cpu", "--device", envvar=env("device")),
    progress: bool = typer.Option(True, "--progress/--no-progress", envvar=env("progress")),
) -> None:
    """Fit how the neural score is combined with the BM25 and dense priors (weights per available feature
    set, nDCG@10 on validation queries) and save them into the checkpoint as priors.json."""
    from aheadrank.errors import AheadrankError
    from aheadrank.indexer.topics import read_beir_split
    from aheadrank.rankers import load_config
    from aheadrank.rerank import fit_checkpoint_priors
    from aheadrank.runs import bm25_candidates

    if split == "test":
        raise AheadrankError("refusing to fit the priors on the test split: use held-out training queries")
    queries, qrels = read_beir_split(collection, split)
    if not all_queries:
        held_out = load_config(checkpoint).extra.get("train", {}).get("val_qids")
        if not held_out:
            raise AheadrankError(
                f"{checkpoint} records no held-out validation queries (trained before they were recorded): "
                "give a split the ranker was not trained on with --split S --all-queries"
            )
        queries = {q: queries[q] for q in held_out if q in queries}
    cands = bm25_candidates(index, queries, depth)
    priors = fit_checkpoint_priors(
        checkpoint,
        store,
        queries,
        cands,
        qrels,
        {"collection": str(collection), "split": split, "depth": depth, "held_out": not all_queries},
        device=device,
        progress=progress,
    )
    typer.echo(json.dumps({"checkpoint": str(checkpoint), **priors.to_dict()}))
