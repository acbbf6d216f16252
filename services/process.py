"""``aheadrank serve`` as a child process on 127.0.0.1: what the demo, the end-to-end tests and the load
benchmark start (the same entry point the containers run). Its output goes to a log file, never a pipe: a pipe
nobody reads fills up and blocks the server's writes."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

AHEADRANK = Path(sys.executable).parent / "aheadrank"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServeProcess:
    """``aheadrank serve <args> --host 127.0.0.1 --port <free port>`` in a subprocess.

    ``clean_env`` drops the caller's ``AHEADRANK_*`` variables, so only the flags configure the server. The
    child gets SIGTERM if this process dies (``setpriv --pdeathsig``, where available)."""

    def __init__(
        self,
        args: Sequence[str],
        log_path: str | Path,
        env: dict[str, str] | None = None,
        clean_env: bool = False,
    ):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path)
        self.args = ["serve", *args, "--host", "127.0.0.1", "--port", str(self.port)]
        base = {k: v for k, v in os.environ.items() if not (clean_env and k.startswith("AHEADRANK_"))}
        guard = ["setpriv", "--pdeathsig", "TERM"] if shutil.which("setpriv") else []
        self.log = self.log_path.open("w")
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [*guard, str(AHEADRANK), *self.args],
            stdin=subprocess.DEVNULL,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={**base, "HF_HUB_OFFLINE": "1", **(env or {})},
        )
        self.pid = self.proc.pid  # setpriv execs the server: the same pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, n: int = 20) -> str:
        return "\n".join(self.output().splitlines()[-n:])

    def wait_ready(self, timeout: float = 300.0) -> float:
        """Seconds from start until ``/ready`` answered 200; raises if the server exits or times out."""
        import httpx

        deadline = time.monotonic() + timeout
        with httpx.Client(trust_env=False, timeout=2.0) as http:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    if http.get(self.url + "/ready").status_code == 200:
                        return time.perf_counter() - self.started
                except httpx.HTTPError:
                    pass
                time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"server not ready in {timeout:g} s:\n{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM (graceful shutdown), SIGKILL after ``timeout``; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
