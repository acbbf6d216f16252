"""Compiling a C source for this CPU on first use (for :mod:`ctypes`): the build machinery the rankers' kernels
(``aheadrank/kernels/native.py``) and the store's decoder (``store/native.py``) share.

A source is compiled with the machine's C compiler (``$CC``, else ``cc``/``gcc``) and the caller's flags, then
linked in a second step with the caller's link flags; the shared library goes under ``$AHEADRANK_NATIVE_CACHE``
(default ``$XDG_CACHE_HOME/aheadrank/native``), named by the caller's prefix and a hash of the source, the
compiler, the flags and the CPU's model and feature flags, so a cache shared between machines never hands one
CPU another's build. ``AHEADRANK_NATIVE=0`` switches every compiled part off (its callers run their Python code).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("aheadrank.native")

ENVIRONMENT = "AHEADRANK_NATIVE"  # 0 / false / no / off: the compiled parts are off (read at every call)


def enabled() -> bool:
    return os.environ.get(ENVIRONMENT, "1").strip().lower() not in ("0", "false", "no", "off", "none")


def cpu_signature() -> str:
    """The CPU's model and feature flags (what -march=native compiles for)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    keep = [ln for ln in lines if ln.startswith(("model name", "flags", "Features", "CPU part"))]
    return platform.machine() + "\n" + "\n".join(dict.fromkeys(keep))


def compiler() -> str | None:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    return cc if cc and shutil.which(cc) else None


def cache_dir() -> Path:
    if os.environ.get("AHEADRANK_NATIVE_CACHE"):
        return Path(os.environ["AHEADRANK_NATIVE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "aheadrank" / "native"


def build_with(
    cc: str, flags: tuple[str, ...], link_flags: tuple[str, ...], source: Path, prefix: str = "kernels"
) -> Path:
    """The shared library of ``source`` (``<prefix>-<hash>.so`` in :func:`cache_dir`, compiled unless built
    before). Raises RuntimeError (with the compiler's message) when a step fails."""
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=60).stdout
    key = hashlib.sha256(
        "\0".join([source.read_text(), cc, version, " ".join(flags + link_flags), cpu_signature()]).encode()
    ).hexdigest()[:20]
    target = cache_dir() / f"{prefix}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # compiled beside the target and renamed into place: concurrent builders never load a half-written file
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        obj = tmp[:-3] + ".o"
        for cmd in ([cc, *flags, "-c", str(source), "-o", obj], [cc, *link_flags, obj, "-o", tmp, "-lm"]):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise RuntimeError(
                    f"{' '.join(cmd)} exited with {done.returncode}: {done.stderr.strip()[-2000:]}"
                )
        os.replace(tmp, target)
    finally:
        for path in (tmp, tmp[:-3] + ".o"):
            if os.path.exists(path):
                os.unlink(path)
    log.info("compiled %s -> %s", source.name, target)
    return target


def load_or_none(load: Callable[[str], ctypes.CDLL], what: str, instead: str) -> ctypes.CDLL | None:
    """``load(cc)`` with this machine's compiler, or None where there is none or the build or load fails: logged
    as a warning (``what`` is unavailable, ``instead`` runs), for the callers to cache so that it is said once."""
    cc = compiler()
    if cc is None:
        log.warning("no C compiler found ($CC, cc, gcc): %s unavailable, %s", what, instead)
        return None
    try:
        return load(cc)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        log.warning("%s unavailable, %s: %s", what, instead, e)
        return None
