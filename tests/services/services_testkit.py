"""Helpers for the service tests (a plain module: tests/rankers imports `conftest` by name)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "aheadrank" / "data" / "scifact-sample"
AHEADRANK = str(Path(sys.executable).parent / "aheadrank")


@dataclass
class ServiceEnv:
    collection: Path
    lucene: Path
    checkpoint: Path
    store: Path
    other_checkpoint: Path  # same options, another seed: another fingerprint


def build_service_env(root: Path, tiny_base: Path) -> ServiceEnv:
    import aheadrank.javaenv  # noqa: F401
    from indexer.bm25 import build_bm25_index
    from indexer.build import BuildOptions, build_store
    from rankers import init_ranker, save_checkpoint

    lucene = root / "lucene"
    build_bm25_index(SAMPLE, lucene, progress=False)
    ckpt, other = root / "ckpt", root / "ckpt-other"
    save_checkpoint(init_ranker("mores", base=tiny_base, seed=0, ibs=2), ckpt)
    save_checkpoint(init_ranker("mores", base=tiny_base, seed=1, ibs=2), other)
    store = root / "store"
    build_store(BuildOptions(str(ckpt), str(SAMPLE), str(store), shard_size=400, progress=False))
    return ServiceEnv(SAMPLE, lucene, ckpt, store, other)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`aheadrank serve` in a subprocess on 127.0.0.1 (the same entry point the containers run)."""

    def __init__(self, *args: str, env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # a file, not a pipe: nobody reads a pipe while the server runs, and a full one blocks its writes
        self.log = tempfile.NamedTemporaryFile("w+", prefix="aheadrank-serve-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [AHEADRANK, "serve", "--host", "127.0.0.1", "--port", str(self.port), "--threads", "1", *args],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})},
        )

    def wait_ready(self, timeout: float = 180.0) -> Server:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.output()}")
            try:
                if httpx.get(self.url + "/ready", timeout=1.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"server not ready in {timeout} s")

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode
