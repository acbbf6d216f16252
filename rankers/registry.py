"""The one registry of ranker kinds: kind -> :class:`~aheadrank.rankers.spec.RankerSpec` (its class, its own
options, its variants). A new ranker is one module with a ``SPEC`` and one line in :data:`BUILTIN`.
"""

from __future__ import annotations

import importlib

from aheadrank.rankers.base import Ranker
from aheadrank.rankers.spec import RankerSpec

from aheadrank.errors import CheckpointError

# the modules under aheadrank.rankers that define a ranker kind (each has SPEC): the one registration line
BUILTIN = ("bert", "mores", "prettr", "tk")

SPECS: dict[str, RankerSpec] = {}
RANKERS: dict[str, type[Ranker]] = {}  # kind -> class (what load_ranker builds)


def register(spec: RankerSpec) -> RankerSpec:
    """Register a ranker kind (a second spec of the same kind replaces the first)."""
    if getattr(spec.ranker, "kind", None) != spec.kind:
        raise CheckpointError(f"{spec.ranker.__name__}.kind must be {spec.kind!r}")
    SPECS[spec.kind] = spec
    RANKERS[spec.kind] = spec.ranker
    return spec


def unregister(kind: str) -> None:
    SPECS.pop(kind, None)
    RANKERS.pop(kind, None)


def kinds() -> tuple[str, ...]:
    return tuple(SPECS)


def spec_of(kind: str) -> RankerSpec:
    if kind not in SPECS:
        raise CheckpointError(f"unknown ranker kind {kind!r}; expected one of {', '.join(SPECS)}")
    return SPECS[kind]


for _name in BUILTIN:
    register(importlib.import_module(f"aheadrank.rankers.{_name}").SPEC)
