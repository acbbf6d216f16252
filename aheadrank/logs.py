"""The log lines of the commands and the demo: on stderr, whichever stream that is when a record is emitted."""

from __future__ import annotations

import logging
import sys


class CurrentStderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a record is emitted, not the stream of the moment it
    was made: a command run twice in one process (tests through typer's CliRunner, which swaps stderr and closes
    it after) otherwise logs the second run into the first's closed stream, a "Logging error" traceback."""

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ sets it
        pass


def cli_logging(level: int = logging.WARNING) -> None:
    """The commands' log lines (time, logger, message) on stderr at ``level``, set up once a process."""
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s", handlers=[CurrentStderr()])
