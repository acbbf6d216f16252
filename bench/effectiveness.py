"""Effectiveness of every ranker variant against the ``bert`` cross-encoder and BM25, all trained alike.

Every variant is trained from the same base (the packaged all-MiniLM-L6-v2) on the same data (the
collection's ``--train-split`` queries, 1 relevant + n BM25 negatives per group) with the same budget
(``--steps`` × ``--queries-per-step`` groups of ``--group-size``; learning rate ``--lr`` unless a per-kind
``--lr-<kind>`` is given; every training option not given comes from the recipe, ``--recipe``:
``rankers/recipe.py``'s ``cpu`` or, with ``--device cuda``, ``gpu``), PreTTR's compressor pre-trained first
(``--compressor-steps``) and its pooled map fitted, optionally
distilled from the trained ``bert`` (``--distill-weight``). Then the store of each variant is built, BM25
top-``--depth`` of the ``--split`` queries is re-ranked through the stored representations
(``aheadrank.runs.rerank_run``: query encoder + fetch + interaction, the serving path) and evaluated.

Variant names: ``bert``; ``mores-<K>ib-s1`` / ``-s2`` (Reuse-S1 / S2: one checkpoint, two stores),
``mores-<K>ib-mean`` (EARL AvePool), ``mores-<K>ib-tied`` (EARL Tied); ``prettr-l<l>-e<e>``; ``tk-<n>l`` (``-base`` / ``-scratch``: TK's contextualisation from the base's layers or from scratch; ``-base-specials``: the text read between [CLS] and [SEP]).

Reported per variant: nDCG@10, MRR@10, R@100, MAP; ratio to ``bert`` per metric; the two-sided paired
t-test against ``bert`` and the MORES paper's non-inferiority verdicts at 2% and 5% margins
(``aheadrank.evaluation.paired_test``); training seconds; stored bytes per document (shard bytes in the
manifest / documents); for MORES, whether the S1 and S2 runs are identical (same docids in the same order
for every query) and their largest score difference.

Everything is cached in ``--workdir`` under keys made from the settings (BM25 index, checkpoints,
stores, runs), so a re-run skips what is finished and an interrupted training resumes
(``rankers.training.train``'s state file). Outputs: ``<out-dir>/runs/<name>.trec`` (plus ``bm25.trec``),
``<out-dir>/effectiveness.json`` and ``<out-dir>/effectiveness.md``.

    .venv/bin/python bench/effectiveness.py --rankers bert mores-1ib-s1 mores-1ib-s2 mores-2ib-s1 mores-2ib-s2 \
        prettr-l5-e128 tk-2l --threads 2                              # the core set, CPU recipe (resumable)
    .venv/bin/python bench/effectiveness.py --device cuda ...          # the same with the GPU recipe
    .venv/bin/python bench/effectiveness.py --quick --out-dir /tmp/eff  # smoke run on the bundled sample
    .venv/bin/python bench/effectiveness.py --rankers bert 'mores-2ib-*' --steps 500
    .venv/bin/python bench/effectiveness.py --rejudge bench/results/cpu-core-360/effectiveness.json  # goals by the current rules
"""

from __future__ import annotations

import argparse
import fnmatch
import gc
import json
import logging
import math
import os
import shlex
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from aheadrank.rankers.recipe import RECIPES, STAGE_OPTIONS, TRAIN_OPTIONS, training_options  # noqa: E402
from aheadrank.rankers.registry import kinds  # noqa: E402
from aheadrank.rankers.variants import CATALOGUE as ALL_RANKERS  # noqa: E402  (the one registry; was defined here)
from aheadrank.rankers.variants import Variant, match_variants, parse_variant  # noqa: E402
from benchkit import (  # noqa: E402  (the shared helpers; were defined here)
    SAMPLE,
    Bm25Hits,
    add_options,
    bm25_index_path,
    clean,
    digest,
    eval_topics,
    machine,
    read_json,
    stage,
    write_json,
)

SHARED_SCIFACT = REPO.parent / "shared" / "data" / "scifact"
QUICK_RANKERS = ("bert", "mores-2ib-s1", "mores-2ib-s2", "prettr-l5-e128", "tk-2l")
METRICS = ("nDCG@10", "MRR@10", "R@100", "MAP")
PRIMARY = "nDCG@10"
MARGINS = (0.02, 0.05)
KINDS = kinds()  # the registered ranker kinds (--lr-<kind>, --fresh-lr-<kind>)
TRAINING = (*TRAIN_OPTIONS, *STAGE_OPTIONS)  # the training options' names (given_training)
FUSION = "bm25+bi-encoder"  # the validation-tuned z-score interpolation a user would write
ZERO_SHOT = ("vaswani", "cranfield")  # default --eval-collections (under ../shared/data, when there)
FP16_RESOLUTION = 2e-3  # of the score scale: pairs closer than this may swap with float16 storage
# the --quick smoke budget, below what is given; every training option not given then comes from the training
# recipe (--recipe, rankers/recipe.py resolve_training), so that this bench and `aheadrank train` train the same way
QUICK = {
    "steps": 3,
    "queries_per_step": 2,
    "group_size": 4,
    "compressor_steps": 2,
    "compressor_init": "pca",
    "eval_every": 0,  # once, at the end
    "val_queries": 4,
    "val_depth": 50,
    "listwise_weight": 0.0,
    "cpu_amp": False,
}
QUICK_BENCH = {"max_doc_len": 128, "max_queries": 20}  # --quick's reading length and evaluated queries

log = logging.getLogger("bench.effectiveness")
LATER_OPTIONS = {"fresh_lr": None, "negatives": "uniform"}  # TrainConfig fields newer than the bench's cache


# ---- variants ---------------------------------------------------------------------------------------------
def select_variants(patterns: list[str]) -> list[Variant]:
    """Names or glob patterns over ALL_RANKERS (explicit names outside it are parsed too); bert first."""
    names = match_variants(patterns, ALL_RANKERS)
    if "bert" not in names:
        log.info("adding bert: it is the reference every ratio and test is taken against")
    names = ["bert", *[n for n in names if n != "bert"]]
    return [parse_variant(n) for n in names]


# ---- stages -----------------------------------------------------------------------------------------------
def given_training(args, kind: str) -> dict:
    """The training options given for a kind (None: not given): the flags, ``--lr-<kind>`` /
    ``--fresh-lr-<kind>`` over ``--lr`` / ``--fresh-lr``, --quick's budget below them; bert is not distilled
    (it is the teacher)."""
    given = {name: getattr(args, name) for name in TRAINING if name in vars(args)}
    if args.quick:
        given = {**QUICK, **{k: v for k, v in given.items() if v is not None}}
    for name in ("lr", "fresh_lr"):
        if (own := getattr(args, f"{name}_{kind}")) is not None:
            given[name] = own
    if kind == "bert":
        given["distill_weight"] = 0.0
    return given


def resolved_training(args, variant: Variant | str):
    """Every training option of a variant (a kind: its default variant), resolved by the recipe."""
    from aheadrank.rankers.config import default_options
    from aheadrank.rankers.recipe import resolve_training
    from aheadrank.rankers.variants import default_variant

    variant = default_variant(variant) if isinstance(variant, str) else variant
    options = {**default_options(variant.kind), **variant.options}
    return resolve_training(args.recipe, variant.kind, given_training(args, variant.kind), ranker=options)


