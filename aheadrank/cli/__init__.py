"""``aheadrank`` console script: the typer app with every part's commands, each in its own module here.

The command set is explicit: each module below registers its commands on :data:`app` when imported, and a
missing one is an ImportError, never a silently smaller CLI. Nothing outside this package imports it.
Every option is mirrored by an environment variable ``AHEADRANK_<OPTION>`` (:func:`options.env`).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# each module registers its commands on `app` at import (cheap: heavy imports live inside the commands)
from aheadrank.cli import build, evaluate, indexer, rankers, runs, serve, store  # noqa: E402
from aheadrank.cli.app import app  # noqa: E402

COMMAND_MODULES = tuple(m.__name__ for m in (rankers, store, indexer, serve, evaluate, runs, build))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
