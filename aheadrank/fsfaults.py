"""Filesystem faults for the builds: one exclusive lock per build target, the cause of an OSError in words (disk
full, read-only, permission denied), so that a failed build ends in one ``error:`` line, and the one atomic file
write every part uses (:func:`atomic_write`: the file whole or as it was, whatever stops the process), and the one
checksum of a written file (:func:`sha256_file`, :func:`sha256_fd` on an open one) the store and the checkpoints
verify against."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from aheadrank.errors import AheadrankError

_CAUSES = {
    errno.ENOSPC: "the disk is full (no space left on device)",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOTDIR: "a parent of the path is not a directory",
    errno.EIO: "an I/O error (failing disk?)",
}
_TEXT_CAUSES = (  # h5py and Java report the C error in the message, not in errno
    ("no space left", errno.ENOSPC),
    ("errno = 28", errno.ENOSPC),
    ("disk quota", errno.EDQUOT),
    ("read-only file system", errno.EROFS),
    ("errno = 30", errno.EROFS),
    ("permission denied", errno.EACCES),
    ("accessdeniedexception", errno.EACCES),
    ("errno = 13", errno.EACCES),
)


# the temp files of atomic writes: `.NAME.<random>.tmp` (the store sweeps its own leftovers)
TMP_SUFFIX = ".tmp"


class BuildLockedError(AheadrankError):
    """Another build holds the lock on the same target."""


def fault_errno(exc: BaseException) -> int | None:
    """The errno behind ``exc`` (or its causes), also when only its message names it."""
    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, OSError) and exc.errno in _CAUSES:
            return exc.errno
        text = str(exc).lower()
        for needle, code in _TEXT_CAUSES:
            if needle in text:
                return code
        exc = exc.__cause__ or exc.__context__  # type: ignore[assignment]
        seen += 1
    return None


def describe(exc: BaseException) -> str:
    """``exc`` in words for an ``error:`` line: the cause first (disk full, read-only, ...), then the detail."""
    code = fault_errno(exc)
    detail = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc).splitlines()[0][:300]
    filename = getattr(exc, "filename", None)
    where = f" ({filename})" if filename else ""
    if code is None:
        return f"{detail}{where}"
    return (
        f"{_CAUSES[code]}{where}" if detail.lower() in _CAUSES[code] else f"{_CAUSES[code]}: {detail}{where}"
    )


def check_writable(directory: Path, what: str, error: type[AheadrankError] = AheadrankError) -> None:
    """Create ``directory`` (and parents) and a probe file in it, or raise ``error`` saying why not."""
    probe = directory / f".aheadrank-write-probe-{uuid.uuid4().hex[:8]}.tmp"
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(probe, "wb") as fh:
            fh.write(b"probe")
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as exc:
        raise error(f"cannot write {what} at {directory}: {describe(exc)}") from exc
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()


@contextlib.contextmanager
def exclusive_lock(
    lock_file: Path, what: str, error: type[AheadrankError] = BuildLockedError
) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``lock_file`` (created; it holds the holder's pid) for the block, or
    raise ``error`` at once naming the holder. The lock dies with its process (SIGKILL too), so a killed
    build never leaves a stale lock. The file is removed on release; an acquirer re-checks that the file it
    locked is still the one at ``lock_file`` (else it was released and removed meanwhile: try again)."""
    import fcntl

    for _ in range(5):
        try:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise AheadrankError(
                f"cannot create the lock file {lock_file} for {what}: {describe(exc)}"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise error(
                f"another build is writing {what} (pid {holder}); wait for it to finish or stop it, then "
                f"re-run (the lock {lock_file} is released when that process ends)"
            ) from None
        try:
            same = os.fstat(fd).st_ino == os.stat(lock_file).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    else:
        raise error(f"could not lock {lock_file} for {what}: it keeps being replaced")
    try:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock_file)  # while still held: a waiter that opened it sees the inode change
        os.close(fd)


def temp_name(final: Path) -> Path:
    """A unique hidden temp file next to ``final``: ``.NAME.<random>.tmp`` (never matched by a reader)."""
    return final.with_name(f".{final.name}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (a no-op where directories cannot be opened or synced)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """``write`` into a hidden temp file beside ``path`` (:func:`temp_name`), on disk, then renamed over it and the
    rename synced: ``path`` is whole or as it was, whatever stops the process (the temp file goes on an error; a
    kill may leave it, never read)."""
    path = Path(path)
    tmp = temp_name(path)
    try:
        with open(tmp, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write` of ``text`` in UTF-8."""
    atomic_write(path, lambda fh: fh.write(text.encode("utf-8")))


_HASH_BLOCK = 8 << 20


def sha256_file(path: str | os.PathLike) -> str:
    """The hex sha256 of a file, read in 8 MB blocks into one reused buffer."""
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        buf = bytearray(_HASH_BLOCK)
        view = memoryview(buf)
        while n := fh.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def sha256_fd(fd: int, size: int, chunk: int = _HASH_BLOCK, on_bytes=None) -> str:
    """sha256 of the first ``size`` bytes of an open file, read with ``pread`` (no file position, so it works on
    a descriptor others use; a file cut short hashes what is left). ``on_bytes(n)`` after every block."""
    digest = hashlib.sha256()
    offset = 0
    while offset < size:
        block = os.pread(fd, min(chunk, size - offset), offset)
        if not block:
            break
        digest.update(block)  # releases the GIL: a verifying thread leaves the others to run
        offset += len(block)
        if on_bytes is not None:
            on_bytes(len(block))
    return digest.hexdigest()