class TrainingDataCache:
    """Built on first use only (a fully cached re-run never reads the training data)."""

    def __init__(self, collection: Path, split: str, bm25: Bm25Hits):
        self.args = (collection, split)
        self.bm25 = bm25
        self._data = None
        self.teacher: tuple[dict, Path] | None = None  # (fusion weights, dense store): the listwise teacher
        self.base: str | None = None

    def get(self):
        if self._data is None:
            from aheadrank.runs import build_training_data

            t0 = time.perf_counter()
            self._data = build_training_data(*self.args, index=None, depth=100, search=self.bm25.hits)
            stage(
                f"training data: {len(self._data.trainable())} trainable {self.args[1]} queries, "
                f"BM25 top-100 negatives ({time.perf_counter() - t0:.1f} s)"
            )
            if self.teacher is not None:
                self._data.teacher = self._teacher_scores()
        return self._data

    def set_teacher(self, weights: dict, dense: Path, base: str | None) -> None:
        self.teacher, self.base = (weights, dense), base
        if self._data is not None:
            self._data.teacher = self._teacher_scores()

    def _teacher_scores(self) -> dict:
        """The BM25 + bi-encoder fusion's scores over every training query's BM25 top-100."""
        from aheadrank.baselines import dense_features, feature_run

        weights, dense = self.teacher
        data = self._data
        cands = self.bm25.hits(data.queries, 100)
        feats = dense_features(dense, data.queries, cands, base=self.base)
        stage(f"teacher: BM25 + bi-encoder fusion {weights} over {len(feats)} training queries")
        return feature_run(feats, weights)


def val_bm25_ndcg(data, cfg) -> float | None:
    """nDCG@10 of the BM25 order on the trainer's held-out validation queries (what training must beat)."""
    from aheadrank.rankers.training import split_queries, validation_metric

    _, val_q = split_queries(data, cfg.val_queries, cfg.seed)
    if not val_q:
        return None
    run = {q: {d: -float(i) for i, d in enumerate(data.candidates[q][: cfg.val_depth])} for q in val_q}
    return validation_metric(run, data.qrels)


def ensure_checkpoint(variant: Variant, args, data: TrainingDataCache, teacher: dict | None) -> dict:
    """Train (or reuse) the checkpoint of ``variant.model``; returns its record (key, path, seconds, ...)."""
    import torch
    from aheadrank.rankers import load_ranker
    from aheadrank.rankers.base_model import resolve_base
    from aheadrank.rankers.checkpoint import read_fingerprint
    from aheadrank.rankers.recipe import POOL_DOCS, train_recipe
    from aheadrank.rankers.training import loss_ends, state_file

    resolved = resolved_training(args, variant)
    cfg, compressor_steps, fit_kernels = resolved.train, resolved.compressor_steps, resolved.fit_kernels
    distil = teacher is not None and cfg.distill_weight > 0
    key = {
        "model": variant.model,
        "kind": variant.kind,
        # sim = False is how every checkpoint trained before the option existed was made: left out of the key
        # so that their caches stay valid
        "options": {k: v for k, v in variant.options.items() if not (k == "sim" and v is False)},
        "base": str(resolve_base(args.base).resolve()),
        "collection": str(args.collection),
        "train_split": args.train_split,
        "negatives": "bm25-top100",
        "max_query_len": args.max_query_len,
        "max_doc_len": args.max_doc_len,
        # options added later, at the value every checkpoint before them was trained with, are left out: their
        # caches stay valid
        "train": {k: v for k, v in asdict(cfg).items() if not (k in LATER_OPTIONS and v == LATER_OPTIONS[k])},
        "compressor_steps": compressor_steps,
        **(
            {"compressor_init": resolved.compressor_init}
            if variant.kind == "prettr"
            and variant.options["compress"]
            and resolved.compressor_init != "random"
            else {}
        ),
        # TK from the base: its kernel weights ridge-fitted before training (the recipe's default)
        **({"fit_kernels": True} if fit_kernels else {}),
        # PreTTR with sim: its pooled map fitted on this many documents (rankers/recipe.py)
        **({"pool_docs": POOL_DOCS} if variant.kind == "prettr" and variant.options.get("sim") else {}),
        "teacher": teacher["fingerprint"] if distil else None,
        "listwise_teacher": (
            {"fusion": data.teacher[0], "dense": str(data.teacher[1])} if cfg.listwise_weight > 0 else None
        ),
    }
    ckpt = args.workdir / "ckpt" / f"{variant.model}-{digest(key)}"
    meta_path = ckpt.with_name(ckpt.name + ".bench.json")
    meta = read_json(meta_path)
    if meta and meta.get("key") == key and (ckpt / "fingerprint.json").is_file():
        stage(f"train {variant.model}: cached {ckpt} ({meta['train_seconds']:.1f} s when trained)")
        return {**meta, "cached": True}
    state = state_file(ckpt)
    resumed = state.is_file()
    stage(
        f"train {variant.model}: {cfg.steps} steps × {cfg.queries_per_step} groups of {cfg.group_size}, "
        f"lr {cfg.lr:g}"
        + (f", compressor {compressor_steps} steps" if compressor_steps else "")
        + (f", distilled from bert (weight {cfg.distill_weight:g})" if distil else "")
        + (" (resuming)" if resumed else "")
    )
    training = data.get()
    model = variant.init(
        base=args.base, seed=cfg.seed, max_query_len=args.max_query_len, max_doc_len=args.max_doc_len
    ).to(args.device)
    teacher_model = load_ranker(teacher["checkpoint"], device=args.device) if distil else None
    done = train_recipe(
        model,
        training,
        ckpt,
        cfg,
        # a resumed run loads the pre-trained compressor with the state
        compressor_steps=0 if resumed else compressor_steps,
        pool_docs=0 if resumed else POOL_DOCS,
        compressor_init="random" if resumed else resolved.compressor_init,
        teacher=teacher_model,
        progress=args.progress,
        fine_tune=cfg.steps > 0,
        fit_kernels=fit_kernels,
        extra={"train": {"steps": 0}},
    )
    result, comp_losses = done.result, done.compressor_losses
    t0, t1, t2 = 0.0, done.compressor_seconds, done.seconds
    history = result.history if result else []
    val_bm25 = val_bm25_ndcg(training, cfg)
    losses = [h["loss"] for h in history]
    loss_first, loss_last = loss_ends(losses)
    meta = {
        "key": key,
        "checkpoint": str(ckpt),
        "fingerprint": read_fingerprint(ckpt),
        "train_seconds": t2 - t0,
        "compressor_seconds": t1 - t0,
        "resumed": resumed,
        "steps": result.steps if result else 0,
        "best_step": result.best_step if result else 0,
        "best_val_ndcg10": result.best_metric if result and val_bm25 is not None else None,
        "val_bm25_ndcg10": val_bm25,
        "val_history": [(h["step"], h["val_ndcg10"]) for h in history if "val_ndcg10" in h],
        "loss_first": loss_first,
        "loss_last": loss_last,
        "compressor_loss_first": comp_losses[0] if comp_losses else None,
        "compressor_loss_last": comp_losses[-1] if comp_losses else None,
        "pool_map": done.pool_fit,
    }
    write_json(meta_path, meta)
    if not args.keep_train_state:
        state.unlink(missing_ok=True)  # finished: the optimizer state is only needed to resume
    stage(
        f"train {variant.model}: {t2 - t0:.1f} s, loss {fmt(meta['loss_first'])} -> {fmt(meta['loss_last'])}, "
        f"best val nDCG@10 {fmt(meta['best_val_ndcg10'])} at step {meta['best_step']} "
        f"(BM25 on the same validation queries {fmt(meta['val_bm25_ndcg10'])})"
    )
    del model, teacher_model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return {**meta, "cached": False}


