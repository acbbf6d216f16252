"""The one typer application; each ``aheadrank.cli`` module registers its commands on it."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="aheadrank",
    help="Embed ahead, rank later: offline document-side indexing + online transformer re-ranking.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def _root() -> None:
    """aheadrank: offline document-side indexing + online transformer re-ranking."""
