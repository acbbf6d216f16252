"""The ``--device`` every command takes, checked before any work: one line saying why a device cannot be used
(not a device, a kind aheadrank does not run on, CUDA absent or a CUDA index past the last GPU) instead of a
torch traceback from wherever the first tensor is moved (``aheadrank build --device cuda`` on a CPU-only torch
used to fail that way after its collection stage)."""

from __future__ import annotations

from aheadrank.errors import AheadrankError


def check_device(name: str, *, auto: bool = False) -> str:
    """``name`` if this machine can run on it: ``cpu``, ``cuda`` or ``cuda:N`` (with ``auto``, also ``auto``,
    resolved to ``cuda`` where a GPU is visible, else ``cpu``); else :class:`AheadrankError`."""
    if name == "cpu":
        return name  # the default of every command: no torch import to say so
    import torch

    choices = "cpu, cuda or cuda:N" + (" or auto" if auto else "")
    if auto and name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise AheadrankError(f"--device {name}: not a device; use {choices}") from None
    if device.type == "cpu":
        return name
    if device.type != "cuda":
        raise AheadrankError(f"--device {name}: aheadrank runs on {choices}, not {device.type}")
    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise AheadrankError(
            f"--device {name}: CUDA is not available on this machine ({why}); use --device cpu"
        )
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise AheadrankError(
            f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), cuda:0 to "
            f"cuda:{torch.cuda.device_count() - 1}"
        )
    return name
