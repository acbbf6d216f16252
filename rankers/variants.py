"""Ranker variants and their names, used by the CLI's demo and every benchmark: each kind's spec
(:mod:`rankers.registry`) declares its variant names (``variants``) and how one parses (``parse``).

Names: ``bert``; ``mores-<K>ib-s1`` / ``-s2`` (MORES, ClsPool, Reuse-S1 / S2: one checkpoint, two stores),
``mores-<K>ib-mean`` (EARL AvePool), ``mores-<K>ib-tied`` (EARL Tied); ``prettr-l<l>-e<e>``; ``tk-<n>l`` (``-base`` / ``-scratch``: TK's contextualisation from the base's layers or from scratch; ``-base-specials``: the text read between [CLS] and [SEP]).
A variant's options are its kind's own (the spec's options dataclass); the rest are the kind's defaults, and
the spec's ``default_variant`` names the variant those defaults make.
"""

from __future__ import annotations

import fnmatch

from aheadrank.rankers.registry import SPECS, spec_of
from aheadrank.rankers.spec import Variant

from aheadrank.errors import CheckpointError

__all__ = ["Variant", "catalogue", "default_variant", "defaults", "match_variants", "parse_variant"]


def __getattr__(name: str):  # CATALOGUE and DEFAULTS, as the registry holds them now
    if name == "CATALOGUE":
        return catalogue()
    if name == "DEFAULTS":
        return defaults()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def catalogue() -> tuple[str, ...]:
    """Every variant the benchmarks know, kind by kind (a name outside it still parses)."""
    return tuple(name for spec in SPECS.values() for name in spec.catalogue)


def defaults() -> dict[str, str]:
    """Per kind, the variant of its default options (init-ranker's and train's defaults)."""
    return {kind: spec.default_name for kind, spec in SPECS.items()}


def parse_variant(name: str) -> Variant:
    for spec in SPECS.values():
        if (variant := spec.parse_variant(name)) is not None:
            return variant
    raise CheckpointError(
        f"unknown ranker variant {name!r}: use {', '.join(s.variant_grammar for s in SPECS.values())}"
    )


def default_variant(kind: str) -> Variant:
    """The variant that ``init-ranker <kind>`` makes without options."""
    return parse_variant(spec_of(kind).default_name)


def match_variants(patterns: list[str], names: tuple[str, ...] | None = None) -> list[str]:
    """Names or glob patterns over ``names`` (default: :func:`catalogue`; explicit names outside it are kept,
    and parsed when used), in the order given, each once."""
    names = catalogue() if names is None else names
    out: list[str] = []
    for pattern in patterns:
        matched = fnmatch.filter(names, pattern) if any(c in pattern for c in "*?[") else [pattern]
        if not matched:
            raise CheckpointError(f"--rankers {pattern!r} matches no variant of {', '.join(names)}")
        out += [n for n in matched if n not in out]
    for n in out:
        parse_variant(n)
    return out
