"""Helpers for the service tests (a plain module: tests/rankers imports `conftest` by name)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from aheadrank.services.process import AHEADRANK as _AHEADRANK
from aheadrank.services.process import ServeProcess

AHEADRANK = str(_AHEADRANK)

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "aheadrank" / "data" / "scifact-sample"
LOG_DIR_VARIABLE = "AHEADRANK_TEST_SERVER_LOGS"  # set by tests/conftest.py for the whole session


@dataclass
class ServiceEnv:
    collection: Path
    lucene: Path
    checkpoint: Path
    store: Path
    other_checkpoint: Path  # same options, another seed: another fingerprint


def build_service_env(root: Path, tiny_base: Path) -> ServiceEnv:
    from aheadrank.indexer.bm25 import build_bm25_index
    from aheadrank.indexer.build import BuildOptions, build_store
    from aheadrank.rankers import init_ranker, save_checkpoint

    lucene = root / "lucene"
    build_bm25_index(SAMPLE, lucene, progress=False)
    ckpt, other = root / "ckpt", root / "ckpt-other"
    # without the similarity residual (on by default), whose zero head leaves nothing random at initialisation:
    # the random score head makes the two seeds two fingerprints and exercises the interaction blocks
    save_checkpoint(init_ranker("mores", base=tiny_base, seed=0, ibs=2, sim=False), ckpt)
    save_checkpoint(init_ranker("mores", base=tiny_base, seed=1, ibs=2, sim=False), other)
    store = root / "store"
    build_store(BuildOptions(str(ckpt), str(SAMPLE), str(store), shard_size=400, progress=False))
    return ServiceEnv(SAMPLE, lucene, ckpt, store, other)


class Server(ServeProcess):
    """`aheadrank serve` in a subprocess on 127.0.0.1 (the same entry point the containers run), one torch
    thread, its log in a temporary file."""

    def __init__(self, *args: str, env: dict | None = None):
        # in the test session's own temporary folder (tests/conftest.py: server_logs), which pytest prunes
        logs = os.environ.get(LOG_DIR_VARIABLE)
        log = tempfile.NamedTemporaryFile(prefix="aheadrank-serve-", suffix=".log", delete=False, dir=logs)
        log.close()
        super().__init__(["--threads", "1", *args], log.name, env=env)

    def wait_ready(self, timeout: float = 180.0) -> Server:
        super().wait_ready(timeout)
        return self
