"""The one training recipe (the CLI's ``train`` and ``pretrain-compressor``, the demo and the benchmarks):
PreTTR's compressor pre-trained alone first when asked (attention MSE, eq. 2), then (PreTTR with the
similarity residual) its pooled map fitted to the base bi-encoder on a sample of the collection's documents,
then the whole ranker fine-tuned, keeping the best checkpoint by validation; with no fine-tuning steps the
model is saved as it is.
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aheadrank.rankers.base import Ranker
from aheadrank.rankers.checkpoint import save_checkpoint
from aheadrank.rankers.training import (
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
POOL_DOCS = 2048  # documents PreTTR's pooled map is fitted on
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

    def fits_kernels(self, kind: str, tk_base: bool | None) -> bool:
        """Whether a ranker of ``kind`` (TK: from the base or not) gets its kernel weights fitted."""
        if kind != "tk":
            return False
        return self.fit_kernels if self.fit_kernels is not None else bool(tk_base)

    def lr_for(self, kind: str) -> float:
        return self.lr_tk if kind == "tk" else self.lr


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


def train_config(rec: Recipe, kind: str, **overrides: Any) -> TrainConfig:
    """The :class:`TrainConfig` of ``rec`` for a ranker of ``kind`` (its learning rate), with ``overrides``
    (TrainConfig fields) on top: the one place a recipe becomes training options."""
    cfg = TrainConfig(
        steps=rec.steps,
        group_size=rec.group_size,
        queries_per_step=rec.queries_per_step,
        lr=rec.lr_for(kind),
        eval_every=rec.eval_every,
        val_queries=rec.val_queries,
        val_depth=rec.val_depth,
        listwise_weight=rec.listwise_weight,
        cpu_amp=rec.cpu_amp,
        doc_len=rec.train_doc_len,
        fresh_lr=rec.fresh_lr,
    )
    return dataclasses.replace(cfg, **overrides)


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
        model.init_compressor_pca(sample_texts(data.texts, PCA_DOCS, cfg.seed), progress=progress)
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
        pool_fit = model.fit_pool_map(sample_texts(data.texts, pool_docs, cfg.seed), progress=progress)
        pool_fit["seconds"] = round(time.perf_counter() - t1, 1)
        log.info("PreTTR pooled map fitted: %s", pool_fit)
    kernel_fit = None
    # a resumed run loads the fitted weights with its state: no second fit
    if fit_kernels and model.kind == "tk" and not state_file(out).is_file():
        t2 = time.perf_counter()
        kernel_fit = model.fit_kernel_weights(kernel_fit_lists(data, cfg))
        kernel_fit["seconds"] = round(time.perf_counter() - t2, 1)
        log.info("TK kernel weights fitted: %s", kernel_fit)
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