def ensure_store(
    variant: Variant, ckpt: dict, args, collection: Path | None = None, dense: Path | None = None
) -> dict:
    """The representation store of a checkpoint and strategy over a collection (built or resumed unless
    complete), with the dense field copied from the collection's dense store ``dense``."""
    import aheadrank.indexer.build as build
    from aheadrank.store import read_manifest

    collection = collection or args.collection
    where = "" if collection == args.collection else f"-{collection.name}"
    store = (
        args.workdir / "stores" / f"{Path(ckpt['checkpoint']).name}-{variant.strategy or 'default'}{where}"
    )
    meta_path = store.with_name(store.name + ".bench.json")
    manifest = read_manifest(store) if (store / "manifest.json").is_file() else None
    meta = read_json(meta_path) or {}
    fresh = manifest is not None and manifest.spec.fingerprint == ckpt["fingerprint"]
    if fresh and manifest.complete and meta.get("fingerprint") == ckpt["fingerprint"]:
        stage(f"store {variant.name}: cached {store}")
        cached = True
    else:
        stage(f"store {variant.name}: building {store}")
        summary = build.build_store(
            build.BuildOptions(
                ckpt["checkpoint"],
                str(collection),
                str(store),
                strategy=variant.strategy,
                device=args.device,
                overwrite=manifest is not None and not fresh,  # a store of an older checkpoint
                progress=args.progress,
            )
        )
        build.release_rankers()  # the build keeps its ranker for later shards; free it (one per variant)
        meta = {"fingerprint": ckpt["fingerprint"], "build_seconds": summary.seconds}
        write_json(meta_path, meta)
        manifest = read_manifest(store)
        cached = False
        stage(f"store {variant.name}: {summary.documents} documents in {summary.seconds:.1f} s")
    if dense is not None:
        ensure_dense_copy(store, dense, ckpt["checkpoint"])
    return {
        "path": str(store),
        "strategy": manifest.spec.strategy,
        "bytes": manifest.n_bytes,
        "documents": manifest.n_docs,
        "bytes_per_doc": manifest.n_bytes / max(1, manifest.n_docs),
        "build_seconds": meta.get("build_seconds"),
        "cached": cached,
    }


def ensure_dense_store(collection: Path, checkpoint: str, args) -> Path:
    """The collection's dense field (the base bi-encoder, one embedding per document), built once and
    copied into every variant's store; also what the bi-encoder baselines read."""
    from aheadrank.indexer.build import ensure_dense_field

    path = args.workdir / "dense" / f"{collection.name}-{digest(str(collection))}"
    stage(f"dense field {collection.name}: {path}")
    summary = ensure_dense_field(collection, path, checkpoint, args.device, args.progress)
    if summary is None:
        stage(f"dense field {collection.name}: cached")
    else:
        stage(f"dense field {collection.name}: {summary.documents} documents in {summary.seconds:.1f} s")
    return path


def ensure_dense_copy(store: Path, dense: Path, checkpoint: str) -> None:
    import aheadrank.indexer.build as build
    from aheadrank.store import read_manifest

    target = store / build.DENSE_DIR
    if (target / "manifest.json").is_file():
        mine, src = read_manifest(target), read_manifest(dense)
        if mine.complete and mine.spec.fingerprint == src.spec.fingerprint:
            return
    build.build_dense(build.BuildOptions(checkpoint, "", str(store)), reuse=dense)


def ensure_priors(variant: Variant, ckpt: dict, store: dict, val: dict, args) -> dict:
    """Fit the checkpoint's priors on the held-out validation queries through its store (once per
    checkpoint: MORES S1 and S2 share one); returns the priors as saved."""
    from aheadrank.rankers.checkpoint import read_priors_json

    from aheadrank.rerank import fit_checkpoint_priors

    key = {"fingerprint": ckpt["fingerprint"], "val": digest(sorted(val["queries"])), "depth": args.depth}
    saved = read_priors_json(ckpt["checkpoint"])
    if saved and saved.get("fitted_on", {}).get("key") == key:
        return saved
    stage(f"priors {variant.model}: fitting on {len(val['queries'])} held-out validation queries")
    priors = fit_checkpoint_priors(
        ckpt["checkpoint"],
        store["path"],
        val["queries"],
        val["candidates"],
        val["qrels"],
        {"key": key, "collection": str(args.collection), "split": args.train_split, "held_out": True},
        device=args.device,
    )
    stage(f"priors {variant.model}: {priors.weights}")
    return priors.to_dict()


def ensure_runs(variant: Variant, ckpt: dict, store: dict, queries, candidates, args, run_key: dict, priors):
    """Re-rank every query's BM25 candidates through the store once (cached per settings): the pure neural
    run and the run with the checkpoint's priors from the same scores. Returns (pure, with priors, info)."""
    from aheadrank.evaluation import read_run, write_run
    from aheadrank.runs import rerank_run

    key = {
        **run_key,
        "fingerprint": ckpt["fingerprint"],
        "strategy": store["strategy"],
        "priors": digest(priors),
    }
    names = (variant.name, f"{variant.name}+priors")
    paths = [args.workdir / "runs" / f"{n}-{digest(key)}.trec" for n in names]
    meta_path = paths[0].with_suffix(".json")
    meta = read_json(meta_path)
    if meta and meta.get("key") == key and all(p.is_file() for p in paths):
        for n in names:
            stage(f"rerank {n}: cached {paths[names.index(n)]}")
        return read_run(paths[0]), read_run(paths[1]), {**meta, "cached": True}
    stage(f"rerank {variant.name}: {len(queries)} queries × BM25 top-{args.depth} through {store['path']}")
    t0 = time.perf_counter()
    pure: dict = {}
    run, stats = rerank_run(
        ckpt["checkpoint"],
        store["path"],
        queries,
        candidates,
        device=args.device,
        progress=args.progress,
        pure_out=pure,
    )
    seconds = time.perf_counter() - t0
    write_run(paths[0], pure, names[0])
    write_run(paths[1], run, names[1])
    meta = {
        "key": key,
        "seconds": seconds,
        "stage_seconds": stats.seconds,
        "queries": stats.queries,
        "candidates": stats.candidates,
        "unknown_docids": stats.unknown,
        "notices": stats.notices,
    }
    write_json(meta_path, meta)
    stage(f"rerank {variant.name}: {seconds:.1f} s ({stats.unknown} unknown docids)")
    return pure, run, {**meta, "cached": False}


