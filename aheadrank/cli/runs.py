"""``aheadrank train``, ``pretrain-compressor`` and ``rerank-run``: batch jobs over a collection's queries."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import typer

from aheadrank.cli.app import app
from aheadrank.cli.options import opt, user_errors, with_options
from aheadrank.cli.rankers import RANKER_OPTIONS, Kind, init_options, ranker_options_block
from aheadrank.errors import AheadrankError


@app.command("train")
@user_errors
@with_options(RANKER_OPTIONS)
def train_cmd(
    ranker: Kind = opt(..., "--ranker", help="ranker kind"),
    collection: Path = opt(..., "--collection", help="BEIR directory"),
    index: Path = opt(..., "--index", help="its BM25 Lucene index (negatives)"),
    out: Path = opt(..., "--out", help="checkpoint directory (best by validation)"),
    split: str = opt("train", "--split"),
    init: Path | None = opt(None, "--init", help="start from this checkpoint"),
    base: Path | None = opt(None, "--base"),
    recipe: str = opt(
        "auto",
        "--recipe",
        help="the measured training recipe that fills every option below not given (rankers/recipe.py): "
        "cpu (360 steps x 8 groups of 8, lr 1e-4, TK 5e-4, listwise KL from the BM25 + bi-encoder fusion, "
        "bfloat16 steps), gpu (240 x 16 x 16, lr 6e-5, documents of 256 pieces); auto: gpu on cuda, else cpu",
    ),
    steps: int | None = opt(None, "--steps"),
    group_size: int | None = opt(None, "--group-size"),
    queries_per_step: int | None = opt(None, "--queries-per-step"),
    grad_accum: int = opt(1, "--grad-accum"),
    lr: float | None = opt(None, "--lr"),
    warmup: float = opt(0.1, "--warmup"),
    eval_every: int | None = opt(None, "--eval-every"),
    val_queries: int | None = opt(None, "--val-queries"),
    val_depth: int | None = opt(None, "--val-depth", help="BM25 candidates re-ranked per validation query"),
    seed: int = opt(0, "--seed"),
    teacher: Path | None = opt(None, "--teacher", help="bert checkpoint to distil"),
    distill_weight: float = opt(0.0, "--distill-weight"),
    listwise_weight: float | None = opt(
        None,
        "--listwise-weight",
        help="> 0: add listwise KL distillation from the BM25 + bi-encoder fusion (the collection's dense "
        "field: --dense-store, else built once into OUT.dense/)",
    ),
    listwise_temperature: float = opt(1.0, "--listwise-temperature"),
    ce_weight: float = opt(1.0, "--ce-weight", help="weight of the cross-entropy on the judged positive"),
    dense_store: Path | None = opt(
        None,
        "--dense-store",
        help="the collection's dense field (a store's dense/ folder, from `aheadrank index`): the teacher's "
        "(default: built into OUT.dense/ when the listwise weight is > 0)",
    ),
    device: str = opt("cpu", "--device"),
    progress: bool = opt(True, "--progress/--no-progress"),
    freeze_embeddings: bool = opt(
        False,
        "--freeze-embeddings/--train-embeddings",
        help="keep the embedding tables as initialised (less memorisation on small training sets)",
    ),
    fresh_lr: float | None = opt(
        None,
        "--fresh-lr",
        help="learning rate of the parameters that start from scratch (heads, TK's kernel weights, PreTTR's "
        "compressor; default: the recipe's, else --lr)",
    ),
    train_doc_len: int | None = opt(
        None,
        "--train-doc-len",
        help="word pieces per document while training (default: the recipe's; the checkpoint still reads "
        "--max-doc-len)",
    ),
    negatives: str | None = opt(
        None,
        "--negatives",
        help="negative sampling: uniform over the BM25 candidates, or spread (each drawn with weight 1 / how "
        "many training queries have it as a candidate: documents near many queries recur less); default: "
        "uniform, spread for label-free training",
    ),
    fit_kernels: bool | None = opt(
        None,
        "--fit-kernels/--no-fit-kernels",
        help="TK: start the kernel weights from a ridge fit to the listwise teacher's scores (else the relevant "
        "documents) over training queries' candidates (default: on for TK from the base, --tk-base)",
    ),
    pseudo_steps: int | None = opt(
        None,
        "--pseudo-steps",
        help="steps on pseudo-queries from the collection itself (each document's title as the query for its "
        "body, BM25 negatives, cross-entropy) before the judged queries; 0: none (default: the recipe's)",
    ),
    cpu_amp: bool | None = opt(
        None,
        "--cpu-amp/--no-cpu-amp",
        help="bfloat16 autocast on CPU (faster steps where the CPU has AVX512-BF16 or AMX)",
    ),
    compressor_steps: int | None = opt(
        None,
        "--compressor-steps",
        help="PreTTR: attention-MSE pre-training steps before fine-tuning (not with --init)",
    ),
    compressor_init: str | None = opt(
        None,
        "--compressor-init",
        help="PreTTR: the compressor's start, pca (a PCA of the documents' layer-l states) or random (not with "
        "--init)",
    ),
    *,
    ranker_options: dict,
) -> None:
    """Train a ranker on a collection: 1 relevant + n BM25 negatives per group, best checkpoint kept; every
    option not given comes from the measured recipe (--recipe). A collection without qrels/<split>.tsv is
    trained label-free: pseudo-queries cut from its own texts, the equal-weight BM25 + bi-encoder fusion as the
    listwise teacher (`aheadrank build` does this and everything around it in one command)."""
    from aheadrank.rankers import init_ranker, load_ranker
    from aheadrank.rankers.recipe import check_compressor_init, recipe_for, train_recipe
    from aheadrank.rankers.training import NEGATIVE_SAMPLING, TrainConfig
    from aheadrank.runs import build_pseudo_training_data, build_training_data

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    rec = recipe_for(device, recipe)
    if compressor_init is not None:
        check_compressor_init(compressor_init)  # before any data is read
    pseudo_steps = rec.pseudo_steps if pseudo_steps is None else pseudo_steps
    if pseudo_steps < 0:
        raise AheadrankError(f"pseudo_steps must be 0 or more, got {pseudo_steps}")
    negatives_default = negatives is None
    negatives = negatives or "uniform"
    if negatives not in NEGATIVE_SAMPLING:
        raise AheadrankError(f"--negatives is {' or '.join(NEGATIVE_SAMPLING)}, not {negatives!r}")
    label_free = not (collection / "qrels" / f"{split}.tsv").is_file()
    if label_free:  # no judgments: pseudo-queries cut from the collection (aheadrank/build.py, label-free)
        from aheadrank.runs import build_label_free_training_data

        data, lf_hits, lf_queries = build_label_free_training_data(collection, index, seed=seed)
        logging.getLogger("aheadrank.train").info(
            "no qrels/%s.tsv in %s: label-free training on %d pseudo-queries %s",
            split, collection, len(data.queries), lf_queries.counts(),
        )
        negatives = "spread" if negatives_default else negatives
    else:
        data = build_training_data(collection, split, index)
    pseudo = build_pseudo_training_data(collection, index, seed=seed) if pseudo_steps > 0 else None
    if init is not None:
        model = load_ranker(init, device=device)
    else:
        options = init_options(ranker.value, ranker_options)
        options.setdefault("max_doc_len", rec.max_doc_len)
        model = init_ranker(ranker.value, base=base, seed=seed, **options).to(device)
    fresh_compressor = model.kind == "prettr" and model.config.compress and init is None
    if compressor_steps is None:
        compressor_steps = rec.compressor_steps if fresh_compressor else 0
    if compressor_init is None:
        compressor_init = rec.compressor_init if fresh_compressor else "random"
    listwise_weight = rec.listwise_weight if listwise_weight is None else listwise_weight
    cfg = TrainConfig(
        steps=rec.steps if steps is None else steps,
        group_size=group_size or rec.group_size,
        queries_per_step=queries_per_step or rec.queries_per_step,
        grad_accum=grad_accum,
        lr=rec.lr_for(model.kind) if lr is None else lr,
        warmup=warmup,
        eval_every=eval_every or rec.eval_every,
        val_queries=rec.val_queries if val_queries is None else val_queries,
        val_depth=val_depth or rec.val_depth,
        seed=seed,
        distill_weight=distill_weight,
        listwise_weight=listwise_weight,
        listwise_temperature=listwise_temperature,
        ce_weight=ce_weight,
        freeze_embeddings=freeze_embeddings,
        cpu_amp=rec.cpu_amp if cpu_amp is None else cpu_amp,
        doc_len=rec.train_doc_len if train_doc_len is None else train_doc_len,
        fresh_lr=rec.fresh_lr if fresh_lr is None else fresh_lr,
        negatives=negatives,
    )
    log = logging.getLogger("aheadrank.train")
    log.info("recipe %s: %s, compressor %s + %d steps", rec.name, cfg, compressor_init, compressor_steps)
    if listwise_weight > 0:
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
                dense_store, data.queries, lf_hits, lf_queries.aliases, data.qrels, base=model_base, device=device
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
        compressor_steps=compressor_steps,
        compressor_init=compressor_init,
        teacher=teacher_model,
        progress=progress,
        pseudo=pseudo,
        pseudo_steps=pseudo_steps,
        fit_kernels=rec.fits_kernels(model.kind, model.config.tk_base)
        if fit_kernels is None
        else fit_kernels,
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
    collection: Path = opt(..., "--collection", help="BEIR directory"),
    index: Path = opt(..., "--index", help="its BM25 Lucene index (pairs)"),
    out: Path = opt(..., "--out", help="PreTTR checkpoint directory to write"),
    split: str = opt("train", "--split", help="queries whose BM25 pairs are used"),
    init: Path | None = opt(None, "--init", help="a PreTTR checkpoint to start from (else a fresh one)"),
    base: Path | None = opt(None, "--base"),
    steps: int = opt(200, "--steps"),
    lr: float = opt(1e-3, "--lr"),
    batch: int = opt(16, "--batch", help="(query, document) pairs per step"),
    seed: int = opt(0, "--seed"),
    device: str = opt("cpu", "--device"),
    overwrite: bool = opt(False, "--overwrite"),
    progress: bool = opt(True, "--progress/--no-progress"),
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
    checkpoint: Path = opt(..., "--checkpoint"),
    store: Path = opt(..., "--store"),
    queries: Path = opt(..., "--queries", help="queries.jsonl, TSV or BEIR dir"),
    out: Path = opt(..., "--out", help="TREC run file to write"),
    index: Path | None = opt(None, "--index", help="BM25 index (candidates)"),
    candidates: Path | None = opt(
        None, "--candidates", help="first-stage TREC run to re-rank instead of BM25"
    ),
    depth: int = opt(100, "--depth"),
    split: str | None = opt(
        None,
        "--split",
        help="with a BEIR dir: only the queries judged in qrels/<split>.tsv",
    ),
    device: str = opt("cpu", "--device"),
    tag: str = opt("aheadrank", "--tag"),
    pure: bool = opt(
        False,
        "--pure/--with-priors",
        help="rank by the neural score alone (default: the served score, neural + the checkpoint's priors)",
    ),
    passage_aggregation: str = opt(
        "first+max",
        "--passage-aggregation",
        help="a store built with --passages: a long document's score from its passages' (maxp, meanp or "
        "first+max), as the service's --passage-aggregation",
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
    run, stats = rerank_run(
        checkpoint, store, qs, cands, device=device, pure=pure, passage_aggregation=passage_aggregation
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
    depth: int = opt(100, "--depth", help="BM25 candidates per query"),
    device: str = opt("cpu", "--device"),
    progress: bool = opt(True, "--progress/--no-progress"),
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
