"""``aheadrank build``: a collection to a served ranker in one resumable command (:mod:`aheadrank.build`)."""

from __future__ import annotations

import logging
import signal
from pathlib import Path

import typer

from aheadrank.cli.app import app
from aheadrank.cli.options import device_opt, opt, scheduler_opt, user_errors, workers_opt
from aheadrank.logs import cli_logging


@app.command("build")
@user_errors
def build_cmd(
    collection: Path = opt(..., "--collection", help="BEIR folder, JSONL or TSV (plain, .gz or .zst)"),
    out: Path = opt(..., "--out", help="the build directory (resumable: run the same command again)"),
    ranker: str = opt(
        "mores",
        "--ranker",
        help="mores | prettr | tk | bert, or a variant (mores-2ib-s2, prettr-l5-e128, tk-2l, ...); tk without "
        "judgments is tk-<L>l-base (contextualised by all L layers of the base: tk-6l-base), with them "
        "tk-<L>l-base-specials (the same, each text read between [CLS] and [SEP])",
    ),
    labels: str = opt(
        "auto",
        "--labels",
        help="auto: train on the collection's qrels/train.tsv where it judges at least 400 queries "
        "(AHEADRANK_MIN_JUDGED_QUERIES), else label-free; none: label-free (pseudo-queries cut from the collection); "
        "train, or another qrels split name: train on its judgments, however few",
    ),
    device: str = device_opt("cpu, cuda or cuda:N (the gpu recipe)"),
    recipe: str = opt(
        "auto", "--recipe", help="auto (gpu on cuda, else cpu), cpu or gpu (rankers/recipe.py)"
    ),
    steps: int | None = opt(
        None, "--steps", min=0, help="training steps (default: the recipe's with judged queries, 0 without)"
    ),
    max_queries: int = opt(
        3000, "--max-queries", min=20, help="label-free: pseudo-queries made from the collection"
    ),
    priors: str = opt(
        "default",
        "--priors",
        envvar="AHEADRANK_BUILD_PRIORS",  # serve's AHEADRANK_PRIORS switches the priors on or off
        help="label-free priors: default (the neural score 1/3 for MORES and bert, 1/6 for TK and PreTTR, BM25 and "
        "the bi-encoder the rest in equal parts; with the window prior the best window weighs as much as the "
        "bi-encoder and the weights are rescaled to sum to 1: MORES 1/4 each) or pseudo (fitted on held-out "
        "pseudo-queries; measured lower: SciFact 0.731 against 0.749, docs/training.md)",
    ),
    ce_weight: float | None = opt(
        None,
        "--ce-weight",
        min=0.0,
        help="weight of the cross-entropy on each training query's relevant document, beside the listwise KL from "
        "the fusion (default 1)",
    ),
    lr: float | None = opt(
        None,
        "--lr",
        min=0.0,
        help="learning rate (default: the recipe's for the ranker: 2e-5 for TK from the base)",
    ),
    fresh_lr: float | None = opt(
        None,
        "--fresh-lr",
        min=0.0,
        help="learning rate of the parameters that start from scratch (TK's kernel weights and mix, a score head; "
        "default: the recipe's, 1e-3 for TK from the base, else --lr)",
    ),
    fit_head: bool | None = opt(
        None,
        "--fit-head/--no-fit-head",
        help="bert, MORES, PreTTR: ridge-fit the score head (and the similarity residual's weight) to the teacher "
        "before training (default: off)",
        show_default=False,
    ),
    reuse: Path | None = opt(
        None,
        "--reuse",
        help="another build of the same collection: its BM25 index, dense field and queries are reused where they "
        "are this build's (its queries only with the same --labels: a judged build reusing a label-free one makes "
        "its own)",
    ),
    until: str | None = opt(
        None, "--until", help="stop after this stage (collection, bm25, queries, dense, train, store, priors)"
    ),
    base: Path | None = opt(
        None, "--base", help="base model folder (default: the packaged all-MiniLM-L6-v2)"
    ),
    init: Path | None = opt(
        None,
        "--init",
        help="start training from this ranker checkpoint (e.g. one trained on another collection's judgments) "
        "instead of the base model; with --steps 0 it is used as it is",
    ),
    positive: str = opt(
        "teacher",
        "--positive",
        help="label-free: what a pseudo-query is trained to put first: teacher (its source left out; the fusion's "
        "best other candidate, the fusion's ranking of the rest) or source (the document it was made from)",
    ),
    teacher: str = opt(
        "fusion",
        "--teacher",
        help="label-free: the listwise teacher the ranker is fitted to and trained against: fusion (BM25 and the "
        "bi-encoder, equal weights) or fusion-passages (with the bi-encoder's best 2-sentence window as a third "
        "feature, 1/3 each)",
    ),
    seed: int = opt(0, "--seed"),
    progress: bool = opt(True, "--progress/--no-progress"),
    passages: bool | None = opt(
        None,
        "--passages/--no-passages",
        help="store documents longer than the ranker's window as passages too (aheadrank index --passages); "
        "default: on for a label-free build, off for one trained on judgments",
        show_default=False,
    ),
    windows: bool | None = opt(
        None,
        "--windows/--no-windows",
        help="store the bi-encoder's 2-sentence windows of each document and weigh the best one in the served "
        "score (the window prior); default: on for a label-free build whose documents are mostly two or more "
        "windows",
        show_default=False,
    ),
    java_heap: str | None = opt(
        None,
        "--java-heap",
        help="maximum heap of the in-process JVM that runs BM25 (Pyserini), as -Xmx (e.g. 1g); default: Java's, "
        "a quarter of the machine's (or the container's) memory",
    ),
    dtype: str = opt(
        "float16",
        "--dtype",
        help="how the store holds the ranker's document side, as aheadrank index --dtype: float16, int8 (2x "
        "smaller), book4 or book2 (4x / 8x: a codebook per shard and dimension); the dense field stays float16",
    ),
    scheduler: str | None = scheduler_opt(
        "the dense and store stages encode their shards on this Dask scheduler's workers, tcp://HOST:PORT (they "
        "write into --out, so they must see it at the same path); the other stages run here"
    ),
    workers: int | None = workers_opt(
        "the dense and store stages encode their shards on a local Dask cluster of N worker processes"
    ),
    language: str = opt(
        "auto",
        "--language",
        help="BM25's analyzer: en, fr, de, es, it, pt or nl (Lucene's for that language); auto: the language the "
        "collection stage recognises among them, else English. The bi-encoder and the rankers stay English",
    ),
) -> None:
    """Build everything a collection needs to be served: BM25 index, a ranker adapted to the collection (from
    its own texts when it has no judgments), the store and its dense field, the priors. Prints each stage's
    time, an estimate of the time left and of the store's size on disk, and stops before the store stage where
    the disk has too little room for it; `aheadrank serve OUT` serves the result."""
    from aheadrank.build import BuildPlan, build
    from aheadrank.indexer.bm25 import set_java_heap

    set_java_heap(java_heap)  # before the JVM starts; a malformed size fails here, before any work

    cli_logging()
    logging.getLogger("aheadrank.train").setLevel(logging.INFO)
    plan = BuildPlan(
        collection=str(collection),
        out=str(out),
        ranker=ranker,
        device=device,
        labels=labels,
        recipe=recipe,
        steps=steps,
        max_queries=max_queries,
        priors=priors,
        ce_weight=ce_weight,
        lr=lr,
        fresh_lr=fresh_lr,
        fit_head=fit_head,
        seed=seed,
        base=str(base) if base else None,
        reuse=str(reuse) if reuse else None,
        progress=progress,
        passages=passages,
        windows=windows,
        init=str(init) if init else None,
        positive=positive,
        teacher=teacher,
        dtype=dtype,
        language=language,
        scheduler=scheduler,
        workers=workers,
    )
    # SIGTERM (docker stop, a job runner's timeout) stops the build as Ctrl-C does: the stage running says where
    # it stopped, what is done stays, the lock is released. Left at its default, SIGTERM killed the process
    # mid-write, and as a container's PID 1 (docker/index-job.sh execs this command) it was ignored until SIGKILL
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    record = build(plan, until=until, echo=typer.echo)
    left = record.stages_left()
    if left:  # stopped by --until: `aheadrank serve` refuses an unfinished build
        typer.echo(
            f"stopped before the {left[0]} stage (--until {until}): the same command without --until goes on"
        )
    else:
        typer.echo(f"serve it: aheadrank serve {out}")