def validation_set(data: TrainingDataCache, args) -> dict:
    """The trainer's held-out validation queries (the same split for every kind) with their BM25
    candidates: where the priors and the BM25 + bi-encoder fusion weight are fitted (never test)."""
    from aheadrank.rankers.training import split_queries

    training = data.get()
    cfg = resolved_training(args, "bert").train
    _, val_q = split_queries(training, cfg.val_queries, cfg.seed)
    queries = {q: training.queries[q] for q in val_q}
    return {
        "queries": queries,
        "candidates": data.bm25.hits(queries, args.depth),
        "qrels": {q: training.qrels[q] for q in val_q},
    }


def baseline_runs(dense_store: Path, queries, candidates, qrels, val: dict, args) -> tuple[dict, dict, float]:
    """The user's alternatives on the evaluated queries: the bi-encoder alone, BM25 + bi-encoder fused
    with the weight chosen on the validation queries, and RRF. Returns (runs, fusion weights, val nDCG@10)."""
    from aheadrank.baselines import dense_features, feature_run, fit_fusion, rrf_run

    val_feats = dense_features(
        dense_store, val["queries"], val["candidates"], val["qrels"], args.device, args.base
    )
    weights, val_ndcg = fit_fusion(list(val_feats.values()))
    stage(f"baselines: fusion weights {weights} (validation nDCG@10 {val_ndcg:.4f})")
    feats = dense_features(dense_store, queries, candidates, qrels, args.device, args.base)
    runs = {
        "bi-encoder": feature_run(feats, {"dense": 1.0}),
        FUSION: feature_run(feats, weights),
        "rrf": rrf_run(feats),
    }
    return runs, weights, val_ndcg


def zero_shot_eval(collection: Path, variants, checkpoints: dict, fusion_w: dict, args) -> dict:
    """The checkpoints trained on --collection, their priors and the fusion weight fitted there, applied
    unchanged to another collection's test queries (BM25 top-depth), beside BM25 and the baselines."""
    from aheadrank.baselines import dense_features, feature_run, rrf_run
    from aheadrank.evaluation import per_query, write_run

    bm25 = Bm25Hits(collection, args.workdir, args.progress)
    queries, qrels = eval_topics(collection, args.split, args.max_queries)
    candidates = bm25.hits(queries, args.depth)
    dense = ensure_dense_store(collection, args.base or "", args)
    feats = dense_features(dense, queries, candidates, qrels, args.device, args.base)
    runs = {
        "bm25": {q: {d: float(s) for d, s in hits} for q, hits in candidates.items()},
        "bi-encoder": feature_run(feats, {"dense": 1.0}),
        FUSION: feature_run(feats, fusion_w),
        "rrf": rrf_run(feats),
    }
    run_key = {
        "collection": str(collection),
        "index": str(bm25_index_path(collection, args.workdir)),  # where the hits come from (maybe not built)
        "split": args.split,
        "queries": digest(sorted(queries)),
        "depth": args.depth,
    }
    from aheadrank.rankers.checkpoint import read_priors_json

    for variant in variants:
        ckpt = checkpoints[variant.model]
        store = ensure_store(variant, ckpt, args, collection=collection, dense=dense)
        priors = read_priors_json(ckpt["checkpoint"])
        runs[variant.name], runs[f"{variant.name}+priors"], _ = ensure_runs(
            variant, ckpt, store, queries, candidates, args, run_key, priors
        )
    out_dir = args.out_dir / "runs" / collection.name
    pq = {name: per_query(run, qrels, METRICS) for name, run in runs.items()}
    table = {}
    for name, run in runs.items():
        write_run(out_dir / f"{name}.trec", run, name)
        table[name] = {
            "metrics": {m: sum(v.values()) / len(v) for m, v in pq[name].items()},
            "vs_bm25": comparison(pq["bm25"], pq[name]) if name != "bm25" else None,
            "vs_fusion": comparison(pq[FUSION], pq[name]) if name != FUSION else None,
        }
    stage(
        f"zero-shot {collection.name}: {len(queries)} queries; "
        + ", ".join(f"{n} {r['metrics'][PRIMARY]:.4f}" for n, r in table.items())
    )
    return {"collection": str(collection), "name": collection.name, "queries": len(queries), "rows": table}


def prior_goals(rows: dict, bm25: dict, baselines: dict, zero_shot: list) -> list[dict]:
    """Issue 13's goals: with priors, every ranker beats BM25 (paired t-test p < 0.05) and is at least
    level with the validation-tuned BM25 + bi-encoder fusion; zero-shot, every ranker with priors ≥ BM25."""
    with_priors = {n: r for n, r in rows.items() if not r["pure"]}
    if not with_priors:
        return []
    fusion = baselines[FUSION]["metrics"][PRIMARY]
    parts, ok = [], True
    for name, row in with_priors.items():
        vs = row["vs_bm25"][PRIMARY]
        good = vs["mean_diff"] > 0 and vs["significant"] and row["metrics"][PRIMARY] >= fusion
        ok = ok and good
        parts.append(
            f"{name} {row['metrics'][PRIMARY]:.4f} (vs BM25 p = {vs['p']:.3g}; "
            f"{row['metrics'][PRIMARY] - fusion:+.4f} vs fusion)"
        )
    goals = [
        {
            "goal": f"with priors, every ranker beats BM25 (p < 0.05) and is ≥ the fusion ({fusion:.4f})",
            "status": ok,
            "detail": "; ".join(parts),
        }
    ]
    for zs in zero_shot:
        bm = zs["rows"]["bm25"]["metrics"][PRIMARY]
        names = [n for n in zs["rows"] if n.endswith("+priors")]
        goals.append(
            {
                "goal": f"zero-shot on {zs['name']}: every ranker with priors ≥ BM25 ({bm:.4f})",
                "status": all(zs["rows"][n]["metrics"][PRIMARY] >= bm for n in names),
                "detail": "; ".join(f"{n} {zs['rows'][n]['metrics'][PRIMARY]:.4f}" for n in names),
            }
        )
    return goals


# ---- evaluation -------------------------------------------------------------------------------------------
def same_ranking(a: dict, b: dict, resolution: float = FP16_RESOLUTION) -> dict:
    """Whether two runs list the same docids in the same order for every query; max |score diff|; and,
    where the order differs, whether every swapped pair was a near-tie: both runs' scores of the two
    documents within ``resolution`` × the score scale (float16 storage rounds S1's D and S2's D·W
    differently, so S1 and S2 may swap documents whose float32 scores are that close)."""
    import numpy as np

    from aheadrank.evaluation import ranking

    qids = sorted(set(a) | set(b))
    scale = max((abs(s) for run in (a, b) for docs in run.values() for s in docs.values()), default=0.0)
    differing, discordant, worst_gap, max_diff = [], 0, 0.0, 0.0
    for q in qids:
        ra, rb = ranking(a.get(q, {})), ranking(b.get(q, {}))
        if set(ra) != set(rb):
            differing.append(q)
            worst_gap = max_diff = math.inf
            continue
        sa = np.array([a[q][d] for d in ra])
        sb = np.array([b[q][d] for d in ra])
        if len(ra):
            max_diff = max(max_diff, float(np.abs(sa - sb).max()))
        if ra == rb:
            continue
        differing.append(q)
        where_b = {d: i for i, d in enumerate(rb)}
        pb = np.array([where_b[d] for d in ra])
        swapped = np.triu(pb[:, None] > pb[None, :], 1)  # i before j in a, after j in b
        discordant += int(swapped.sum())
        gap = np.maximum(np.abs(sa[:, None] - sa[None, :]), np.abs(sb[:, None] - sb[None, :]))
        worst_gap = max(worst_gap, float(gap[swapped].max()))
    return {
        "identical": not differing,
        "equivalent_fp16": worst_gap <= resolution * scale,
        "queries": len(qids),
        "queries_differing": len(differing),
        "examples": differing[:5],
        "discordant_pairs": discordant,
        "max_swapped_gap": worst_gap,
        "max_abs_score_diff": max_diff,
        "score_scale": scale,
        "resolution": resolution,
    }


