"""What a ranker kind declares about itself (:class:`RankerSpec`), and the declared options every command
derives its flags from (:func:`option`, :func:`option_specs`).

A kind is one module: its :class:`~aheadrank.rankers.base.Ranker` subclass, a dataclass of its own options
(one :func:`option` field each: default and help) and ``SPEC = RankerSpec(...)``; ``rankers/registry.py``
registers it in one line. The CLI's ``--ranker`` choices and ranker flags, the variant names, each kind's
defaults and the rule for which options belong to which kind all derive from the registered specs. This
module imports nothing of the rankers, so that every ranker module can import it.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def option(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field declaring one option: its default and help, plus optional ``flag`` (the CLI name,
    e.g. ``"--layers"`` or ``"--tied/--untied"``; default ``--field-name``, ``--x/--no-x`` for a bool),
    ``choices`` and ``env`` (its environment variable, where the default one means another thing elsewhere)."""
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class OptionSpec:
    """One declared option as a command-line flag (typer in the CLI, argparse in the benchmarks)."""

    name: str  # the field name (keyword of the dataclass / init_ranker)
    type: Any  # int, float, str or bool
    default: Any  # the dataclass default (what "not given" falls back to, unless a recipe says otherwise)
    help: str
    flag: str  # "--name" or "--name/--negation" for a bool
    choices: tuple[str, ...] | None = None
    env: str | None = (
        None  # its environment variable where AHEADRANK_<NAME> means something else to another command
    )

    @property
    def names(self) -> tuple[str, str | None]:
        """(the flag, its negation or None)."""
        on, _, off = self.flag.partition("/")
        return on, off or None


def option_specs(cls: type) -> list[OptionSpec]:
    """The options a dataclass declares, in field order."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = _scalar(hints[f.name])
        flag = f.metadata.get("flag") or "--" + f.name.replace("_", "-")
        if kind is bool and "/" not in flag:
            flag = f"{flag}/--no-{flag[2:]}"
        default = f.default if f.default is not dataclasses.MISSING else None
        choices = f.metadata.get("choices")
        env = f.metadata.get("env")
        out.append(OptionSpec(f.name, kind, default, f.metadata.get("help", ""), flag, choices, env))
    return out


def _scalar(hint: Any) -> Any:
    """``int | None`` -> ``int``."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args and typing.get_origin(hint) is not None else hint


@dataclass(frozen=True)
class Variant:
    """A named ranker variant: a kind with some of its own options set (the rest are the kind's defaults)."""

    name: str  # as in --rankers, result tables and run file names
    model: str  # the checkpoint it uses (MORES s1 and s2 share one)
    kind: str
    options: dict[str, Any] = field(default_factory=dict)  # the kind's own options (init_ranker keywords)
    strategy: str | None = None  # which fields the store keeps (MORES s1 / s2); None for the other kinds

    def init(self, **kwargs: Any):
        """A new (untrained) ranker of this variant; ``kwargs`` go to :func:`rankers.init_ranker`."""
        from aheadrank.rankers.checkpoint import init_ranker

        return init_ranker(self.kind, **self.options, **kwargs)

    def field_dims(self, base: Any = None) -> dict[str, int]:
        """The stored fields (name -> dim) of this variant's rankers on ``base``, from its config: no weights read."""
        from aheadrank.rankers.checkpoint import new_field_dims

        return new_field_dims(self.kind, base, self.strategy, **self.options)


@dataclass(frozen=True)
class RankerSpec:
    """Everything the rest of aheadrank needs to know about a ranker kind."""

    kind: str
    ranker: type  # the Ranker subclass (its ``kind`` is this spec's)
    options: type | None = None  # a dataclass of the kind's own options (:func:`option` fields)
    # the variant names the benchmarks know (result tables, --rankers globs); default: the kind's name
    variants: tuple[str, ...] = ()
    # a variant name of this kind -> its Variant, None for a name that is not one (default: the kind's name
    # alone, with the default options)
    parse: Callable[[str], Variant | None] | None = None
    default_variant: str = ""  # the variant the default options make (default: the kind's name)
    grammar: str = ""  # the variant names, for error messages (default: the kind's name)

    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(self.options)) if self.options else ()

    def defaults(self) -> dict[str, Any]:
        """The kind's own options as ``init-ranker`` makes them without flags."""
        return {o.name: o.default for o in option_specs(self.options)} if self.options else {}

    def parse_variant(self, name: str) -> Variant | None:
        if self.parse is not None:
            return self.parse(name)
        return Variant(name, name, self.kind) if name == self.kind else None

    @property
    def catalogue(self) -> tuple[str, ...]:
        return self.variants or (self.kind,)

    @property
    def default_name(self) -> str:
        return self.default_variant or self.kind

    @property
    def variant_grammar(self) -> str:
        return self.grammar or self.kind
