"""The one training recipe (the CLI's ``train`` and ``pretrain-compressor``, the demo and the benchmarks):
PreTTR's compressor pre-trained alone first when asked (attention MSE, eq. 2), then (PreTTR with the
similarity residual) its pooled map fitted to the base bi-encoder on a sample of the collection's documents,
then the whole ranker fine-tuned, keeping the best checkpoint by validation; with no fine-tuning steps the
model is saved as it is.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aheadrank.rankers.base import Ranker
from aheadrank.rankers.checkpoint import save_checkpoint
from aheadrank.rankers.fit import fit_head as fit_score_head
from aheadrank.rankers.fit import has_head
from aheadrank.rankers.spec import OptionSpec, option, option_specs
from aheadrank.rankers.training import (
    NEGATIVE_SAMPLING,
    TrainConfig,
    TrainingData,
    TrainResult,
    loss_ends,
    pretrain_compressor,
    state_file,
    train,
)

from aheadrank.errors import AheadrankError

log = logging.getLogger("aheadrank.train")
COMPRESSOR_INITS = ("random", "pca")  # PreTTR's compressor before training (PrettrRanker.init_compressor_pca)
POOL_DOCS = 8192  # documents PreTTR's pooled map is fitted on (held-out R2 0.42 -> 0.46 over 2,048: bench/results/label-free/prettr-init/)
KERNEL_FIT_QUERIES = 200  # training queries (never validation ones) TK's kernel weights are fitted on ...
KERNEL_FIT_DEPTH = 30  # ... over their first candidates
PCA_DOCS = 512  # documents whose layer-l token states PreTTR's compressor PCA is taken over (compressor_init)


@dataclass(frozen=True)
class Recipe:
    """A measured training budget and its settings (issue 14; ``bench/results/ablation.md`` has what each
    setting did): what ``aheadrank train`` and ``bench/effectiveness.py`` use unless told otherwise."""

    name: str
    steps: int
    queries_per_step: int
    group_size: int
    lr: float
    lr_tk: float  # TK's contextualisation layers and kernels start from scratch: a larger rate
    listwise_weight: float  # listwise KL from the BM25 + bi-encoder fusion, beside the cross-entropy
    compressor_steps: int  # PreTTR: attention-MSE pre-training of the compressor
    compressor_init: str  # PreTTR: "pca" (decompress(compress(s)) ≈ s from the start) or "random"
    eval_every: int
    val_queries: int
    val_depth: int
    max_doc_len: int
    cpu_amp: bool  # bfloat16 autocast on CPU
    train_doc_len: int | None = None  # pieces per document while training (None: max_doc_len, what is read)
    fresh_lr: float | None = None  # lr of the parameters that start from scratch (None: the kind's lr)
    pseudo_steps: int = 0  # steps on title pseudo-queries before the judged ones (0: none)
    # TK: kernel weights ridge-fitted to the teacher before training; None: for TK from the base only (ablation
    # rows 13-14: over the base's 6 layers training from random kernel weights only hurt, the fit gives 0.627)
    fit_kernels: bool | None = None
    # TK contextualised by the base's layers (tk_base): those layers at a small rate, its kernel weights and mix
    # (fresh) at a large one. Measured on 2 CPU cores, judged SciFact (ablation rows 18-19: pure 0.706, 0.730 with
    # tk_specials); the cpu recipe's lr_tk, meant for layers from scratch, was too high for the base's (row 9).
    # The gpu recipe takes the same two rates, not measured there
    lr_tk_base: float = 2e-5
    fresh_lr_tk_base: float = 1e-3

    def fits_kernels(self, kind: str, tk_base: bool | None) -> bool:
        """Whether a ranker of ``kind`` (TK: from the base or not) gets its kernel weights fitted."""
        if kind != "tk":
            return False
        return self.fit_kernels if self.fit_kernels is not None else bool(tk_base)

    def lr_for(self, kind: str, tk_base: bool | None = None) -> float:
        """The learning rate of a ranker of ``kind`` (TK: contextualised by the base's layers or not)."""
        if kind != "tk":
            return self.lr
        return self.lr_tk_base if tk_base else self.lr_tk

    def fresh_lr_for(self, kind: str, tk_base: bool | None = None) -> float | None:
        """The rate of what starts from scratch in a ranker of ``kind`` (None: its :meth:`lr_for`)."""
        return self.fresh_lr_tk_base if kind == "tk" and tk_base else self.fresh_lr

    def init_options(
        self, given: dict[str, Any] | None = None, *, label_free: bool = False
    ) -> dict[str, Any]:
        """A new ranker's options (:func:`rankers.init_ranker` keywords): ``given`` (None: not given) with the
        recipe's document length, or ``LABEL_FREE_DOC_LEN`` for a ranker trained without judgments."""
        window = LABEL_FREE_DOC_LEN if label_free else self.max_doc_len
        return {"max_doc_len": window, **{k: v for k, v in (given or {}).items() if v is not None}}


# Word pieces a label-free ranker reads of a document (longer ones are stored as passages too), whatever the recipe:
# the GPU recipe's 256 served below 128 on Cranfield, where the window is chosen (MORES 2xIB S2, untrained start,
# 0.4115 against 0.4193 with first+max; bench/results/label-free/gpu-recipe/cranfield/), and on SciFact (0.7353
# against 0.7378, gpu-recipe/mores-cpu/), with a store 1.7x the size
LABEL_FREE_DOC_LEN = 128
# Fine-tuning steps of a ranker built without judgments unless told otherwise: none. Its start is already fitted to
# the collection (PreTTR's compressor and pooled map on its documents, TK's kernel weights on its pseudo-queries), and
# training on pseudo-queries did not improve on it: the recipe's validation on held-out pseudo-queries kept step 0
# in 8 of the 9 CPU builds measured (MORES 2xIB S2, PreTTR l5/e128, tk-6l-base x SciFact, Cranfield, Vaswani), and
# the builds where it kept a trained step served no better (MORES on Cranfield 0.4119 against 0.4193 at step 0,
# defaults-cranfield/; the GPU recipe's PreTTR on SciFact and TK on Vaswani level, gpu-recipe/; all in
# bench/results/label-free/). A build skips 16-34 minutes of training on 2 cores for that; --steps N still trains
LABEL_FREE_STEPS = 0

RECIPES = {
    # 2 CPU cores: 360 steps (3x the 120 before commit a22b566: bert 0.639 -> 0.702, MORES 2xIB 0.673 -> 0.708 on
    # SciFact, ablation rows 15-16); the whole core set, training and evaluation, in 1 h 56 min on 2 cores
    # (bench/results/cpu-core-360/). PreTTR's compressor from a PCA, no attention-MSE steps (ablation.md)
    "cpu": Recipe("cpu", 360, 8, 8, 1e-4, 5e-4, 1.0, 0, "pca", 120, 100, 20, 128, True),
    # one GPU: 8x the pairs, longer documents (SciFact abstracts are cut at 128 pieces); measured with the
    # random compressor pre-trained 150 steps (the PCA start was measured on CPU only)
    "gpu": Recipe("gpu", 240, 16, 16, 6e-5, 5e-4, 1.0, 150, "random", 60, 100, 50, 256, False),
}


def recipe_for(device: str, name: str = "auto") -> Recipe:
    """The recipe called ``name``; ``auto``: ``gpu`` on a CUDA device, else ``cpu``."""
    if name == "auto":
        name = "gpu" if str(device).startswith("cuda") else "cpu"
    if name not in RECIPES:
        raise AheadrankError(f"unknown recipe {name!r}; expected auto or one of {', '.join(RECIPES)}")
    return RECIPES[name]


@dataclass
class StageOptions:
    """The recipe's options around :func:`rankers.training.train` (None: the recipe's)."""

    compressor_steps: int | None = option(
        None, "PreTTR: attention-MSE pre-training steps of the compressor before fine-tuning"
    )
    compressor_init: str | None = option(
        None,
        "PreTTR: the compressor's start, pca (a PCA of the documents' layer-l states) or random",
        choices=COMPRESSOR_INITS,
    )
    pseudo_steps: int | None = option(
        None,
        "steps on pseudo-queries from the collection itself (each document's title as the query for its body, "
        "BM25 negatives, cross-entropy) before the judged queries; 0: none",
    )
    fit_kernels: bool | None = option(
        None,
        "TK: start the kernel weights from a ridge fit to the listwise teacher's scores (else the relevant "
        "documents) over training queries' candidates",
    )
    fit_head: bool | None = option(
        None,
        "bert, MORES, PreTTR: start the score head (and the similarity residual's weight) from a ridge fit to the "
        "listwise teacher's scores (else the relevant documents) over training queries' candidates",
    )


TRAIN_OPTIONS = tuple(f.name for f in dataclasses.fields(TrainConfig))
STAGE_OPTIONS = tuple(f.name for f in dataclasses.fields(StageOptions))
# TrainConfig fields the recipes measured: field -> the Recipe attribute that holds it (lr, fresh_lr: Recipe.lr_for,
# Recipe.fresh_lr_for)
RECIPE_FIELDS = {
    "steps": "steps",
    "group_size": "group_size",
    "queries_per_step": "queries_per_step",
    "eval_every": "eval_every",
    "val_queries": "val_queries",
    "val_depth": "val_depth",
    "listwise_weight": "listwise_weight",
    "cpu_amp": "cpu_amp",
    "doc_len": "train_doc_len",
}


def training_options() -> list[OptionSpec]:
    """Every training option as a flag (TrainConfig's fields, then the recipe's stages), each help ending with
    its default: the recipes' values where they set it. ``aheadrank train`` and ``bench/effectiveness.py``
    declare their training flags from this list."""
    out = []
    for o in option_specs(TrainConfig) + option_specs(StageOptions):
        shown = _recipe_default(o.name) or _shown(o.default)
        out.append(dataclasses.replace(o, help=f"{o.help} (default: {shown})"))
    return out


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _recipe_default(name: str) -> str | None:
    """How the recipes set an option, for its help: ``cpu 360, gpu 240`` (one value when they agree)."""
    if name == "negatives":
        return "uniform; spread for label-free training"
    if name == "fit_kernels":
        return "on for TK from the base, --tk-base"
    if name == "fit_head":
        return "off"
    if name == "lr":
        return ", ".join(
            f"{r.name} {r.lr:g} (tk {r.lr_tk:g}, tk from the base {r.lr_tk_base:g})" for r in RECIPES.values()
        )
    if name == "fresh_lr":
        return ", ".join(
            f"{r.name}: tk from the base {r.fresh_lr_tk_base:g}, else lr" for r in RECIPES.values()
        )
    attr = RECIPE_FIELDS.get(name, name if name in STAGE_OPTIONS else None)
    if attr is None:
        return None
    values = {r.name: _shown(getattr(r, attr)) for r in RECIPES.values()}
    shown = (
        ", ".join(f"{k} {v}" for k, v in values.items()) if len(set(values.values())) > 1 else values["cpu"]
    )
    if name.startswith("compressor_"):  # the recipe's for a new compressor only
        return f"{shown} for a new compressor, else {_shown(0 if name == 'compressor_steps' else 'random')}"
    if name == "steps":
        return f"{shown}; {LABEL_FREE_STEPS} for label-free training"
    return shown


@dataclass(frozen=True)
class Resolved:
    """Every training option of one run, resolved (:func:`resolve_training`)."""

    recipe: Recipe
    train: TrainConfig
    compressor_steps: int
    compressor_init: str
    pseudo_steps: int
    fit_kernels: bool
    fit_head: bool


def check_training_options(given: dict[str, Any]) -> None:
    """Refuse unknown options and bad values among those given (None: not given), before anything is read."""
    unknown = sorted(set(given) - set(TRAIN_OPTIONS) - set(STAGE_OPTIONS))
    if unknown:
        raise AheadrankError(f"unknown training options {unknown}")
    v = {k: x for k, x in given.items() if x is not None}
    if "compressor_init" in v:
        check_compressor_init(v["compressor_init"])
    if "negatives" in v and v["negatives"] not in NEGATIVE_SAMPLING:
        raise AheadrankError(f"--negatives is {' or '.join(NEGATIVE_SAMPLING)}, not {v['negatives']!r}")
    for name, low in (("steps", 0), ("pseudo_steps", 0), ("eval_every", 0), ("val_queries", 0), ("group_size", 2),
                      ("queries_per_step", 1), ("grad_accum", 1), ("val_depth", 1), ("neg_depth", 1)):  # fmt: skip
        if name in v and v[name] < low:
            raise AheadrankError(f"{name} must be {low} or more, got {v[name]}")
    # the float options: a NaN or an infinity, a negative weight or a zero temperature trains a broken model
    for name, low, above in (("lr", 0.0, False), ("fresh_lr", 0.0, False), ("weight_decay", 0.0, False),
                             ("warmup", 0.0, False), ("distill_weight", 0.0, False), ("listwise_weight", 0.0, False),
                             ("ce_weight", 0.0, False), ("listwise_temperature", 0.0, True),
                             ("max_grad_norm", 0.0, True)):  # fmt: skip
        if name in v and not (math.isfinite(v[name]) and (v[name] > low if above else v[name] >= low)):
            bound = f"above {low:g}" if above else f"{low:g} or more"
            raise AheadrankError(f"--{name.replace('_', '-')} must be a finite number {bound}, got {v[name]}")
    if "warmup" in v and v["warmup"] >= 1:
        raise AheadrankError(f"--warmup is a fraction of the steps, below 1, got {v['warmup']}")


def resolve_training(
    rec: Recipe,
    kind: str,
    given: dict[str, Any] | None = None,
    *,
    ranker: dict[str, Any] | None = None,
    fresh: bool = True,
    label_free: bool = False,
) -> Resolved:
    """Every training option of a ranker of ``kind`` under the recipe ``rec``: what is ``given`` (TrainConfig and
    StageOptions fields; None: not given) wins, then the recipe's measured value, then TrainConfig's default.
    ``ranker``: its options (a PreTTR with ``compress`` > 0 has a compressor; TK with ``tk_base`` gets its
    kernel weights fitted); ``fresh``: it starts from the base, not from a checkpoint (a compressor is
    initialised and pre-trained by the recipe only then); ``label_free``: trained on pseudo-queries (spread
    negatives). The one place a recipe becomes training options: ``aheadrank train``, ``aheadrank build`` (the
    demo, bench/label_free.py) and bench/effectiveness.py call it."""
    given = {k: v for k, v in (given or {}).items() if v is not None}
    ranker = ranker or {}
    compressor = kind == "prettr" and bool(ranker.get("compress"))
    tk_base = ranker.get("tk_base")
    check_training_options(given)
    measured = {name: getattr(rec, attr) for name, attr in RECIPE_FIELDS.items()}
    measured["lr"] = rec.lr_for(kind, tk_base)
    measured["fresh_lr"] = rec.fresh_lr_for(kind, tk_base)
    if label_free:
        measured["negatives"] = "spread"
        measured["steps"] = LABEL_FREE_STEPS
    train = {**measured, **{k: v for k, v in given.items() if k in TRAIN_OPTIONS}}
    if not train["eval_every"]:  # 0: once, at the end
        train["eval_every"] = max(1, train["steps"])
    stage = {
        "compressor_steps": rec.compressor_steps if compressor and fresh else 0,
        "compressor_init": rec.compressor_init if compressor and fresh else "random",
        "pseudo_steps": rec.pseudo_steps,
        "fit_kernels": rec.fits_kernels(kind, tk_base),
        "fit_head": False,
    }
    for name in STAGE_OPTIONS:
        # a compressor's options apply to a ranker that has one
        if name in given and (compressor or not name.startswith("compressor_")):
            stage[name] = given[name]
    return Resolved(rec, TrainConfig(**train), **stage)


def pseudo_config(cfg: TrainConfig, steps: int) -> TrainConfig:
    """The pseudo-query stage: ``cfg``'s groups and rates for ``steps`` steps, cross-entropy on the document
    whose title is the query (no teacher scores exist for titles), no validation."""
    return dataclasses.replace(
        cfg,
        steps=steps,
        eval_every=steps,
        val_queries=0,
        validate_initial=False,
        listwise_weight=0.0,
        distill_weight=0.0,
        ce_weight=1.0,
    )


def check_compressor_init(name: str) -> None:
    if name not in COMPRESSOR_INITS:
        raise AheadrankError(f"compressor init is {' or '.join(COMPRESSOR_INITS)}, not {name!r}")


def sample_texts(texts: dict[str, str], n: int, seed: int) -> list[str]:
    """``n`` of the collection's document texts (all when fewer), the same ones for the same seed."""
    docids = sorted(texts)
    return [texts[d] for d in random.Random(seed).sample(docids, min(n, len(docids)))]


@dataclass
class Trained:
    result: TrainResult | None  # None: not fine-tuned (the model was saved as it is)
    compressor_losses: list[float] = field(default_factory=list)
    compressor_seconds: float = 0.0
    pool_fit: dict | None = None  # PreTTR with sim: the pooled map's fit (PrettrRanker.fit_pool_map)
    kernel_fit: dict | None = None  # TK: the kernel weights' fit (TkRanker.fit_kernel_weights)
    head_fit: dict | None = None  # a score head's fit (rankers.fit.fit_head)
    seconds: float = 0.0  # compressor, pooled map and fine-tuning together


def train_recipe(
    model: Ranker,
    data: TrainingData,
    out: str | Path,
    cfg: TrainConfig,
    *,
    compressor_steps: int = 0,
    compressor_lr: float = 1e-3,
    compressor_batch: int = 16,
    teacher: Ranker | None = None,
    progress: bool = True,
    fine_tune: bool = True,
    extra: dict[str, Any] | None = None,
    pool_docs: int = POOL_DOCS,
    compressor_init: str = "random",
    pseudo: TrainingData | None = None,
    pseudo_steps: int = 0,
    fit_kernels: bool = False,
    fit_head: bool = False,
) -> Trained:
    """Initialise PreTTR's compressor from a PCA of the documents' layer-l states (``compressor_init="pca"``),
    pre-train it (``compressor_steps`` > 0), fit PreTTR's pooled map on ``pool_docs`` of the
    collection's documents (with ``sim``, unless fitted before: a checkpoint given as the start; 0: not fitted,
    e.g. when resuming), then train for ``cfg.steps`` into
    ``out`` (:func:`rankers.training.train`); without ``fine_tune`` save the model to ``out`` as it is, with
    ``extra`` (plus the compressor's and the map's records)."""
    t0 = time.perf_counter()
    losses: list[float] = []
    check_compressor_init(compressor_init)
    if compressor_init == "pca" and model.kind == "prettr" and model.config.compress:
        model.init_compressor_pca(sample_texts(data.documents(), PCA_DOCS, cfg.seed), progress=progress)
    if compressor_steps:
        losses = pretrain_compressor(
            model,
            data,
            steps=compressor_steps,
            lr=compressor_lr,
            batch=compressor_batch,
            seed=cfg.seed,
            progress=progress,
        )
    t1 = time.perf_counter()
    pool_fit = None
    fitted = "pool_map" in model.config.extra and not compressor_steps  # a new compressor needs a new map
    if pool_docs and model.kind == "prettr" and model.config.sim and not fitted:
        pool_fit = model.fit_pool_map(sample_texts(data.documents(), pool_docs, cfg.seed), progress=progress)
        pool_fit["seconds"] = round(time.perf_counter() - t1, 1)
        log.info("PreTTR pooled map fitted: %s", pool_fit)
    kernel_fit = None
    # a resumed run loads the fitted weights with its state: no second fit
    if fit_kernels and model.kind == "tk" and not state_file(out).is_file():
        t2 = time.perf_counter()
        kernel_fit = model.fit_kernel_weights(kernel_fit_lists(data, cfg))
        kernel_fit["seconds"] = round(time.perf_counter() - t2, 1)
        log.info("TK kernel weights fitted: %s", kernel_fit)
    head_fit = None
    if fit_head and has_head(model) and not state_file(out).is_file():  # after the pooled map it reads
        t3 = time.perf_counter()
        head_fit = fit_score_head(model, kernel_fit_lists(data, cfg))
        head_fit["seconds"] = round(time.perf_counter() - t3, 1)
        log.info("score head fitted: %s", head_fit)
    result = None
    record: dict[str, Any] = dict(extra or {}) if fine_tune else {}
    if pseudo_steps < 0:
        raise AheadrankError(f"pseudo_steps must be 0 or more, got {pseudo_steps}")
    if pseudo_steps:
        if pseudo is None:
            raise AheadrankError("pseudo_steps > 0 needs the pseudo-query training data")
        pre = pseudo_config(cfg, pseudo_steps)
        out = Path(out)
        done = train(model, pseudo, out.parent / f"{out.name}.pseudo", pre, progress=progress)
        first, last = loss_ends([h["loss"] for h in done.history])
        record["pseudo"] = {
            "kind": "title",
            "queries": len(pseudo.queries),
            "steps": pseudo_steps,
            "loss_first": first,
            "loss_last": last,
            "seconds": round(done.seconds, 1),
        }
    if fine_tune:
        result = train(model, data, out, cfg, teacher=teacher, progress=progress, record=record)
    else:
        extra = {**(extra or {}), **record}
        if compressor_steps:
            first, last = loss_ends(losses)
            extra["compressor"] = {
                "steps": compressor_steps,
                "lr": compressor_lr,
                "batch": compressor_batch,
                "seed": cfg.seed,
                "loss_first": first,
                "loss_last": last,
            }
        save_checkpoint(model, out, overwrite=True, extra=extra)
    return Trained(
        result,
        losses,
        compressor_seconds=t1 - t0,
        pool_fit=pool_fit,
        kernel_fit=kernel_fit,
        head_fit=head_fit,
        seconds=time.perf_counter() - t0,
    )


def kernel_fit_lists(data: TrainingData, cfg: TrainConfig) -> list[tuple[str, list[str], list[float]]]:
    """What TK's kernel weights are fitted to: for :data:`KERNEL_FIT_QUERIES` training queries (the validation
    ones of ``cfg`` left out) their first :data:`KERNEL_FIT_DEPTH` candidates, scored by the listwise teacher
    when there is one, else 1 for a judged-relevant document and 0 for the rest."""
    from aheadrank.rankers.training import split_queries

    train_q, _ = split_queries(data, cfg.val_queries, cfg.seed)
    chosen = sorted(random.Random(cfg.seed).sample(train_q, min(KERNEL_FIT_QUERIES, len(train_q))))
    lists = []
    for q in chosen:
        docs = data.candidates[q][:KERNEL_FIT_DEPTH]
        if data.teacher is not None:
            floor = min(data.teacher[q].values())
            target = [data.teacher[q].get(d, floor) for d in docs]
        else:
            target = [float(data.qrels[q].get(d, 0) > 0) for d in docs]
        lists.append((data.queries[q], [data.texts[d] for d in docs], target))
    return lists
