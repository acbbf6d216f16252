"""What a store holds: :class:`StoreSpec`, the part of the manifest that the writer and reader agree on."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from aheadrank.errors import StoreError

FORMAT = "aheadrank-store"
FORMAT_VERSION = 1
COMPRESSIONS = ("none", "zstd")
DTYPES = ("float16", "int8", "book4", "book2")
# codebook dtypes: per shard, field and dimension a codebook of 2^bits float32 levels (Lloyd-Max on the shard's
# tokens); each value stored as its nearest level's code, ``bits`` per value, packed low bits first
BOOK_BITS = {"book4": 4, "book2": 2}
ZSTD_LEVEL = 3
_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def _normalise_config(config: dict[str, Any]) -> dict[str, Any]:
    """The config as it reads back from JSON (tuples become lists), so specs compare equal after a round trip."""
    try:
        return json.loads(json.dumps(config, sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise StoreError(f"store config must be JSON-serialisable: {exc}") from exc


@dataclass(frozen=True)
class StoreSpec:
    """Everything that fixes a store's layout and meaning; two writers of one store must agree on all of it.

    ``fields`` maps each document field name (``doc``, ``k1``, ``v1``, ...) to its width; every field of a
    document has the same number of tokens. ``config`` is free-form (e.g. the ranker's full config) and is
    saved in the manifest.
    """

    fields: dict[str, int]
    fingerprint: str
    ranker_kind: str
    strategy: str | None = None
    max_doc_len: int = 128
    compression: str = "none"
    dtype: str = "float16"
    shard_size: int = 4096
    config: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.fields, dict) or not self.fields:
            raise StoreError("StoreSpec.fields must be a non-empty dict of field name -> dim")
        for name, dim in self.fields.items():
            if not isinstance(name, str) or not _FIELD_NAME.match(name):
                raise StoreError(f"invalid field name {name!r} (letters, digits, '_', '.', '-')")
            if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
                raise StoreError(f"field {name!r}: dim must be a positive int, got {dim!r}")
        if not isinstance(self.fingerprint, str) or not self.fingerprint:
            raise StoreError("StoreSpec.fingerprint must be a non-empty string")
        if not isinstance(self.ranker_kind, str) or not self.ranker_kind:
            raise StoreError("StoreSpec.ranker_kind must be a non-empty string")
        if self.strategy is not None and not isinstance(self.strategy, str):
            raise StoreError(f"StoreSpec.strategy must be a string or None, got {self.strategy!r}")
        if self.compression not in COMPRESSIONS:
            raise StoreError(f"compression must be one of {COMPRESSIONS}, got {self.compression!r}")
        if self.dtype not in DTYPES:
            raise StoreError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        bits = BOOK_BITS.get(self.dtype)
        if bits is not None:
            if self.compression != "none":
                raise StoreError(f"dtype {self.dtype!r} packs codes already: use compression='none'")
            for name, dim in self.fields.items():
                if isinstance(dim, int) and dim * bits % 8:
                    raise StoreError(
                        f"dtype {self.dtype!r} packs {8 // bits} values a byte: field {name!r} has dim {dim}, "
                        f"not a multiple of {8 // bits}"
                    )
        for name in ("max_doc_len", "shard_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise StoreError(f"StoreSpec.{name} must be a positive int, got {value!r}")
        if not isinstance(self.config, dict):
            raise StoreError("StoreSpec.config must be a dict")
        object.__setattr__(self, "fields", {str(k): int(v) for k, v in self.fields.items()})
        object.__setattr__(self, "config", _normalise_config(self.config))

    @property
    def book_bits(self) -> int | None:
        """Bits a value of a codebook dtype (``book4``: 4, ``book2``: 2); None for float16 and int8."""
        return BOOK_BITS.get(self.dtype)

    def stored_width(self, name: str) -> int:
        """Columns of a field's stored rows: its dim, or the bytes of its packed codes (dim·bits/8)."""
        bits = self.book_bits
        return self.fields[name] if bits is None else self.fields[name] * bits // 8

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StoreSpec:
        try:
            return cls(
                fields=dict(data["fields"]),
                fingerprint=data["fingerprint"],
                ranker_kind=data["ranker_kind"],
                strategy=data.get("strategy"),
                max_doc_len=data["max_doc_len"],
                compression=data["compression"],
                dtype=data["dtype"],
                shard_size=data["shard_size"],
                config=data.get("config", {}),
            )
        except (KeyError, TypeError) as exc:
            raise StoreError(f"incomplete store spec: missing or malformed {exc}") from exc

    def differences(self, other: StoreSpec, ignore: Sequence[str] = ()) -> list[str]:
        """Human-readable differences (``key: mine != other's``), ``[]`` when the two specs describe the same
        store; keys in ``ignore`` are not compared."""
        mine, theirs = self.to_dict(), other.to_dict()
        return [
            f"{key}: {mine[key]!r} != {theirs[key]!r}"
            for key in mine
            if key not in ignore and mine[key] != theirs[key]
        ]

    def compatible_with(self, other: StoreSpec) -> bool:
        """True when a store written with ``other`` may be continued (resumed) with this spec."""
        return not self.differences(other)

    def check_compatible(self, other: StoreSpec, where: str = "the store") -> None:
        """Raise :class:`StoreError` listing every difference between this spec and ``other`` (``where``'s)."""
        diffs = self.differences(other)
        if diffs:
            raise StoreError(
                f"{where} was written with a different spec; refusing to mix them "
                f"(new != existing): {'; '.join(diffs)}. Use a new directory, or resume=False to rebuild."
            )
