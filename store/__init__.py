"""The sharded HDF5 representation store: the document side of every ranker, computed once, fetched fast.

A store is a directory: ``manifest.json`` plus ``shard-NNNNN.h5`` files (see ``store/README.md``).
"""

from __future__ import annotations

from aheadrank.store.manifest import Manifest, ShardInfo, read_manifest
from aheadrank.store.reader import FetchResult, StoreReader, TorchBatch
from aheadrank.store.shard import write_shard
from aheadrank.store.spec import FORMAT_VERSION, StoreSpec
from aheadrank.store.verify import verify_store
from aheadrank.store.writer import StoreWriter, prepare_build, write_manifest

from aheadrank.errors import StoreError

__all__ = [
    "FORMAT_VERSION",
    "FetchResult",
    "Manifest",
    "ShardInfo",
    "StoreError",
    "StoreReader",
    "StoreSpec",
    "StoreWriter",
    "TorchBatch",
    "prepare_build",
    "read_manifest",
    "verify_store",
    "write_manifest",
    "write_shard",
]