def comparison(pq_a: dict, pq_b: dict) -> dict:
    """Per metric: ratio, mean difference, paired t-test and non-inferiority verdicts of B against A."""
    from aheadrank.evaluation import paired_test

    out = {}
    for metric in METRICS:
        c = paired_test(pq_a[metric], pq_b[metric], metric=metric, margins=MARGINS)
        out[metric] = {
            "ratio": c.ratio,
            "mean_diff": c.mean_diff,
            "t": c.t,
            "p": c.p,
            "significant": c.significant,
            "non_inferior": {f"{t.margin:g}": t.non_inferior for t in c.non_inferiority},
            "p_non_inferior": {f"{t.margin:g}": t.p for t in c.non_inferiority},
        }
    return out


PRETTR_WITHIN = 0.10  # issue 14: PreTTR l5/e128 within 10% of bert (mean nDCG@10 ratio >= 0.90)
PRIORS_FLOOR = 0.75  # issue 14: the served score (with priors) of MORES 2xIB S2 and PreTTR l5/e128
PRIORS_GOAL_RANKERS = ("mores-2ib-s2+priors", "prettr-l5-e128+priors")


def goal_verdicts(rows: dict, bm25: dict, baselines: dict | None = None) -> list[dict]:
    """Issue 14's goals, each met / missed / not run, with the numbers behind the verdict (GOAL_RULES)."""

    def val(name: str) -> float:
        return rows[name]["metrics"][PRIMARY]

    bm = bm25["metrics"][PRIMARY]
    goals = []
    if "bert" in rows:
        vs = rows["bert"]["vs_bm25"][PRIMARY]
        goals.append(
            {
                "goal": "bert ≥ BM25",
                "status": val("bert") >= bm,
                "detail": f"bert {val('bert'):.4f}, BM25 {bm:.4f} (paired t-test p = {vs['p']:.3g})",
            }
        )
    else:
        goals.append({"goal": "bert ≥ BM25", "status": None, "detail": "not run (bert)"})
    bienc = (baselines or {}).get("bi-encoder")
    tk_names = [n for n in rows if n.startswith("tk-") and not n.endswith("+priors")] or ["tk-2l"]
    specs = [
        ("MORES 2×IB non-inferior to bert at 5%", ["mores-2ib-s1", "mores-2ib-s2"], "ni"),
        (f"PreTTR l5/e128 within {PRETTR_WITHIN:.0%} of bert", ["prettr-l5-e128"], "within"),
    ]
    if bienc is not None:
        specs.append((f"TK above the bi-encoder alone ({bienc['metrics'][PRIMARY]:.4f})", tk_names, "bienc"))
    for goal, names, test in specs:
        present = [n for n in names if n in rows]
        if not present:
            goals.append({"goal": goal, "status": None, "detail": f"not run ({', '.join(names)})"})
            continue
        parts, ok = [], True
        for n in present:
            vs = rows[n]["vs_bert"][PRIMARY]
            if test == "ni":
                good = bool(vs["non_inferior"]["0.05"])
                parts.append(
                    f"{n} {val(n):.4f} = {vs['ratio']:.3f}× bert, non-inferiority p = {vs['p_non_inferior']['0.05']:.3g}"
                )
            elif test == "within":
                good = vs["ratio"] >= 1 - PRETTR_WITHIN
                parts.append(f"{n} {val(n):.4f} = {vs['ratio']:.3f}× bert")
            else:
                good = val(n) > bienc["metrics"][PRIMARY]
                parts.append(f"{n} {val(n):.4f} vs the bi-encoder {bienc['metrics'][PRIMARY]:.4f}")
            ok = ok and good
        goals.append({"goal": goal, "status": ok, "detail": "; ".join(parts)})
    fusion = (baselines or {}).get(FUSION)
    goal = f"with priors, MORES 2×IB S2 and PreTTR l5/e128 ≥ {PRIORS_FLOOR} and above the fusion (p < 0.05)"
    present = [n for n in PRIORS_GOAL_RANKERS if n in rows]
    if fusion is None or not present:
        goals.append({"goal": goal, "status": None, "detail": f"not run ({', '.join(PRIORS_GOAL_RANKERS)})"})
    else:
        parts, ok = [], len(present) == len(PRIORS_GOAL_RANKERS)
        for n in present:
            vs = rows[n]["vs_fusion"][PRIMARY]
            ok = ok and val(n) >= PRIORS_FLOOR and vs["mean_diff"] > 0 and vs["significant"]
            parts.append(f"{n} {val(n):.4f} ({vs['mean_diff']:+.4f} vs the fusion, p = {vs['p']:.3g})")
        goals.append({"goal": goal, "status": ok, "detail": "; ".join(parts)})
    return goals


GOAL_RULES = (
    f"Goals (issue 14) are judged on {PRIMARY} over the evaluated queries. bert: mean ≥ BM25's. MORES 2×IB: every "
    "2×IB S1/S2 run present passes the non-inferiority test against bert at a 5% margin (one-sided, p < 0.05; "
    f"aheadrank.evaluation.paired_test). PreTTR l5/e128: mean ≥ {1 - PRETTR_WITHIN:.2f}× bert's. TK: every TK "
    "variant present has a higher mean than the bi-encoder alone. With priors: MORES 2×IB S2 and PreTTR l5/e128 "
    f"each reach {PRIORS_FLOOR} and beat the validation-tuned BM25 + bi-encoder fusion (paired t-test, mean "
    "difference > 0, p < 0.05)."
)


def status_text(status) -> str:
    return "not run" if status is None else "met" if status else "missed"


# ---- output -----------------------------------------------------------------------------------------------
def print_table(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title=f"effectiveness on {result['settings']['collection_name']} {result['settings']['split']}"
    )
    table.add_column("ranker")
    for m in METRICS:
        table.add_column(m, justify="right")
    table.add_column(f"p vs bert ({PRIMARY})", justify="right")
    table.add_column("NI 2%", justify="center")
    table.add_column("NI 5%", justify="center")
    table.add_column("train s", justify="right")
    table.add_column("bytes/doc", justify="right")
    bm = result["bm25"]
    bert = result["rankers"]["bert"]["metrics"]
    table.add_row(
        "bm25",
        *[
            f"{bm['metrics'][m]:.4f} ({bm['metrics'][m] / bert[m]:.2f}×)"
            if bert[m]
            else f"{bm['metrics'][m]:.4f}"
            for m in METRICS
        ],
        "",
        "",
        "",
        "",
        "",
    )
    for name, row in result["rankers"].items():
        vs = row["vs_bert"]
        cells = [
            f"{row['metrics'][m]:.4f}"
            + (f" ({vs[m]['ratio']:.2f}×)" if vs and vs[m]["ratio"] is not None else "")
            for m in METRICS
        ]
        ni = vs[PRIMARY]["non_inferior"] if vs else {}
        table.add_row(
            name,
            *cells,
            f"{vs[PRIMARY]['p']:.3g}" if vs and vs[PRIMARY]["p"] is not None else "—",
            {True: "yes", False: "no"}.get(ni.get("0.02"), "—"),
            {True: "yes", False: "no"}.get(ni.get("0.05"), "—"),
            train_seconds_text(row["train"]),
            f"{row['store']['bytes_per_doc']:,.0f}",
        )
    console = Console(width=None if sys.stdout.isatty() else 200)
    console.print(table)
    for check in result["s1_s2"]:
        console.print(f"S1 vs S2 {check['model']}: {s1_s2_text(check)}")
    for goal in result["goals"]:
        console.print(f"goal: {goal['goal']}: [bold]{status_text(goal['status'])}[/bold] — {goal['detail']}")


