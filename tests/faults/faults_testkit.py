"""Helpers for the fault-injection tests: the other parts' testkits, stores to damage, bounded waits."""

from __future__ import annotations

import json
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
for sub in ("store", "indexer", "services"):
    path = str(HERE.parent / sub)
    if path not in sys.path:
        sys.path.insert(0, path)

from store_testkit import build, make_docs, make_spec  # noqa: E402

__all__ = [
    "build",
    "copy_store",
    "make_docs",
    "make_spec",
    "small_store",
    "text_docs",
    "wait_for",
    "write_jsonl",
]
WORDS = "protein cell cancer tumour gene expression patient clinical trial risk therapy dose".split()


def text_docs(n: int, seed: int) -> list[dict]:
    """``n`` BEIR-style documents ``{"_id": "d<i>", "text": ...}`` of 3-20 random words."""
    rng = random.Random(seed)
    return [
        {"_id": f"d{i}", "text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 20)))}
        for i in range(n)
    ]


def write_jsonl(path: Path, docs: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(d) + "\n" for d in docs))
    return path


def small_store(path: Path, n: int = 12, **spec) -> tuple[Path, dict]:
    """A store of ``n`` random documents in shards of 4 (3 shards for the default 12)."""
    docs = make_docs(n)
    build(path, make_spec(**spec), docs)
    return path, docs


def copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def wait_for(check: Callable[[], bool], timeout: float = 10.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(step)
    return check()
