"""Helpers shared by every part's CLI commands: clear errors instead of tracebacks, env-mirrored options."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import typer

from aheadrank.errors import AheadrankError

F = TypeVar("F", bound=Callable[..., Any])


def env(name: str) -> str:
    """The environment variable that mirrors a CLI option: ``--max-doc-len`` -> ``AHEADRANK_MAX_DOC_LEN``."""
    return "AHEADRANK_" + name.lstrip("-").upper().replace("-", "_")


def user_errors(func: F) -> F:
    """Turn AheadrankError (bad input) into ``error: ...`` on stderr and exit code 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except AheadrankError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(2) from None

    return wrapper  # type: ignore[return-value]


def opt(default: Any, *flags: str, envvar: str | list[str] | None = None, **kwargs: Any) -> Any:
    """A typer option mirrored by its environment variable (:func:`env` of the first flag name)."""
    return typer.Option(default, *flags, envvar=envvar or env(flags[0].split("/")[0]), **kwargs)


def _checked_device(value: str) -> str:
    from aheadrank.devices import check_device

    try:
        # auto: cuda where a GPU is visible, else cpu (as serve reads it)
        return check_device(value, auto=True)
    except AheadrankError as exc:
        raise typer.BadParameter(str(exc).removeprefix(f"--device {value}: ")) from None


def device_opt(help: str = "cpu, cuda, cuda:N or auto (cuda where a GPU is visible)") -> Any:
    """``--device`` (``AHEADRANK_DEVICE``), checked as it is parsed (:func:`aheadrank.devices.check_device`)."""
    return opt("cpu", "--device", help=help, callback=_checked_device)


def scheduler_opt(help: str = "Dask scheduler address, tcp://HOST:PORT.") -> Any:
    """``--scheduler`` (``AHEADRANK_SCHEDULER``): shards encoded by an existing Dask cluster."""
    return opt(None, "--scheduler", help=help)


def workers_opt(help: str = "Run on a local Dask cluster of N workers.") -> Any:
    """``--workers`` (``AHEADRANK_WORKERS``): shards encoded by a local Dask cluster of that many processes."""
    return opt(None, "--workers", min=1, help=help)


def _checked_verify_mode(value: str) -> str:
    from aheadrank.store.verify import VERIFY_MODES

    if value not in VERIFY_MODES:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(VERIFY_MODES)}")
    return value


def _checked_aggregation(value: str | None) -> str | None:
    from aheadrank.passages import served_aggregation

    try:  # the one rule the service and the batch jobs apply
        return None if value is None else served_aggregation(value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def aggregation_opt(default_is: str) -> Any:
    """``--passage-aggregation`` (``AHEADRANK_PASSAGE_AGGREGATION``, the variable ``serve`` reads too): a long
    document's score from its passages' (aheadrank.passages.served_aggregation); not given: ``default_is``."""
    return opt(
        None,
        "--passage-aggregation",
        help=f"a store with passages: a long document's score from its passages' (maxp, meanp or first+max); "
        f"default: {default_is}",
        callback=_checked_aggregation,
    )


def verify_store_opt() -> Any:
    """A batch job's ``--verify-store`` (``AHEADRANK_VERIFY_STORE``, the variable ``serve`` reads too, hence its
    values): the shards' sha256 before anything is read (store.verify.verify_before_reading)."""
    return opt(
        "start",
        "--verify-store",
        help="start: check the sha256 of every shard the job reads (the store, passages/, dense/, windows/) before "
        "the first query, a mismatch refusing the job with nothing written (about 1 s a GB); background: the same "
        "(a batch job does not overlap it); off: only the size checks",
        callback=_checked_verify_mode,
    )


@dataclass(frozen=True)
class OptionBlock:
    """Options several commands share, declared once: a command given the block by :func:`with_options`
    receives their values as one dict, under the keyword ``name``."""

    name: str
    params: tuple[inspect.Parameter, ...]


def option_block(name: str, **options: tuple[Any, Any]) -> OptionBlock:
    """``option_block("shape", ibs=(int | None, opt(None, "--ibs")), ...)``: name -> (type, typer option)."""
    return OptionBlock(
        name,
        tuple(
            inspect.Parameter(key, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=kind)
            for key, (kind, option) in options.items()
        ),
    )


def with_options(*blocks: OptionBlock) -> Callable[[F], F]:
    """Add each block's options to a command; it receives them as ``{block.name: {option: value}}``."""

    def decorate(func: F) -> F:
        sig = inspect.signature(func, eval_str=True)
        names = {b.name for b in blocks}
        kept = [p for p in sig.parameters.values() if p.name not in names]
        positional = [p for p in kept if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        keyword = [p for p in kept if p.kind is inspect.Parameter.KEYWORD_ONLY]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for b in blocks:
                kwargs[b.name] = {p.name: kwargs.pop(p.name) for p in b.params}
            return func(*args, **kwargs)

        extra = [p for b in blocks for p in b.params]
        wrapper.__signature__ = sig.replace(parameters=[*positional, *keyword, *extra])  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorate


def settings_block(name: str, model: Any, fields: Sequence[str], **overrides: dict[str, Any]) -> OptionBlock:
    """Options declared by a pydantic settings model's fields: the flag is ``--field-name``, the default,
    bounds (``ge``/``le``; ``gt`` is left to the model's own check) and help come from the field, so a limit
    is spelled once, in the model (``overrides``: extra typer keywords per field)."""
    options = {}
    for field_name in fields:
        info = model.model_fields[field_name]
        bounds: dict[str, Any] = {}
        for meta in info.metadata:
            if getattr(meta, "ge", None) is not None:
                bounds["min"] = meta.ge
            if getattr(meta, "le", None) is not None:
                bounds["max"] = meta.le
        flag = "--" + field_name.replace("_", "-")
        if info.annotation is bool:
            flag = f"{flag}/--no-{flag[2:]}"
        kwargs = {"help": info.description, **bounds, **overrides.get(field_name, {})}
        default = ... if info.is_required() else info.get_default()
        default = kwargs.pop("default", default)  # e.g. a required field another argument can fill
        options[field_name] = (info.annotation, opt(default, flag, **kwargs))
    return option_block(name, **options)


def spec_block(name: str, specs: Sequence[Any]) -> OptionBlock:
    """Options declared by :class:`~aheadrank.rankers.spec.OptionSpec` (a dataclass field each: flag, type,
    help), every one defaulting to None ("not given": the command resolves it, e.g. from the recipe)."""
    return option_block(
        name, **{o.name: (o.type | None, opt(None, o.flag, envvar=o.env, help=o.help)) for o in specs}
    )
