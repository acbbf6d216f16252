"""aheadrank/fsfaults.py's atomic write, the one every part uses (the store's manifest, a checkpoint's records and
training state, run files, build records, bench results): the file is whole or as it was."""

from __future__ import annotations

import hashlib

import pytest
from aheadrank.store._io import remove_temp_files

from aheadrank import fsfaults
from aheadrank.fsfaults import TMP_SUFFIX, atomic_write, atomic_write_text, sha256_file, temp_name


def test_an_atomic_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "record.json"
    atomic_write_text(path, "first ✓\n")
    assert path.read_text(encoding="utf-8") == "first ✓\n"
    atomic_write(path, lambda fh: [fh.write(b"sec"), fh.write(b"ond")])
    assert path.read_bytes() == b"second"
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]  # no temp file beside it


@pytest.mark.parametrize("stop", [OSError("disk full"), KeyboardInterrupt()])
def test_a_write_stopped_half_way_leaves_the_old_file_and_no_temp_file(tmp_path, stop):
    path = tmp_path / "state.pt"
    path.write_bytes(b"old state")

    def torn(fh):
        fh.write(b"half of the new")
        raise stop

    with pytest.raises(type(stop)):
        atomic_write(path, torn)
    assert path.read_bytes() == b"old state"
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]
    with pytest.raises(type(stop)):  # a first write that fails leaves nothing at all
        atomic_write(tmp_path / "new", torn)
    assert [p.name for p in tmp_path.iterdir()] == ["state.pt"]


def test_a_killed_writers_temp_file_is_hidden_unique_and_swept_by_the_store(tmp_path):
    final = tmp_path / "manifest.json"
    a, b = temp_name(final), temp_name(final)
    assert (
        a != b
        and a.parent == tmp_path
        and a.name.startswith(".manifest.json.")
        and a.name.endswith(TMP_SUFFIX)
    )
    a.write_bytes(b"left by a killed writer")
    final.write_bytes(b"{}")
    assert remove_temp_files(tmp_path) == [a]
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 17])
def test_the_checksum_of_a_file_is_its_sha256_across_block_boundaries(tmp_path, monkeypatch, size):
    """One checksum for the store's shards and the checkpoints' fingerprints: read in reused blocks (4 KB here),
    it equals the sha256 of the file's bytes whatever the size against the block."""
    monkeypatch.setattr(fsfaults, "_HASH_BLOCK", 4096)
    data = bytes((i * 31 + 7) % 251 for i in range(size))
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    assert sha256_file(path) == hashlib.sha256(data).hexdigest()
    assert sha256_file(str(path)) == hashlib.sha256(data).hexdigest()
