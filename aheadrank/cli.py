"""``aheadrank`` console script: imports every part's command module, then runs the typer app.

Every option is mirrored by an environment variable ``AHEADRANK_<OPTION>`` (typer ``envvar=``).
"""

from __future__ import annotations

import importlib
import os

from aheadrank.app import app

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# each module registers its commands on `app` at import (cheap: heavy imports live inside the commands)
COMMAND_MODULES = (
    "rankers.commands",
    "store.commands",
    "indexer.commands",
    "services.commands",
    "aheadrank.commands",
    "aheadrank.run_commands",
)

for _name in COMMAND_MODULES:
    try:
        importlib.import_module(_name)
    except ModuleNotFoundError as exc:  # a part not built yet
        if exc.name != _name:
            raise


def main() -> None:
    app()


if __name__ == "__main__":
    main()
