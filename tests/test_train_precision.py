"""Training on the CPU uses bfloat16 autocast only where the CPU has it in hardware; bench/train_precision.py
times both precisions side by side."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import aheadrank.rankers.training as training
import pytest
import torch
from aheadrank.rankers.training import TrainConfig, autocast_context

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import train_precision  # noqa: E402


@pytest.mark.parametrize("native", [True, False])
def test_cpu_autocast_only_where_bfloat16_is_in_hardware(monkeypatch, native):
    monkeypatch.setattr(training, "cpu_bf16_native", lambda: native)
    with autocast_context(torch.device("cpu"), TrainConfig(cpu_amp=True))():
        y = torch.nn.Linear(4, 4)(torch.ones(2, 4))
    assert y.dtype == (torch.bfloat16 if native else torch.float32)
    with autocast_context(torch.device("cpu"), TrainConfig(cpu_amp=False))():  # not asked: never
        assert torch.nn.Linear(4, 4)(torch.ones(2, 4)).dtype == torch.float32


def test_the_probe_answers_on_any_torch(monkeypatch):
    assert isinstance(training.cpu_bf16_native(), bool)
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert training.cpu_bf16_native() is False


def test_bench_times_both_precisions_alternately(tiny_base, tmp_path, monkeypatch):
    out = tmp_path / "out"
    argv = ["--variant", "mores-2ib-s2", "--base", str(tiny_base), "--steps", "1", "--repeats", "1"]
    assert train_precision.main([*argv, "--threads", "1", "--out", str(out)]) == 0
    record = json.loads((out / "train_precision.json").read_text())
    assert [r["precision"] for r in record["runs"]] == ["float32", "bfloat16"]
    assert all(r["s_per_step"] > 0 and r["last_loss"] is not None for r in record["runs"])
    assert record["ratio"] == pytest.approx(record["median"]["bfloat16"] / record["median"]["float32"])
    assert training.cpu_bf16_native is not None and record["bf16_native"] == training.cpu_bf16_native()
    md = (out / "train_precision.md").read_text()
    assert "| float32 | 1 |" in md and "| bfloat16 | 1 |" in md and "bfloat16 / float32:" in md
    # the step at the reference speed: its seconds over the mean of the speed probes taken before and after
    assert len(record["probe_scales"]) == 2 and all(x > 0 for x in record["probe_scales"])
    scale = sum(record["probe_scales"]) / 2
    for p in ("float32", "bfloat16"):
        assert record["reference_s_per_step"][p] == pytest.approx(record["median"][p] / scale)


def test_bench_times_one_precision_alone(tiny_base, tmp_path):
    out = tmp_path / "out"
    argv = ["--base", str(tiny_base), "--steps", "1", "--repeats", "2", "--precisions", "float32"]
    assert train_precision.main([*argv, "--threads", "1", "--out", str(out)]) == 0
    record = json.loads((out / "train_precision.json").read_text())
    assert [r["precision"] for r in record["runs"]] == ["float32", "float32"] and record["ratio"] is None
    md = (out / "train_precision.md").read_text()
    assert "| float32 | 2 |" in md and "bfloat16" not in md.split("\n", 1)[1].replace(
        "bfloat16 in hardware", ""
    )
