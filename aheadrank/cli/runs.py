"""``aheadrank train``, ``pretrain-compressor`` and ``rerank-run``: batch jobs over a collection's queries."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import typer

from aheadrank.cli.app import app
from aheadrank.cli.options import (
    aggregation_opt,
    device_opt,
    opt,
    spec_block,
    user_errors,
    verify_store_opt,
    with_options,
)
from aheadrank.cli.rankers import RANKER_OPTIONS, Kind, init_options, ranker_options_block
from aheadrank.logs import cli_logging


def training_options_block() -> object:
    """Every training option (rankers/recipe.py ``training_options``: TrainConfig's fields and the recipe's
    stages), declared by its field; the command gets them as ``training`` (None: not given)."""
    from aheadrank.rankers.recipe import training_options

    return spec_block("training", training_options())


@app.command("train")
@user_errors
@with_options(RANKER_OPTIONS, training_options_block())
def train_cmd(
    ranker: Kind = opt(..., "--ranker", help="ranker kind"),  # type: ignore[valid-type]
    collection: Path = opt(..., "--collection", help="BEIR directory"),
    index: Path = opt(..., "--index", help="its BM25 Lucene index (negatives)"),
    out: Path = opt(..., "--out", help="checkpoint directory (best by validation)"),
    split: str | None = opt(
        None,
        "--split",
        help="the qrels split to train on (default: train where qrels/train.tsv judges at least 400 queries "
        "(AHEADRANK_MIN_JUDGED_QUERIES), else label-free; a split given must exist and is trained on however few "
        "it judges; never test)",
    ),
    init: Path | None = opt(None, "--init", help="start from this checkpoint"),
    base: Path | None = opt(None, "--base"),
    recipe: str = opt(
        "auto",
        "--recipe",
        help="the measured training recipe that fills the training options it measured when not given "
        "(rankers/recipe.py; each option's help names its values): cpu or gpu; auto: gpu on cuda, else cpu",
    ),
    teacher: Path | None = opt(
        None,
        "--teacher",
        envvar="AHEADRANK_TEACHER_CHECKPOINT",  # build's AHEADRANK_TEACHER names the label-free teacher
        help="bert checkpoint to distil (--distill-weight)",
    ),
    dense_store: Path | None = opt(
        None,
        "--dense-store",
        help="the collection's dense field (a store's dense/ folder, from `aheadrank index`): the listwise "
        "teacher's (default: built into OUT.dense/ when the listwise weight is > 0)",
    ),
    device: str = device_opt(),
    progress: bool = opt(True, "--progress/--no-progress"),
    overwrite: bool = opt(
        False,
        "--overwrite",
        help="replace a checkpoint already at --out (one this command left, with its OUT.train-state.pt beside it, "
        "is resumed instead)",
    ),
    *,
    ranker_options: dict,
    training: dict,
) -> None:
    """Train a ranker on a collection: 1 relevant + n BM25 negatives per group, best checkpoint kept; the
    options the measured recipe sets (--recipe) come from it when not given. A collection without
    qrels/<split>.tsv is label-free: the ranker starts from the base model (PreTTR's compressor and TK's kernel
    weights fitted to the collection), is validated on pseudo-queries cut from its own texts, with the
    equal-weight BM25 + bi-encoder fusion as the listwise teacher, and fine-tuned on them only with --steps N
    (`aheadrank build` does this and everything around it in one command)."""
    from dataclasses import asdict

    from aheadrank.build import auto_labels_note, judged_split
    from aheadrank.errors import AheadrankError
    from aheadrank.rankers import init_ranker, load_config, load_ranker
    from aheadrank.rankers.checkpoint import check_replaceable
    from aheadrank.rankers.recipe import check_training_options, recipe_for, resolve_training, train_recipe
    from aheadrank.rankers.training import TrainConfig, state_file
    from aheadrank.runs import build_pseudo_training_data, build_training_data

    cli_logging(logging.INFO)
    rec = recipe_for(device, recipe)
    check_training_options(training)  # before anything is read
    # before anything is read: a checkpoint already at --out is this command's to resume, or replaced only if asked
    check_replaceable(out, overwrite or state_file(out).is_file())
    judged = judged_split(
        collection, split or "auto", "--split"
    )  # as build's --labels: never test, nor a typo
    label_free = judged is None
    if label_free and split is None and (note := auto_labels_note(collection, "auto", "--split")) is not None:
        logging.getLogger("aheadrank.train").warning("%s", note)
    split = judged or "train"
    seed = TrainConfig.seed if training["seed"] is None else training["seed"]
    if init is not None:
        kind = load_config(init).kind
        if ranker.value != kind:
            raise AheadrankError(
                f"--ranker {ranker.value}, but --init {init} is a {kind} checkpoint: give --ranker {kind}"
            )
        model = load_ranker(init, device=device)
    else:
        options = rec.init_options(init_options(ranker.value, ranker_options), label_free=label_free)
        model = init_ranker(ranker.value, base=base, seed=seed, **options).to(device)
    resolved = resolve_training(
        rec, model.kind, training, ranker=asdict(model.config), fresh=init is None, label_free=label_free
    )
    cfg = resolved.train
    log = logging.getLogger("aheadrank.train")
    if label_free:  # no judgments: pseudo-queries cut from the collection (aheadrank/build.py, label-free)
        from aheadrank.runs import build_label_free_training_data

        data, lf_hits, lf_queries = build_label_free_training_data(collection, index, seed=seed)
        log.info(
            "no qrels/%s.tsv in %s: label-free training on %d pseudo-queries %s",
            split, collection, len(data.queries), lf_queries.counts(),
        )  # fmt: skip
    else:
        data = build_training_data(collection, split, index)
    pseudo = build_pseudo_training_data(collection, index, seed=seed) if resolved.pseudo_steps > 0 else None
    log.info(
        "recipe %s: %s, compressor %s + %d steps",
        rec.name, cfg, resolved.compressor_init, resolved.compressor_steps,
    )  # fmt: skip
    if cfg.listwise_weight > 0:
        from aheadrank.baselines import fusion_teacher
        from aheadrank.rankers.dense import base_of
        from aheadrank.rankers.training import split_queries

        model_base = base_of(model.config)
        if dense_store is None:
            from aheadrank.indexer.build import ensure_dense_field

            dense_store = out.parent / f"{out.name}.dense"
            if ensure_dense_field(collection, dense_store, model_base, device, progress) is not None:
                log.info("built the dense field of %s into %s", collection, dense_store)
        if label_free:
            from aheadrank.baselines import EQUAL_FUSION, label_free_teacher

            data.teacher = label_free_teacher(
                dense_store,
                data.queries,
                lf_hits,
                lf_queries.aliases,
                data.qrels,
                base=model_base,
                device=device,
            )
            weights = EQUAL_FUSION
        else:
            _, val_q = split_queries(data, cfg.val_queries, cfg.seed)
            data.teacher, weights = fusion_teacher(dense_store, index, data, val_q, base=model_base)
        log.info("listwise teacher: BM25 + bi-encoder fusion %s", weights)
    teacher_model = load_ranker(teacher, device=device) if teacher else None
    result = train_recipe(
        model,
        data,
        out,
        cfg,
        compressor_steps=resolved.compressor_steps,
        compressor_init=resolved.compressor_init,
        teacher=teacher_model,
        progress=progress,
        pseudo=pseudo,
        pseudo_steps=resolved.pseudo_steps,
        fit_kernels=resolved.fit_kernels,
        fit_head=resolved.fit_head,
    ).result
    typer.echo(
        json.dumps(
            {
                "out": str(out),
                "steps": result.steps,
                "best_val_ndcg10": result.best_metric if result.validated else None,
                "best_step": result.best_step,
                "seconds": round(result.seconds, 1),
            }
        )
    )


@app.command("pretrain-compressor")
@user_errors
@with_options(ranker_options_block("layer", "compress", "max_query_len", "max_doc_len"))
def pretrain_compressor_cmd(
    collection: Path = opt(..., "--collection", help="BEIR directory"),
    index: Path = opt(..., "--index", help="its BM25 Lucene index (pairs)"),
    out: Path = opt(..., "--out", help="PreTTR checkpoint directory to write"),
    split: str = opt("train", "--split", help="queries whose BM25 pairs are used"),
    init: Path | None = opt(
        None, "--init", help="a PreTTR checkpoint to start from (else a fresh one, of --layer and --compress)"
    ),
    base: Path | None = opt(None, "--base"),
    steps: int = opt(
        200,
        "--steps",
        min=0,
        envvar="AHEADRANK_COMPRESSOR_STEPS",
        help="compressor steps (train's --compressor-steps)",
    ),
    lr: float = opt(1e-3, "--lr"),
    batch: int = opt(16, "--batch", min=1, help="(query, document) pairs per step"),
    seed: int = opt(0, "--seed"),
    device: str = device_opt(),
    overwrite: bool = opt(False, "--overwrite"),
    progress: bool = opt(True, "--progress/--no-progress"),
    *,
    ranker_options: dict,
) -> None:
    """PreTTR: train only the compressor on the collection's (query, BM25 candidate) pairs with the
    attention-MSE loss (and, with the similarity residual, refit its pooled map); then ``train --ranker prettr
    --init OUT`` fine-tunes the whole ranker."""

    from aheadrank.errors import AheadrankError
    from aheadrank.rankers import init_ranker, load_ranker
    from aheadrank.rankers.checkpoint import check_replaceable
    from aheadrank.rankers.recipe import train_recipe
    from aheadrank.rankers.training import TrainConfig, loss_ends
    from aheadrank.runs import build_training_data

    cli_logging(logging.INFO)
    if not (math.isfinite(lr) and lr >= 0):
        raise AheadrankError(f"--lr must be a finite number, 0 or more, got {lr}")
    if not (out.is_dir() and not any(out.iterdir())):  # an empty folder is free; the rest before the training
        check_replaceable(out, overwrite)
    if init is not None:
        model = load_ranker(init, device=device)
        if model.kind != "prettr" or not model.config.compress:
            raise AheadrankError(
                f"--init {init} is a {model.kind} checkpoint without a compressor; give a PreTTR one"
            )
    else:
        if ranker_options["compress"] == 0:  # not given: PreTTR's default compressor
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
    checkpoint: Path = opt(..., "--checkpoint"),
    store: Path = opt(..., "--store"),
    queries: Path = opt(..., "--queries", help="queries.jsonl, TSV or BEIR dir"),
    out: Path = opt(..., "--out", help="TREC run file to write"),
    index: Path | None = opt(None, "--index", help="BM25 index (candidates)"),
    candidates: Path | None = opt(
        None, "--candidates", help="first-stage TREC run to re-rank instead of BM25"
    ),
    depth: int = opt(100, "--depth", min=1),
    split: str | None = opt(
        None,
        "--split",
        help="with a BEIR dir: only the queries judged in qrels/<split>.tsv",
    ),
    device: str = device_opt(),
    tag: str = opt("aheadrank", "--tag"),
    pure: bool = opt(
        False,
        "--pure/--with-priors",
        help="rank by the neural score alone (default: the served score, neural + the checkpoint's priors)",
    ),
    passage_aggregation: str | None = aggregation_opt(
        "what the checkpoint's priors were fitted with (a label-free build's: maxp; a judged one's: first+max)"
    ),
    verify_store: str = verify_store_opt(),
) -> None:
    """Re-rank BM25 top-depth (or a given first-stage run) through the stored representations; scores are
    the served ones (the neural score combined with the checkpoint's priors: BM25, dense and, where the store
    has sentence windows, the window prior) unless --pure."""
    from aheadrank.errors import AheadrankError
    from aheadrank.evaluation import write_run
    from aheadrank.indexer.topics import read_beir_split, read_queries
    from aheadrank.runs import bm25_candidates, read_first_stage, rerank_run

    qs = read_beir_split(queries, split)[0] if split else read_queries(queries)
    if candidates is not None:
        cands = read_first_stage(candidates, depth)
        if not set(qs) & set(cands):  # before the model loads: an empty run is never the answer
            raise AheadrankError(
                f"--candidates {candidates} ranks none of the {len(qs):,} queries of --queries (its "
                f"{len(cands):,} query ids are others): a run of other queries, or another queries file?"
            )
    elif index is not None:
        cands = bm25_candidates(index, qs, depth)
    else:
        raise AheadrankError("give --index (BM25 candidates) or --candidates (a first-stage run)")
    run, stats = rerank_run(
        checkpoint,
        store,
        qs,
        cands,
        device=device,
        pure=pure,
        passage_aggregation=passage_aggregation,
        verify_store=verify_store,
    )
    if stats.candidates and stats.unknown == stats.candidates:
        raise AheadrankError(
            f"none of the {stats.candidates:,} candidates is in the store {store}: the candidates and the store are "
            "of different collections? (no run written)"
        )
    if stats.unknown:
        typer.echo(
            f"warning: {stats.unknown:,} of {stats.candidates:,} candidates are not in the store {store}: ranked "
            "below the scored ones, in their first-stage order",
            err=True,
        )
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
                "verified": stats.verified,
                "seconds": {k: round(v, 2) for k, v in stats.seconds.items()},
            }
        )
    )


@app.command("fit-priors")
@user_errors
def fit_priors_cmd(
    checkpoint: Path = opt(..., "--checkpoint"),
    store: Path = opt(..., "--store", help="its store (with the dense field)"),
    collection: Path = opt(..., "--collection", help="BEIR directory"),
    index: Path = opt(..., "--index", help="its BM25 index (candidates)"),
    split: str = opt(
        "train",
        "--split",
        help="qrels split of the validation queries (never the test split)",
    ),
    all_queries: bool = opt(
        False,
        "--all-queries",
        help="use every query of --split (e.g. a dev split); default: the queries the trainer held out",
    ),
    depth: int = opt(100, "--depth", min=1, help="BM25 candidates per query"),
    device: str = device_opt(),
    progress: bool = opt(True, "--progress/--no-progress"),
    verify_store: str = verify_store_opt(),
    passage_aggregation: str | None = aggregation_opt(
        "how the checkpoint's current priors were fitted (a label-free build's: maxp), else first+max; recorded "
        "in the new priors, which the service and rerank-run then read"
    ),
    replace_weights: bool = opt(
        False,
        "--replace-weights",
        help="a label-free build: take the weights fitted on the judged queries even where 5-fold cross-validation "
        "on them does not show them better than the build's default weights (which are otherwise kept; the "
        "calibration is fitted either way)",
    ),
) -> None:
    """Fit how the neural score is combined with the BM25 and dense priors (weights per available feature
    set, nDCG@10 on validation queries) and save them into the checkpoint as priors.json. On a label-free
    build the default weights stay unless the fitted ones beat them out of sample (--replace-weights: not)."""
    from aheadrank.errors import AheadrankError
    from aheadrank.indexer.topics import read_beir_split
    from aheadrank.priors import read_priors, recorded_aggregation
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
        if not queries:
            raise AheadrankError(
                f"none of the {len(held_out):,} queries {checkpoint} held out is judged in qrels/{split}.tsv (a "
                f"label-free build holds out pseudo-queries, e.g. {held_out[0]!r}): give --all-queries to fit on "
                f"every judged query of --split {split}"
            )
    cands = bm25_candidates(index, queries, depth)
    aggregation = recorded_aggregation(passage_aggregation, checkpoint, with_priors=False)  # it refits them
    current = read_priors(checkpoint)
    keep = None if replace_weights or current is None else current.defaults()
    priors = fit_checkpoint_priors(
        checkpoint,
        store,
        queries,
        cands,
        qrels,
        {"collection": str(collection), "split": split, "depth": depth, "held_out": not all_queries},
        device=device,
        progress=progress,
        verify_store=verify_store,
        aggregation=aggregation,
        keep=keep,
    )
    typer.echo(json.dumps({"checkpoint": str(checkpoint), **priors.to_dict()}))
