"""The one registry of ranker variants and their names, used by the CLI's demo and every benchmark.

Names: ``bert``; ``mores-<K>ib-s1`` / ``-s2`` (MORES, ClsPool, Reuse-S1 / S2: one checkpoint, two stores),
``mores-<K>ib-mean`` (EARL AvePool), ``mores-<K>ib-tied`` (EARL Tied); ``prettr-l<l>-e<e>``; ``tk-<n>l`` (``-base`` / ``-scratch``: TK's contextualisation from the base's layers or from scratch).
A variant's options are its kind's own (:data:`rankers.config.KIND_OPTIONS`); the rest are the defaults of
:func:`rankers.config.default_options`, and :data:`DEFAULTS` names the variant those defaults make.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any

from aheadrank.rankers.config import KINDS, default_options

from aheadrank.errors import CheckpointError


@dataclass(frozen=True)
class Variant:
    name: str  # as in --rankers, result tables and run file names
    model: str  # the checkpoint it uses (MORES s1 and s2 share one)
    kind: str
    options: dict[str, Any] = field(default_factory=dict)  # the kind's own options (init_ranker keywords)
    strategy: str | None = None  # which fields MORES stores (s1 / s2); None for the other kinds

    def init(self, **kwargs: Any):
        """A new (untrained) ranker of this variant; ``kwargs`` go to :func:`rankers.init_ranker`."""
        from aheadrank.rankers.checkpoint import init_ranker

        return init_ranker(self.kind, **self.options, **kwargs)


# every variant the benchmarks know (a name outside it still parses)
CATALOGUE = (
    "bert",
    "mores-1ib-s1",
    "mores-1ib-s2",
    "mores-2ib-s1",
    "mores-2ib-s2",
    "mores-2ib-mean",
    "mores-2ib-tied",
    "prettr-l4-e0",
    "prettr-l4-e128",
    "prettr-l4-e256",
    "prettr-l5-e0",
    "prettr-l5-e128",
    "prettr-l5-e256",
    "tk-1l",
    "tk-2l",
)
# per kind, the variant of default_options(kind) (init-ranker's and train's defaults)
DEFAULTS = {"bert": "bert", "mores": "mores-2ib-s2", "prettr": "prettr-l5-e128", "tk": "tk-2l"}


def parse_variant(name: str) -> Variant:
    if name == "bert":
        return Variant(name, name, "bert")
    if m := re.fullmatch(r"mores-(\d+)ib-(s1|s2|mean|tied)", name):
        ibs, what = int(m.group(1)), m.group(2)
        options = {"ibs": ibs, "pooling": "mean" if what == "mean" else "cls", "tied": what == "tied"}
        model = f"mores-{ibs}ib" if what in ("s1", "s2") else name
        return Variant(name, model, "mores", options, what if what in ("s1", "s2") else "s2")
    if m := re.fullmatch(r"prettr-l(\d+)-e(\d+)", name):
        return Variant(name, name, "prettr", {"layer": int(m.group(1)), "compress": int(m.group(2))})
    if m := re.fullmatch(r"tk-(\d+)l(-base|-scratch)?", name):
        # -base / -scratch: the contextualisation from the base's layers or from small random ones; neither:
        # the default (rankers.config), written out so that the two never share a cache key
        base = m.group(2) == "-base" if m.group(2) else default_options("tk")["tk_base"]
        return Variant(name, name, "tk", {"tk_layers": int(m.group(1)), "tk_base": base})
    raise CheckpointError(
        f"unknown ranker variant {name!r}: use bert, mores-<K>ib-s1|s2|mean|tied, prettr-l<l>-e<e> or tk-<n>l[-base|-scratch]"
    )


def default_variant(kind: str) -> Variant:
    """The variant that ``init-ranker <kind>`` makes without options."""
    if kind not in KINDS:
        raise CheckpointError(f"unknown ranker kind {kind!r}; expected one of {', '.join(KINDS)}")
    return parse_variant(DEFAULTS[kind])


def match_variants(patterns: list[str], names: tuple[str, ...] = CATALOGUE) -> list[str]:
    """Names or glob patterns over ``names`` (explicit names outside it are kept, and parsed when used), in
    the order given, each once."""
    out: list[str] = []
    for pattern in patterns:
        matched = fnmatch.filter(names, pattern) if any(c in pattern for c in "*?[") else [pattern]
        if not matched:
            raise CheckpointError(f"--rankers {pattern!r} matches no variant of {', '.join(names)}")
        out += [n for n in matched if n not in out]
    for n in out:
        parse_variant(n)
    return out
