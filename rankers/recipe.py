"""The one training recipe (the CLI's ``train`` and ``pretrain-compressor``, the demo and the benchmarks):
PreTTR's compressor pre-trained alone first when asked (attention MSE, eq. 2), then the whole ranker
fine-tuned, keeping the best checkpoint by validation; with no fine-tuning steps the model is saved as it is.
"""

from __future__ import annotations

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
    train,
)


@dataclass
class Trained:
    result: TrainResult | None  # None: not fine-tuned (the model was saved as it is)
    compressor_losses: list[float] = field(default_factory=list)
    compressor_seconds: float = 0.0
    seconds: float = 0.0  # compressor and fine-tuning together


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
) -> Trained:
    """Pre-train the compressor (``compressor_steps`` > 0), then train for ``cfg.steps`` into ``out``
    (:func:`rankers.training.train`); without ``fine_tune`` save the model to ``out`` as it is, with ``extra``
    (plus the compressor's record)."""
    t0 = time.perf_counter()
    losses: list[float] = []
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
    result = None
    if fine_tune:
        result = train(model, data, out, cfg, teacher=teacher, progress=progress)
    else:
        extra = dict(extra or {})
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
    return Trained(result, losses, t1 - t0, time.perf_counter() - t0)
