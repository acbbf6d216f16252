"""Store faults under a running reader (issue 12, items 1 and 3): a shard truncated anywhere or rewritten in
place is refused for the documents it holds, never read through its mapping (SIGBUS), while the other
shards keep being served. Bounded, in-process, no network."""

from __future__ import annotations

import os

import numpy as np
import pytest
from aheadrank.store import StoreReader
from aheadrank.store.manifest import shard_file_name
from faults_testkit import small_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from aheadrank.errors import StoreDamagedError, StoreError

COMBOS = [("none", "float16"), ("none", "int8"), ("zstd", "float16")]


def _docids_of_shard(reader: StoreReader, shard: int) -> list[str]:
    size = reader.spec.shard_size
    return reader.docids()[shard * size : (shard + 1) * size]


@pytest.mark.parametrize(("compression", "dtype"), COMBOS)
@pytest.mark.parametrize("where", ["zero", "header", "middle", "last_byte"])
def test_truncated_shard_is_refused_not_mapped(tmp_path, compression, dtype, where):
    path, _ = small_store(tmp_path / "s", compression=compression, dtype=dtype)
    file = path / shard_file_name(1)
    size = file.stat().st_size
    cut = {"zero": 0, "header": 4096, "middle": size // 2, "last_byte": size - 1}[where]
    with StoreReader(path) as reader:
        good = _docids_of_shard(reader, 0) + _docids_of_shard(reader, 2)
        bad = _docids_of_shard(reader, 1)
        before = reader.fetch(good)
        os.truncate(file, cut)
        with pytest.raises(StoreDamagedError) as info:
            reader.fetch(bad[:1] + good[:1])
        assert info.value.files == [shard_file_name(1)]
        assert "truncated" in str(info.value)
        after = reader.fetch(good)  # the rest of the store is still served, unchanged
        for name in before.fields:
            np.testing.assert_array_equal(before.fields[name], after.fields[name])
        assert reader.damaged == {shard_file_name(1): str(reader.damaged[shard_file_name(1)])}
        with pytest.raises(StoreDamagedError):  # refused from now on, even if the file came back
            reader.fetch_torch(bad)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.floats(0.0, 0.9999), shard=st.integers(0, 2))
def test_truncation_anywhere_in_any_shard(tmp_path_factory, cut, shard):
    path, _ = small_store(tmp_path_factory.mktemp("t"))
    file = path / shard_file_name(shard)
    with StoreReader(path) as reader:
        os.truncate(file, int(file.stat().st_size * cut))
        for s in range(3):
            ids = _docids_of_shard(reader, s)
            if s == shard:
                with pytest.raises(StoreDamagedError):
                    reader.fetch(ids)
            else:
                assert reader.fetch(ids).docids == ids


def test_in_place_rewrite_is_refused(tmp_path):
    """Same size, new bytes (NaN written over values): the mtime moved, so the shard is refused."""
    path, _ = small_store(tmp_path / "s")
    file = path / shard_file_name(2)
    with StoreReader(path) as reader:
        ids = _docids_of_shard(reader, 2)
        with open(file, "r+b") as fh:
            fh.seek(file.stat().st_size // 2)
            fh.write(np.full(8, np.nan, dtype=np.float16).tobytes())
        st = file.stat()
        os.utime(file, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # coarse-mtime filesystems
        with pytest.raises(StoreDamagedError, match="modified"):
            reader.fetch(ids)
        assert reader.check_shards() == {shard_file_name(2): "modified on disk while being served"}


def test_damage_is_announced_once_per_shard(tmp_path):
    path, _ = small_store(tmp_path / "s")
    with StoreReader(path) as reader:
        seen = []
        reader.on_damage(lambda file, reason: seen.append(file))
        os.truncate(path / shard_file_name(0), 10)
        for _ in range(3):
            with pytest.raises(StoreDamagedError):
                reader.fetch(_docids_of_shard(reader, 0))
        assert seen == [shard_file_name(0)]
        assert reader.mark_damaged(_docids_of_shard(reader, 1)[:1], "non-finite values") == [
            shard_file_name(1)
        ]
        assert seen == [shard_file_name(0), shard_file_name(1)]


def test_truncated_before_open_is_refused_at_open(tmp_path):
    path, _ = small_store(tmp_path / "s")
    os.truncate(path / shard_file_name(1), 4096)
    with pytest.raises(StoreError, match="truncated"):
        StoreReader(path)
