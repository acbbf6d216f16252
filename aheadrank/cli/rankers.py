"""``aheadrank init-ranker``, and the ranker options that ``init-ranker``, ``train`` and
``pretrain-compressor`` share (declared once here)."""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Any

import typer

from aheadrank.cli.app import app
from aheadrank.cli.options import opt, option_block, user_errors, with_options


class Kind(str, Enum):
    bert = "bert"
    mores = "mores"
    prettr = "prettr"
    tk = "tk"


class Pooling(str, Enum):
    cls = "cls"
    mean = "mean"


# flag -> (init_ranker keyword, type, typer option): every ranker option, declared once
_RANKER_OPTIONS: dict[str, tuple[str, Any, Any]] = {
    "ibs": ("ibs", int | None, opt(None, "--ibs", help="MORES: interaction blocks K (1..4)")),
    "pooling": ("pooling", Pooling | None, opt(None, "--pooling", help="MORES: cls or mean")),
    "tied": ("tied", bool | None, opt(None, "--tied/--untied", help="MORES: tie query/document modules")),
    "layer": ("layer", int | None, opt(None, "--layer", help="PreTTR: split layer l")),
    "compress": (
        "compress",
        int | None,
        opt(None, "--compress", help="PreTTR: compressed dims e (0 = none)"),
    ),
    "layers": ("tk_layers", int | None, opt(None, "--layers", help="TK: contextualisation layers")),
    "tk_base": (
        "tk_base",
        bool | None,
        opt(
            None,
            "--tk-base/--tk-scratch",
            help="TK: the contextualisation starts from the base's embedding and first --layers layers, or "
            "from small random layers over its word embeddings",
        ),
    ),
    "sim": (
        "sim",
        bool | None,
        opt(
            None,
            "--sim/--no-sim",
            help="MORES / PreTTR: add α·cos(pooled query, pooled document) with a zero-initialised head "
            "(starts from the base's bi-encoder similarity; what makes MORES learn, see the README)",
        ),
    ),
    "max_query_len": ("max_query_len", int | None, opt(None, "--max-query-len")),
    "max_doc_len": ("max_doc_len", int | None, opt(None, "--max-doc-len")),
}


def ranker_options_block(*names: str) -> Any:
    """The block of these ranker options (all of them by default); the command gets ``ranker_options``."""
    chosen = names or tuple(_RANKER_OPTIONS)
    return option_block("ranker_options", **{n: _RANKER_OPTIONS[n][1:] for n in chosen})


RANKER_OPTIONS = ranker_options_block()


def init_options(kind: str, given: dict[str, Any]) -> dict[str, Any]:
    """The command's ranker options as :func:`rankers.init_ranker` keywords; options of another kind are
    refused (rankers.config's one rule), naming their flags."""
    from aheadrank.errors import CheckpointError
    from aheadrank.rankers.config import foreign_options

    options = {_RANKER_OPTIONS[n][0]: v.value if isinstance(v, Enum) else v for n, v in given.items()}
    flags = {_RANKER_OPTIONS[n][0]: _RANKER_OPTIONS[n][2].param_decls[0].split("/")[0] for n in given}
    foreign = foreign_options(kind, options)
    if foreign:
        raise CheckpointError(f"{', '.join(flags[k] for k in foreign)} does not apply to a {kind} ranker")
    return options


@app.command("init-ranker")
@user_errors
@with_options(RANKER_OPTIONS)
def init_ranker_cmd(
    kind: Kind = typer.Argument(..., help="ranker kind"),
    out: Path = opt(..., "--out", help="checkpoint directory to write"),
    base: Path | None = opt(None, "--base", help="base BERT folder (default: packaged MiniLM)"),
    seed: int = opt(0, "--seed"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing checkpoint directory"),
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
    replace: bool = typer.Option(
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
