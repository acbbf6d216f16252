"""``aheadrank init-ranker``: a new checkpoint with BERT-weight-assisted initialisation."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from aheadrank.cli.app import app
from aheadrank.cli.options import env, user_errors


class Kind(str, Enum):
    bert = "bert"
    mores = "mores"
    prettr = "prettr"
    tk = "tk"


class Pooling(str, Enum):
    cls = "cls"
    mean = "mean"


@app.command("init-ranker")
@user_errors
def init_ranker_cmd(
    kind: Kind = typer.Argument(..., help="ranker kind"),
    out: Path = typer.Option(..., "--out", envvar=env("out"), help="checkpoint directory to write"),
    base: Path | None = typer.Option(
        None, "--base", envvar=env("base"), help="base BERT folder (default: packaged MiniLM)"
    ),
    ibs: int | None = typer.Option(
        None, "--ibs", envvar=env("ibs"), help="MORES: interaction blocks K (1..4)"
    ),
    pooling: Pooling | None = typer.Option(
        None, "--pooling", envvar=env("pooling"), help="MORES: cls or mean"
    ),
    tied: bool | None = typer.Option(
        None, "--tied/--untied", envvar=env("tied"), help="MORES: tie query/document modules"
    ),
    layer: int | None = typer.Option(None, "--layer", envvar=env("layer"), help="PreTTR: split layer l"),
    compress: int | None = typer.Option(
        None, "--compress", envvar=env("compress"), help="PreTTR: compressed dims e (0 = none)"
    ),
    layers: int | None = typer.Option(
        None, "--layers", envvar=env("layers"), help="TK: contextualisation layers"
    ),
    max_query_len: int | None = typer.Option(None, "--max-query-len", envvar=env("max-query-len")),
    max_doc_len: int | None = typer.Option(None, "--max-doc-len", envvar=env("max-doc-len")),
    seed: int = typer.Option(0, "--seed", envvar=env("seed")),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace an existing checkpoint directory"),
) -> None:
    """Write a new checkpoint directory (config.json, model.safetensors, tokenizer, fingerprint)."""
    from aheadrank.errors import CheckpointError
    from rankers import init_ranker, save_checkpoint

    own = {
        "mores": {"ibs": ibs, "pooling": pooling.value if pooling else None, "tied": tied},
        "prettr": {"layer": layer, "compress": compress},
        "tk": {"tk_layers": layers},
    }
    flags = {
        "ibs": "--ibs",
        "pooling": "--pooling",
        "tied": "--tied",
        "layer": "--layer",
        "compress": "--compress",
        "tk_layers": "--layers",
    }
    foreign = [
        flags[k] for other, o in own.items() if other != kind.value for k, v in o.items() if v is not None
    ]
    if foreign:
        raise CheckpointError(f"{', '.join(foreign)} does not apply to a {kind.value} ranker")
    opts = {**own.get(kind.value, {}), "max_query_len": max_query_len, "max_doc_len": max_doc_len}
    ranker = init_ranker(kind.value, base=base, seed=seed, **opts)
    fp = save_checkpoint(ranker, out, overwrite=overwrite)
    typer.echo(f"wrote {kind.value} checkpoint to {out} (fingerprint {fp[:16]}); {ranker.describe()}")
