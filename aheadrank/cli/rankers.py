"""``aheadrank init-ranker``, and the ranker options that ``init-ranker``, ``train`` and
``pretrain-compressor`` share (declared once here)."""

from __future__ import annotations

from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Any

import typer

from aheadrank.cli.app import app
from aheadrank.cli.options import opt, spec_block, user_errors, with_options
from aheadrank.rankers.spec import OptionSpec


def ranker_kinds() -> type[Enum]:
    """The registered kinds as the choices of ``--ranker`` / ``init-ranker KIND`` (rankers/registry.py)."""
    from aheadrank.rankers.registry import kinds

    return Enum("Kind", {k: k for k in kinds()}, type=str)


Kind = ranker_kinds()
# every kind's reading lengths (RankerConfig fields, not a kind's own options)
LENGTHS = (
    OptionSpec(
        "max_query_len",
        int,
        16,
        "word pieces per query the ranker is trained and validated on (rerank-run, fit-priors and serve read up "
        "to 64 where the ranker's positions allow; PreTTR exactly this)",
        "--max-query-len",
        env="AHEADRANK_RANKER_MAX_QUERY_LEN",  # serve's AHEADRANK_MAX_QUERY_LEN is how much of a query it reads
    ),
    OptionSpec("max_doc_len", int, 128, "word pieces per document the ranker reads", "--max-doc-len"),
)


def ranker_option_specs() -> dict[str, OptionSpec]:
    """Every registered kind's own options (one flag per name; help prefixed with the kinds that have it),
    then the reading lengths: declared once, by each kind's spec (rankers/registry.py)."""
    from aheadrank.rankers.registry import SPECS
    from aheadrank.rankers.spec import option_specs

    specs: dict[str, OptionSpec] = {}
    owners: dict[str, list[str]] = {}
    for kind, spec in SPECS.items():
        for o in option_specs(spec.options) if spec.options else ():
            specs.setdefault(o.name, o)
            owners.setdefault(o.name, []).append(kind)
    out = {n: replace(o, help=f"{', '.join(owners[n])}: {o.help}", default=None) for n, o in specs.items()}
    return {**out, **{o.name: replace(o, default=None) for o in LENGTHS}}


RANKER_SPECS = ranker_option_specs()


def ranker_options_block(*names: str) -> Any:
    """The block of these ranker options (all of them by default); the command gets ``ranker_options``."""
    chosen = names or tuple(RANKER_SPECS)
    return spec_block("ranker_options", [RANKER_SPECS[n] for n in chosen])


RANKER_OPTIONS = ranker_options_block()


def init_options(kind: str, given: dict[str, Any]) -> dict[str, Any]:
    """The command's ranker options as :func:`rankers.init_ranker` keywords; options of another kind are
    refused (rankers.config's one rule), naming their flags."""
    from aheadrank.errors import CheckpointError
    from aheadrank.rankers.config import foreign_options

    foreign = foreign_options(kind, given)
    if foreign:
        flags = ", ".join(RANKER_SPECS[k].names[0] for k in foreign)
        raise CheckpointError(f"{flags} does not apply to a {kind} ranker")
    return dict(given)


@app.command("init-ranker")
@user_errors
@with_options(RANKER_OPTIONS)
def init_ranker_cmd(
    kind: Kind = typer.Argument(..., help="ranker kind"),  # type: ignore[valid-type]
    out: Path = opt(..., "--out", help="checkpoint directory to write"),
    base: Path | None = opt(None, "--base", help="base BERT folder (default: packaged MiniLM)"),
    seed: int = opt(0, "--seed"),
    overwrite: bool = opt(False, "--overwrite", help="replace an existing checkpoint directory"),
    *,
    ranker_options: dict,
) -> None:
    """Write a new checkpoint directory (config.json, model.safetensors, tokenizer, fingerprint)."""
    from aheadrank.rankers import init_ranker, save_checkpoint

    ranker = init_ranker(kind.value, base=base, seed=seed, **init_options(kind.value, ranker_options))
    fp = save_checkpoint(ranker, out, overwrite=overwrite)
    typer.echo(f"wrote {kind.value} checkpoint to {out} (fingerprint {fp[:16]}); {ranker.describe()}")


@app.command("fingerprint-tokenizer")
@user_errors
def fingerprint_tokenizer_cmd(
    checkpoint: Path = typer.Argument(..., help="checkpoint directory"),
    replace: bool = opt(
        False,
        "--replace",
        help="record tokenizer files that differ from the recorded ones (rebuild its stores)",
    ),
) -> None:
    """Record the sha256 of a checkpoint's tokenizer files in its fingerprint.json (checkpoints written before
    they were recorded load with a warning until then). The model fingerprint, and so every store built by
    the checkpoint, does not change."""
    from aheadrank.rankers.checkpoint import load_config, record_tokenizer

    load_config(checkpoint)  # a clear error for a path that is not a checkpoint
    digest = record_tokenizer(checkpoint, replace=replace)
    typer.echo(f"{checkpoint}: tokenizer files recorded (sha256 {digest[:16]}...)")
