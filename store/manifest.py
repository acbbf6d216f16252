"""``manifest.json``: the single source of truth about what a store holds (a shard not in it does not exist)."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from aheadrank.store.spec import FORMAT, FORMAT_VERSION, ZSTD_LEVEL, StoreSpec

from aheadrank import __version__
from aheadrank.errors import StoreError
from aheadrank.fsfaults import atomic_write

MANIFEST_NAME = "manifest.json"
SHARD_PREFIX = "shard-"
SHARD_SUFFIX = ".h5"
DENSE_DIR = "dense"  # the sub-store of the dense prior's field (verified, leased and served with the store)


def shard_file_name(index: int) -> str:
    return f"{SHARD_PREFIX}{index:05d}{SHARD_SUFFIX}"


@dataclass(frozen=True)
class ShardInfo:
    """One finished shard as the manifest lists it."""

    file: str
    index: int
    n_docs: int
    n_tokens: int
    bytes: int
    sha256: str
    source: str = ""  # sha256 of the (docid, text) pairs it was built from; "" if not recorded
    text_digest: str = ""  # the scheme of its per-document text digests (store/texts.py); "" if it has none

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardInfo:
        try:
            info = cls(
                file=str(data["file"]),
                index=int(data["index"]),
                n_docs=int(data["n_docs"]),
                n_tokens=int(data["n_tokens"]),
                bytes=int(data["bytes"]),
                sha256=str(data["sha256"]),
                source=str(data.get("source", "")),
                text_digest=str(data.get("text_digest", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"malformed shard entry in manifest: {data!r} ({exc})") from exc
        if info.file != shard_file_name(info.index):
            raise StoreError(f"manifest shard entry {info.index} names file {info.file!r}")
        return info


@dataclass(frozen=True)
class Manifest:
    spec: StoreSpec
    shards: list[ShardInfo]
    complete: bool
    format_version: int = FORMAT_VERSION
    created: str = ""
    writer: str = ""
    collection: dict[str, Any] = field(default_factory=dict)  # what it was built from (the index build)
    # whether the build was asked for the dense field (the sub-store dense/): True: dense/ must be there and
    # complete; False: built with --no-dense; None: not recorded (a store from before it was, or the API's)
    dense: bool | None = None
    # what long documents were split with when the build stored them as passages (the sub-store passages/,
    # store/passages.py): {"window", "overlap", "max_passages"}; None: built without --passages
    passages: dict[str, Any] | None = None
    # what the bi-encoder's sentence windows were cut with (the sub-store windows/, store/windows.py):
    # {"sentences"}; None: built without them
    windows: dict[str, Any] | None = None

    @property
    def n_docs(self) -> int:
        return sum(s.n_docs for s in self.shards)

    @property
    def n_tokens(self) -> int:
        return sum(s.n_tokens for s in self.shards)

    @property
    def n_bytes(self) -> int:
        return sum(s.bytes for s in self.shards)

    @property
    def text_digest(self) -> str:
        """The text digest scheme when every shard has digests of one scheme (store/texts.py), else ""."""
        schemes = {s.text_digest for s in self.shards}
        return schemes.pop() if len(schemes) == 1 else ""

    def to_dict(self) -> dict[str, Any]:
        spec = self.spec
        stored = {"int8": "int8", "float16": "float16"}.get(spec.dtype, "uint8")
        return {
            "format": FORMAT,
            "format_version": self.format_version,
            "complete": self.complete,
            "fingerprint": spec.fingerprint,
            "ranker_kind": spec.ranker_kind,
            "strategy": spec.strategy,
            "fields": [
                {
                    "name": name,
                    "dim": dim,
                    "dtype": stored,
                    **({"scale": "float32/token"} if stored == "int8" else {}),
                    **(
                        {
                            "codes": f"{spec.book_bits} bits/value, {8 // spec.book_bits} a byte, low bits first",
                            "codebook": f"float32 [{dim}, {2**spec.book_bits}] per shard (books/{name})",
                        }
                        if spec.book_bits is not None
                        else {}
                    ),
                }
                for name, dim in spec.fields.items()
            ],
            "max_doc_len": spec.max_doc_len,
            "compression": spec.compression,
            **({"zstd_level": ZSTD_LEVEL} if spec.compression == "zstd" else {}),
            "dtype": spec.dtype,
            "shard_size": spec.shard_size,
            "n_docs": self.n_docs,
            "n_tokens": self.n_tokens,
            **({"text_digest": self.text_digest} if self.text_digest else {}),
            "shards": [
                {k: v for k, v in asdict(s).items() if k not in ("source", "text_digest") or v}
                for s in self.shards
            ],
            **({"collection": self.collection} if self.collection else {}),
            **({"dense": self.dense} if self.dense is not None else {}),
            **({"passages": self.passages} if self.passages is not None else {}),
            **({"windows": self.windows} if self.windows is not None else {}),
            "config": spec.config,
            "created": self.created,
            "updated": _now(),
            "writer": self.writer or f"aheadrank {__version__}",
        }


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def manifest_from_dict(data: Any, where: str = "manifest") -> Manifest:
    """Validate a parsed manifest; errors say what is wrong with it."""
    if not isinstance(data, dict):
        raise StoreError(f"{where}: not a JSON object")
    if data.get("format") != FORMAT:
        raise StoreError(f"{where}: not an aheadrank store manifest (format={data.get('format')!r})")
    version = data.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise StoreError(f"{where}: invalid format_version {version!r}")
    if version > FORMAT_VERSION:
        raise StoreError(
            f"{where}: store format version {version} is from the future; this aheadrank ({__version__}) "
            f"reads versions <= {FORMAT_VERSION}. Upgrade aheadrank to read it."
        )
    try:
        fields = {str(f["name"]): f["dim"] for f in data["fields"]}
        spec = StoreSpec.from_dict({**data, "fields": fields})
        shards = [ShardInfo.from_dict(s) for s in data["shards"]]
        complete = data["complete"]
    except (KeyError, TypeError) as exc:
        raise StoreError(f"{where}: missing or malformed key {exc}") from exc
    if not isinstance(complete, bool):
        raise StoreError(f"{where}: 'complete' must be true or false")
    try:
        check_shard_sequence(spec, shards, complete)
    except StoreError as exc:
        raise StoreError(f"{where}: {exc}") from exc
    collection = data.get("collection") or {}
    if not isinstance(collection, dict):
        raise StoreError(f"{where}: 'collection' must be an object")
    dense = data.get("dense")
    if dense is not None and not isinstance(dense, bool):
        raise StoreError(f"{where}: 'dense' must be true or false")
    passages = data.get("passages")
    if passages is not None and not (isinstance(passages, dict) and isinstance(passages.get("window"), int)):
        raise StoreError(f"{where}: 'passages' must be an object with the passage window")
    windows = data.get("windows")
    if windows is not None and not (
        isinstance(windows, dict) and isinstance(windows.get("sentences"), int) and windows["sentences"] >= 1
    ):
        raise StoreError(f"{where}: 'windows' must be an object with the sentences per window")
    return Manifest(
        spec,
        shards,
        complete,
        version,
        str(data.get("created", "")),
        str(data.get("writer", "")),
        collection,
        dense,
        passages,
        windows,
    )


def read_manifest(path: str | Path) -> Manifest:
    """Read and validate ``DIR/manifest.json`` (``path`` may be the directory or the file)."""
    path = Path(path)
    file = path if path.name == MANIFEST_NAME else path / MANIFEST_NAME
    if not file.parent.is_dir():
        raise StoreError(f"no store at {file.parent}: not a directory")
    if not file.is_file():
        raise StoreError(
            f"no store at {file.parent}: {MANIFEST_NAME} is missing (never built, or not finished)"
        )
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StoreError(f"{file}: unreadable manifest: {exc}") from exc
    return manifest_from_dict(data, where=str(file))


def write_manifest_file(path: Path, manifest: Manifest) -> None:
    """Atomically (temp file, fsync, rename, fsync dir) write ``manifest`` to ``path/manifest.json``."""
    data = json.dumps(manifest.to_dict(), indent=2, sort_keys=False).encode("utf-8") + b"\n"
    atomic_write(path / MANIFEST_NAME, lambda fh: fh.write(data))


def check_shard_sequence(spec: StoreSpec, shards: list[ShardInfo], complete: bool) -> None:
    """Shard i holds documents [i*shard_size, (i+1)*shard_size): every shard but the last is full.

    A complete store lists shards 0..n-1; an incomplete one lists its finished shards in index order,
    with gaps where a parallel build has not finished a shard yet (only the highest may be partial).
    """
    indices = [info.index for info in shards]
    if complete and indices != list(range(len(shards))):
        raise StoreError(f"a complete store lists shards 0..{len(shards) - 1}, got indices {indices}")
    if any(b <= a for a, b in zip(indices, indices[1:], strict=False)) or (indices and indices[0] < 0):
        raise StoreError(f"shard indices must be distinct, non-negative and in order, got {indices}")
    for position, info in enumerate(shards):
        last = position == len(shards) - 1
        if not 1 <= info.n_docs <= spec.shard_size:
            raise StoreError(f"{info.file}: {info.n_docs} documents (shard_size {spec.shard_size})")
        if info.n_docs != spec.shard_size and not last:
            raise StoreError(
                f"{info.file}: {info.n_docs} documents but shard_size is {spec.shard_size}; "
                "only the last shard may be partial"
            )


def collection_mismatch(main: Manifest, sub: Manifest, name: str) -> str | None:
    """Why the sub-store ``name`` (e.g. ``dense/``) does not describe the same collection as its main store
    (documents and the sha256 over the shards' (docid, text) pairs, as the index build records them); None
    when both record the same collection or either records none (then compare docids instead)."""
    a, b = main.collection, sub.collection
    if not a or not b or not a.get("sha256") or not b.get("sha256"):
        return None
    if (a.get("sha256"), a.get("documents")) == (b.get("sha256"), b.get("documents")):
        return None
    return (
        f"{name} was built from another collection than the store: {b.get('documents')} documents, "
        f"sha256 {str(b.get('sha256'))[:16]}... (the store: {a.get('documents')} documents, sha256 "
        f"{str(a.get('sha256'))[:16]}...)"
    )
