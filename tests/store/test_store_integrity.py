"""Integrity: corrupt, truncated or missing shards, future formats, fingerprints; the CLI commands."""

from __future__ import annotations

import json

import h5py
import pytest
from aheadrank.store import StoreReader, StoreWriter, read_manifest, verify_store
from store_testkit import build, make_docs, make_spec
from typer.testing import CliRunner

from aheadrank.cli import app
from aheadrank.errors import StoreError

runner = CliRunner()


@pytest.fixture
def store_dir(tmp_path):
    return build(tmp_path / "store", make_spec(shard_size=4), make_docs(10))


def _flip_data_byte(shard) -> None:
    """Flip one byte inside the k1 dataset (data, not HDF5 metadata: the file still opens)."""
    with h5py.File(shard, "r") as h5:
        offset = h5["fields/k1"].id.get_offset() + 17
    with open(shard, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_corrupted_byte_is_found_and_named(store_dir):
    _flip_data_byte(store_dir / "shard-00001.h5")
    problems = verify_store(store_dir)
    assert len(problems) == 1 and "shard-00001.h5" in problems[0] and "sha256" in problems[0]
    with pytest.raises(StoreError, match="shard-00001.h5: sha256 mismatch"):
        StoreReader(store_dir, verify=True)
    result = runner.invoke(app, ["verify-store", str(store_dir)])
    assert result.exit_code == 1
    assert "shard-00001.h5" in result.output and "OK" not in result.output


def test_verify_store_cli_ok(store_dir):
    result = runner.invoke(app, ["verify-store", str(store_dir)])
    assert result.exit_code == 0, result.output
    assert "OK" in result.output


def test_store_info_cli(store_dir):
    result = runner.invoke(app, ["store-info", str(store_dir)])
    assert result.exit_code == 0, result.output
    manifest = read_manifest(store_dir)
    for text in (
        "documents",
        "10",
        "bytes per token",
        "k1[8]",
        "v1[5]",
        "none",
        "float16",
        "fp-test",
        "complete",
    ):
        assert text in result.output
    assert f"{manifest.n_tokens:,}" in result.output
    info = json.loads(runner.invoke(app, ["store-info", "--json", str(store_dir)]).output)
    assert info["documents"] == 10 and info["shards"] == 3 and info["tokens"] == manifest.n_tokens
    missing = runner.invoke(app, ["store-info", str(store_dir / "nope")])
    assert missing.exit_code == 2 and "no store" in missing.output


def test_truncated_missing_and_garbled_shards(store_dir):
    shard = store_dir / "shard-00002.h5"
    data = shard.read_bytes()
    shard.write_bytes(data[:-100])
    assert any("shard-00002.h5" in p and "bytes" in p for p in verify_store(store_dir))
    with pytest.raises(StoreError, match="shard-00002.h5.*truncated"):
        StoreReader(store_dir)
    shard.write_bytes(b"\0" * len(data))  # right size, not HDF5 at all
    with pytest.raises(StoreError, match="shard-00002.h5"):
        StoreReader(store_dir)
    shard.unlink()
    assert verify_store(store_dir) == ["shard-00002.h5: missing"]
    with pytest.raises(StoreError, match="missing shard files: shard-00002.h5"):
        StoreReader(store_dir)
    assert runner.invoke(app, ["verify-store", str(store_dir)]).exit_code == 1


def test_fingerprint_mismatch_names_both(store_dir):
    with pytest.raises(StoreError, match="fp-test.*other-checkpoint"):
        StoreReader(store_dir, expected_fingerprint="other-checkpoint")
    with StoreReader(store_dir, expected_fingerprint="fp-test") as reader:
        reader.check_fingerprint("fp-test")
        with pytest.raises(StoreError, match="fp-test.*xyz"):
            reader.check_fingerprint("xyz")


def test_future_format_version_is_refused(store_dir):
    file = store_dir / "manifest.json"
    data = json.loads(file.read_text())
    data["format_version"] = 99
    file.write_text(json.dumps(data))
    with pytest.raises(StoreError, match="version 99 is from the future"):
        StoreReader(store_dir)
    assert "future" in verify_store(store_dir)[0]
    with pytest.raises(StoreError, match="future"):
        StoreWriter(store_dir, make_spec(shard_size=4))


def test_malformed_manifests(store_dir):
    file = store_dir / "manifest.json"
    good = json.loads(file.read_text())
    for broken in (
        "{not json",
        json.dumps({**good, "format": "other"}),
        json.dumps({**good, "fields": 3}),
        json.dumps({**good, "shards": [good["shards"][1]]}),
    ):
        file.write_text(broken)
        with pytest.raises(StoreError):
            StoreReader(store_dir)
    with pytest.raises(StoreError, match="manifest.json is missing"):
        StoreReader(store_dir.parent)


def test_incomplete_store_is_refused_with_advice(tmp_path):
    with StoreWriter(tmp_path, make_spec(shard_size=2)) as writer:
        for docid, fields in make_docs(5).items():
            writer.add(docid, fields)
        writer.abort()
    with pytest.raises(
        StoreError, match="incomplete: its build was interrupted after 4 documents.*[Rr]esume"
    ):
        StoreReader(tmp_path)
    assert "incomplete" in verify_store(tmp_path)[0]
    assert verify_store(tmp_path, allow_incomplete=True) == []
    info = runner.invoke(app, ["store-info", str(tmp_path)])
    assert info.exit_code == 0 and "INCOMPLETE" in info.output