def s1_s2_text(c: dict) -> str:
    if c["identical"]:
        verdict = "identical rankings"
    else:
        verdict = (
            f"rankings differ in {c['queries_differing']} of {c['queries']} queries "
            f"({c['discordant_pairs']} swapped pairs, the widest {fmt(c['max_swapped_gap'], '.3g')} apart: "
            + ("all float16 near-ties" if c["equivalent_fp16"] else "NOT all float16 near-ties")
            + ")"
        )
    return (
        f"{verdict}; max |score diff| {fmt(c['max_abs_score_diff'], '.3g')} "
        f"(score scale {fmt(c['score_scale'], '.3g')}, float16 tie threshold "
        f"{fmt(c['resolution'] * c['score_scale'], '.3g')})"
    )


def train_seconds_text(t: dict) -> str:
    """Training seconds; a ``*`` marks a training resumed after an interruption (last invocation only)."""
    return f"{t['train_seconds']:.0f}" + ("*" if t.get("resumed") else "")


def fmt(x, spec: str = ".4f") -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else format(x, spec)


def diff_p(c: dict | None) -> str:
    if not c:
        return ""
    return f"{c[PRIMARY]['mean_diff']:+.4f}, p = {fmt(c[PRIMARY]['p'], '.2g')}"


def fmt_weights(w: dict | None) -> str:
    return "" if not w else ", ".join(f"{k} {v:.2f}" for k, v in w.items())


def write_markdown(path: Path, result: dict) -> None:
    s = result["settings"]
    lines = [
        f"# Effectiveness on {s['collection_name']} ({s['split']}, {s['queries']} queries, BM25 top-{s['depth']} re-ranked)",
        "",
        "| ranker | "
        + " | ".join(f"{m} | ×bert" for m in METRICS)
        + f" | p vs bert ({PRIMARY}) | NI 2% | NI 5% | train s | bytes/doc |",
        "|---|" + "---:|---:|" * len(METRICS) + "---:|:---:|:---:|---:|---:|",
    ]
    bert = result["rankers"]["bert"]["metrics"]
    bm = result["bm25"]["metrics"]
    lines.append(
        "| bm25 | "
        + " | ".join(f"{fmt(bm[m])} | {fmt(bm[m] / bert[m] if bert[m] else None, '.3f')}" for m in METRICS)
        + " | | | | | |"
    )
    for name, row in result["rankers"].items():
        vs = row["vs_bert"]
        cells = " | ".join(
            f"{fmt(row['metrics'][m])} | {fmt(vs[m]['ratio'], '.3f') if vs else '1'}" for m in METRICS
        )
        ni = vs[PRIMARY]["non_inferior"] if vs else {}
        yn = {True: "yes", False: "no"}
        lines.append(
            f"| {name} | {cells} | {fmt(vs[PRIMARY]['p'], '.3g') if vs else ''} | {yn.get(ni.get('0.02'), '')} | "
            f"{yn.get(ni.get('0.05'), '')} | {train_seconds_text(row['train'])} | {row['store']['bytes_per_doc']:,.0f} |"
        )
    lines += [
        "",
        f"NI: non-inferior to bert on {PRIMARY} at that margin (MORES paper's test, one-sided p < 0.05). "
        "p vs bert: two-sided paired t-test. train s: compressor pre-training + training, wall clock, on the "
        "machine below (cached checkpoints keep the time of the run that trained them; * = resumed "
        "after an interruption, the last invocation's time only).",
        "",
        "## S1 vs S2",
        "",
    ]
    for c in result["s1_s2"] or [{"model": "(no MORES model with both strategies)", "identical": None}]:
        if c["identical"] is None:
            lines.append(f"- {c['model']}")
            continue
        lines.append(f"- {c['model']}: {s1_s2_text(c)}")
    lines += ["", "## The served score (with priors) against what a user would build instead", ""]
    lines += [
        f"Baselines computed in this run on the same queries and BM25 top-{s['depth']}: the bi-encoder alone "
        f"(all-MiniLM-L6-v2, mean-pooled, 256 pieces: the store's dense field), {FUSION} (z-scored linear "
        "fusion, weight chosen on the held-out validation queries: "
        f"{fmt_weights(result['baselines'][FUSION]['weights'])}) and RRF (k = 60). Priors: weights fitted per "
        "checkpoint on the same validation queries (aheadrank/priors.py).",
        "",
        f"| run | {PRIMARY} | MRR@10 | vs BM25 (diff, p) | vs {FUSION} (diff, p) | weights |",
        "|---|---:|---:|---|---|---|",
        f"| bm25 | {fmt(bm[PRIMARY])} | {fmt(bm['MRR@10'])} | | | |",
    ]
    for name, row in result["baselines"].items():
        lines.append(
            f"| {name} | {fmt(row['metrics'][PRIMARY])} | {fmt(row['metrics']['MRR@10'])} | "
            f"{diff_p(row['vs_bm25'])} | | {fmt_weights(row.get('weights'))} |"
        )
    for name, row in result["rankers"].items():
        lines.append(
            f"| {name} | {fmt(row['metrics'][PRIMARY])} | {fmt(row['metrics']['MRR@10'])} | "
            f"{diff_p(row['vs_bm25'])} | {diff_p(row['vs_fusion'])} | "
            f"{fmt_weights((row['priors'] or {}).get('neural+bm25+dense')) if not row['pure'] else 'pure'} |"
        )
    for zs in result.get("zero_shot", []):
        lines += [
            "",
            f"### Zero-shot: {zs['name']} ({zs['queries']} test queries, BM25 top-{s['depth']}; "
            f"checkpoints, priors and the fusion weight from {s['collection_name']})",
            "",
            f"| run | {PRIMARY} | MRR@10 | vs BM25 (diff, p) | vs {FUSION} (diff, p) |",
            "|---|---:|---:|---|---|",
        ]
        for name, row in zs["rows"].items():
            lines.append(
                f"| {name} | {fmt(row['metrics'][PRIMARY])} | {fmt(row['metrics']['MRR@10'])} | "
                f"{diff_p(row['vs_bm25'])} | {diff_p(row['vs_fusion'])} |"
            )
    lines += ["", "## Goals", ""]
    lines += [f"- {g['goal']}: **{status_text(g['status'])}** — {g['detail']}" for g in result["goals"]]
    lines += ["", GOAL_RULES, "", "## Training", ""]
    lines.append(
        "| checkpoint | steps | lr | loss first→last 10% | best val nDCG@10 (step) | BM25 on val | seconds |"
    )
    lines.append("|---|---:|---:|---|---|---:|---:|")
    for name, t in result["checkpoints"].items():
        lines.append(
            f"| {name} | {t['steps']} | {t['key']['train']['lr']:g} | {fmt(t['loss_first'])} → {fmt(t['loss_last'])} | "
            f"{fmt(t['best_val_ndcg10'])} ({t['best_step']}) | {fmt(t['val_bm25_ndcg10'])} | {train_seconds_text(t)} |"
        )
    lines += [
        "",
        "## Command",
        "",
        f"    {result['command']}",
        "",
        f"Settings: `{json.dumps({k: v for k, v in s.items() if k != 'collection_name'})}`",
        "",
        "## Machine",
        "",
        f"`{json.dumps(result['machine'])}`",
        "",
        f"Wall time {result['wall_s']:.0f} s.",
        "",
    ]
    path.write_text("\n".join(lines))


