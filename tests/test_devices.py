"""``--device``: checked where it is parsed, one line saying why a device cannot be used, never a torch traceback."""

from __future__ import annotations

import pytest
import torch
from aheadrank.services.backend import resolve_device
from typer.testing import CliRunner

from aheadrank.cli import app
from aheadrank.devices import check_device
from aheadrank.errors import AheadrankError


def test_cpu_and_auto_resolve_and_a_non_device_is_named():
    assert check_device("cpu") == "cpu" and check_device("cpu:0") == "cpu:0"
    assert check_device("auto", auto=True) == ("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("tpu", "cuda:x", "", "auto"):  # auto only where the command resolves it (the service)
        with pytest.raises(AheadrankError, match="not a device; use cpu, cuda or cuda:N$"):
            check_device(bad)
    with pytest.raises(AheadrankError, match="runs on cpu, cuda or cuda:N, not meta"):
        check_device("meta")
    with pytest.raises(AheadrankError, match="not a device; use cpu, cuda or cuda:N or auto$"):
        resolve_device("tpu")


def test_cuda_without_a_gpu_and_past_the_last_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", None)
    with pytest.raises(
        AheadrankError, match=r"CUDA is not available on this machine \(this torch is built without"
    ):
        check_device("cuda")
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    with pytest.raises(AheadrankError, match=r"\(no GPU is visible\); use --device cpu"):
        check_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert check_device("cuda") == "cuda" and check_device("cuda:1") == "cuda:1"
    with pytest.raises(AheadrankError, match="this machine has 2 CUDA device.s., cuda:0 to cuda:1"):
        check_device("cuda:2")


@pytest.mark.parametrize(
    "command",
    [
        ["build", "--collection", "missing.jsonl", "--out", "o"],
        ["index", "--checkpoint", "c", "--collection", "missing.jsonl", "--store", "s"],
        ["train", "--ranker", "mores", "--collection", "missing", "--index", "i", "--out", "o"],
    ],
)
def test_every_command_refuses_a_device_it_cannot_use_before_any_work(command, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)

    def said(args, **kw) -> str:  # the error box's text on one line
        result = CliRunner().invoke(app, args, **kw)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        return " ".join(result.output.replace("│", " ").split())

    assert "not a device; use cpu, cuda or cuda:N" in said([*command, "--device", "tpu"])
    if not torch.cuda.is_available():
        assert "CUDA is not available on this machine" in said([*command, "--device", "cuda"])
    assert "AHEADRANK_DEVICE" in said(command, env={"AHEADRANK_DEVICE": "tpu"})
    assert list(tmp_path.iterdir()) == []  # nothing was made


def test_every_device_option_is_checked_as_it_is_parsed():
    """Each command's --device goes through the one check (aheadrank.cli.options.device_opt); `serve` takes its
    device from its settings (auto by default) and checks it with the same function (resolve_device)."""
    import typer

    from aheadrank.cli.options import _checked_device

    def commands(group):
        for name, command in group.commands.items():
            yield from commands(command) if hasattr(command, "commands") else [(name, command)]

    with_device = {
        name: param
        for name, command in commands(typer.main.get_command(app))
        for param in command.params
        if "--device" in getattr(param, "opts", ())
    }
    assert {"build", "index", "train", "rerank-run", "fit-priors", "pretrain-compressor"} <= set(with_device)
    unchecked = [
        name
        for name, p in with_device.items()
        if getattr(p.callback, "__wrapped__", None) is not _checked_device and name != "serve"
    ]
    assert unchecked == []


def test_the_build_api_checks_its_device_too(tmp_path):
    from aheadrank.build import BuildPlan, build

    with pytest.raises(AheadrankError, match="not a device"):
        build(BuildPlan(str(tmp_path / "c.jsonl"), str(tmp_path / "o"), device="tpu"), echo=lambda _: None)
    assert not (tmp_path / "o").exists()


def test_auto_is_a_device_for_every_command_as_for_serve():
    """``--device auto`` (``AHEADRANK_DEVICE=auto``, serve's default) is cuda where a GPU is visible, else cpu, for
    the batch commands too: a shell that exports it for serve no longer makes build and train refuse it."""
    import torch

    from aheadrank.cli.options import _checked_device

    assert _checked_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
