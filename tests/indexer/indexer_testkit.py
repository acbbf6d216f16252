"""Shared helpers for the indexer tests (a plain module, not conftest.py: tests/rankers imports `conftest`)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path

import pytest
import zstandard

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"
SAMPLE = REPO / "aheadrank" / "data" / "scifact-sample"


def write_lines(path: Path, lines: Iterable[str | bytes | dict]) -> Path:
    """Write one line per item (dicts as JSON); compress by the file's suffix (.gz or .zst)."""
    chunks = []
    for line in lines:
        if isinstance(line, dict):
            line = json.dumps(line)
        chunks.append(line if isinstance(line, bytes) else line.encode("utf-8"))
    data = b"".join(chunk + b"\n" for chunk in chunks)
    if path.suffix == ".gz":
        data = gzip.compress(data)
    elif path.suffix == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def shared_dataset(name: str) -> Path:
    """The BEIR folder ``../shared/data/<name>``, or skip the calling test when it is absent."""
    path = SHARED_DATA / name
    if not (path / "corpus.jsonl").is_file():
        pytest.skip(f"{path} not present")
    return path