# ---- main -------------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rankers", nargs="+", default=None, help="variant names or globs (default: all)")
    ap.add_argument("--collection", type=Path, default=None, help="BEIR directory (default: shared SciFact)")
    ap.add_argument("--train-split", default="train")
    ap.add_argument("--split", default="test", help="qrels split of the evaluated queries")
    ap.add_argument(
        "--max-queries",
        type=int,
        default=None,
        help="evaluate only the first N queries of --collection and of each --eval-collections",
    )
    ap.add_argument("--depth", type=int, default=100, help="BM25 candidates re-ranked per query")
    ap.add_argument(
        "--recipe",
        default="auto",
        choices=("auto", *RECIPES),
        help="the training recipe whose settings fill every training option not given (rankers/recipe.py); "
        "auto: gpu with a CUDA --device, else cpu",
    )
    # every training option `aheadrank train` has, declared once (rankers/recipe.py training_options); the
    # pseudo-query stage is not run here
    add_options(ap, training_options(), exclude=("pseudo_steps",))
    for kind in KINDS:
        ap.add_argument(
            f"--lr-{kind}", type=float, default=None, help=f"{kind}'s own learning rate (default: --lr)"
        )
        ap.add_argument(
            f"--fresh-lr-{kind}",
            type=float,
            default=None,
            help=f"{kind}'s learning rate of the parameters that start from scratch (default: --fresh-lr)",
        )
    ap.add_argument(
        "--eval-collections",
        nargs="*",
        type=Path,
        default=None,
        help="BEIR directories evaluated zero-shot with the checkpoints trained on --collection "
        f"(default: {', '.join(ZERO_SHOT)} under ../shared/data when there; none with --quick)",
    )
    ap.add_argument(
        "--eval-rankers",
        nargs="*",
        default=None,
        help="variants (names or globs) evaluated zero-shot on --eval-collections (default: all)",
    )
    ap.add_argument(
        "--sim",
        nargs="*",
        choices=("mores", "prettr"),
        default=None,
        help="the kinds trained with the similarity residual (score + α·cos of pooled query and document, "
        "zero-initialised head: they start from the base's bi-encoder similarity); default and bare --sim: "
        "mores and prettr (init-ranker's default)",
    )
    ap.add_argument(
        "--no-sim", dest="sim", action="store_const", const=["none"], help="no similarity residual"
    )
    ap.add_argument("--max-query-len", type=int, default=16)
    ap.add_argument("--max-doc-len", type=int, default=None, help="word pieces per document read")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--workdir", type=Path, default=REPO / "work" / "bench-effectiveness")
    ap.add_argument("--out-dir", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--quick", action="store_true", help="smoke run: bundled sample, tiny budget, 5 variants")
    ap.add_argument(
        "--rejudge",
        type=Path,
        default=None,
        help="only rewrite this effectiveness.json (and its .md) with the goals judged by the current rules",
    )
    ap.add_argument("--keep-train-state", action="store_true", help="keep the optimizer state after training")
    ap.add_argument("--no-progress", dest="progress", action="store_false")
    ap.add_argument("--base", default=None, help=argparse.SUPPRESS)  # tests: a tiny random BERT
    args = ap.parse_args(argv)
    from aheadrank.rankers.recipe import recipe_for

    args.recipe = recipe_for(args.device, args.recipe)
    if args.max_doc_len is None:
        args.max_doc_len = QUICK_BENCH["max_doc_len"] if args.quick else args.recipe.max_doc_len
    if args.max_queries is None and args.quick:
        args.max_queries = QUICK_BENCH["max_queries"]
    if args.collection is None:
        args.collection = SAMPLE if args.quick or not SHARED_SCIFACT.is_dir() else SHARED_SCIFACT
    args.collection = args.collection.resolve()
    args.rankers = args.rankers or list(QUICK_RANKERS if args.quick else ALL_RANKERS)
    if args.eval_collections is None:
        shared = REPO.parent / "shared" / "data"
        args.eval_collections = [] if args.quick else [shared / n for n in ZERO_SHOT if (shared / n).is_dir()]
    args.eval_collections = [c.resolve() for c in args.eval_collections]
    args.workdir = args.workdir.resolve()
    return args


def judge(result: dict) -> dict:
    """(Re)judge a result's goals by the current rules, from the numbers it holds."""
    rows, bm25, baselines = result["rankers"], result["bm25"], result["baselines"]
    result["goals"] = goal_verdicts(rows, bm25, baselines) + prior_goals(
        rows, bm25, baselines, result.get("zero_shot") or []
    )
    result["goal_rules"] = GOAL_RULES
    return result


def rejudge(path: Path) -> int:
    """Rewrite an effectiveness.json (and the .md beside it) with its goals judged by the current rules; the
    measurements are not touched."""
    result = judge(read_json(path))
    write_json(path, result)
    write_markdown(path.with_suffix(".md"), clean(result))
    for goal in result["goals"]:
        print(f"goal: {goal['goal']}: {status_text(goal['status'])} — {goal['detail']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("aheadrank.train").setLevel(logging.WARNING)  # one line per stage is ours
    args = parse_args(argv)
    if args.rejudge:
        return rejudge(args.rejudge)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    variants = select_variants(args.rankers)
    sim_kinds = [] if args.sim == ["none"] else (args.sim or ["mores", "prettr"])
    variants = [  # explicit either way, so that a checkpoint's cache key says which
        replace(v, options={**v.options, "sim": v.kind in sim_kinds}) if v.kind in ("mores", "prettr") else v
        for v in variants
    ]
    args.workdir.mkdir(parents=True, exist_ok=True)
    stage(
        f"{len(variants)} variants on {args.collection} ({args.split}); workdir {args.workdir}; out {args.out_dir}"
    )

    from aheadrank.evaluation import per_query, write_run

    bm25_hits = Bm25Hits(args.collection, args.workdir, args.progress)
    queries, qrels = eval_topics(args.collection, args.split, args.max_queries)
    t0 = time.perf_counter()
    candidates = bm25_hits.hits(queries, args.depth)
    bm25_run = {q: {d: float(s) for d, s in hits} for q, hits in candidates.items()}
    runs_dir = args.out_dir / "runs"
    write_run(runs_dir / "bm25.trec", bm25_run, "bm25")
    stage(f"bm25: {len(queries)} {args.split} queries, top-{args.depth} in {time.perf_counter() - t0:.1f} s")
    run_key = {
        "collection": str(args.collection),
        "index": str(bm25_index_path(args.collection, args.workdir)),
        "split": args.split,
        "queries": digest(sorted(queries)),
        "depth": args.depth,
    }

    data = TrainingDataCache(args.collection, args.train_split, bm25_hits)
    dense_store = ensure_dense_store(args.collection, args.base or "", args)
    val = validation_set(data, args)
    baselines, fusion_w, fusion_val = baseline_runs(dense_store, queries, candidates, qrels, val, args)
    for name, run in baselines.items():
        write_run(runs_dir / f"{name}.trec", run, name)
    reference = resolved_training(args, "bert").train  # the options every kind shares (validation, teacher)
    if reference.listwise_weight > 0:
        data.set_teacher(fusion_w, dense_store, args.base)
    checkpoints: dict[str, dict] = {}
    runs: dict[str, dict] = dict(baselines)
    rows: dict[str, dict] = {}
    stores: dict[str, dict] = {}
    for variant in variants:
        if variant.model not in checkpoints:
            teacher = checkpoints.get("bert") if variant.kind != "bert" else None
            checkpoints[variant.model] = ensure_checkpoint(variant, args, data, teacher)
        ckpt = checkpoints[variant.model]
        store = ensure_store(variant, ckpt, args, dense=dense_store)
        stores[variant.name] = store
        priors = ensure_priors(variant, ckpt, store, val, args)
        both = ensure_runs(variant, ckpt, store, queries, candidates, args, run_key, priors)
        rerank = both[2]
        for pure, run in ((True, both[0]), (False, both[1])):
            name = variant.name if pure else f"{variant.name}+priors"
            write_run(runs_dir / f"{name}.trec", run, name)
            runs[name] = run
            rows[name] = {
                "model": variant.model,
                "kind": variant.kind,
                "options": variant.options,
                "strategy": store["strategy"],
                "pure": pure,
                "priors": None if pure else priors["weights"],
                "checkpoint": ckpt["checkpoint"],
                "fingerprint": ckpt["fingerprint"],
                "run_file": str(runs_dir / f"{name}.trec"),
                "train": {k: v for k, v in ckpt.items() if k not in ("key", "checkpoint", "fingerprint")},
                "store": store,
                "rerank": {k: v for k, v in rerank.items() if k != "key"},
            }

    stage("evaluate")
    pq_bm25 = per_query(bm25_run, qrels, METRICS)
    pq = {name: per_query(run, qrels, METRICS) for name, run in runs.items()}

    def means(values: dict) -> dict:
        return {m: sum(v.values()) / len(v) for m, v in values.items()}

    for name, row in rows.items():
        ref = "bert" if row["pure"] else "bert+priors"
        row["metrics"] = means(pq[name])
        row["vs_bert"] = comparison(pq[ref], pq[name]) if name != ref else None
        row["vs_bm25"] = comparison(pq_bm25, pq[name])
        row["vs_fusion"] = comparison(pq[FUSION], pq[name])
    bm25 = {"metrics": means(pq_bm25), "run_file": str(runs_dir / "bm25.trec")}
    bm25["vs_bert"] = comparison(pq["bert"], pq_bm25)
    baseline_rows = {
        name: {
            "metrics": means(pq[name]),
            "vs_bm25": comparison(pq_bm25, pq[name]),
            "run_file": str(runs_dir / f"{name}.trec"),
        }
        for name in baselines
    }
    baseline_rows[FUSION]["weights"] = fusion_w
    baseline_rows[FUSION]["val_ndcg10"] = fusion_val
    zs_variants = [
        v
        for v in variants
        if not args.eval_rankers or any(fnmatch.fnmatch(v.name, p) for p in args.eval_rankers)
    ]
    zero_shot = [
        zero_shot_eval(coll, zs_variants, checkpoints, fusion_w, args) for coll in args.eval_collections
    ]
    s1_s2 = []
    for model in dict.fromkeys(v.model for v in variants):
        for suffix in ("", "+priors"):  # the pure runs, and the served runs with the same priors
            s1, s2 = f"{model}-s1{suffix}", f"{model}-s2{suffix}"
            if s1 in runs and s2 in runs:
                check = same_ranking(runs[s1], runs[s2])
                s1_s2.append({"model": f"{model}{suffix}", "s1": s1, "s2": s2, **check})
    compressor = resolved_training(args, "prettr")  # a new PreTTR compressor's stages
    result = {
        "command": shlex.join(
            [".venv/bin/python", "bench/effectiveness.py", *(argv if argv is not None else sys.argv[1:])]
        ),
        "settings": {
            "collection": str(args.collection),
            "collection_name": args.collection.name,
            "train_split": args.train_split,
            "split": args.split,
            "queries": len(queries),
            "max_queries": args.max_queries,
            "bm25_hits": bm25_hits.key,
            "evaluated_queries": len(pq_bm25[PRIMARY]),
            "depth": args.depth,
            "recipe": None if args.quick else args.recipe.name,
            "steps": reference.steps,
            "queries_per_step": reference.queries_per_step,
            "group_size": reference.group_size,
            "grad_accum": reference.grad_accum,
            "lr": {k: resolved_training(args, k).train.lr for k in KINDS},
            "eval_every": reference.eval_every,
            "val_queries": reference.val_queries,
            "compressor_steps": compressor.compressor_steps,
            "compressor_init": compressor.compressor_init,
            "distill_weight": resolved_training(args, "mores").train.distill_weight,
            "listwise_weight": reference.listwise_weight,
            "listwise_temperature": reference.listwise_temperature,
            "ce_weight": reference.ce_weight,
            "eval_collections": [str(c) for c in args.eval_collections],
            "eval_rankers": args.eval_rankers,
            "freeze_embeddings": reference.freeze_embeddings,
            "sim": sim_kinds,
            "cpu_amp": reference.cpu_amp,
            "seed": reference.seed,
            "max_query_len": args.max_query_len,
            "max_doc_len": args.max_doc_len,
            "base": args.base or "all-MiniLM-L6-v2 (packaged)",
            "quick": args.quick,
            "margins": list(MARGINS),
            "workdir": str(args.workdir),
        },
        "machine": machine(args.device),
        "bm25": bm25,
        "rankers": rows,
        "checkpoints": {
            k: {kk: vv for kk, vv in v.items() if kk not in ("fingerprint",)} for k, v in checkpoints.items()
        },
        "s1_s2": s1_s2,
        "baselines": baseline_rows,
        "validation": {"queries": len(val["queries"]), "qids_digest": digest(sorted(val["queries"]))},
        "zero_shot": zero_shot,
        "wall_s": time.perf_counter() - t_start,
    }
    judge(result)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    write_json(args.out_dir / "effectiveness.json", result)
    write_markdown(args.out_dir / "effectiveness.md", clean(result))
    print_table(clean(result))
    stage(f"wrote {args.out_dir / 'effectiveness.json'} and effectiveness.md ({result['wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
