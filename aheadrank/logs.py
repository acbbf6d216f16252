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


LOG_PROGRESS_S = 30.0  # where stderr is not a terminal: a progress line at most this often


class _Lines:
    """tqdm's stream where stderr is not a terminal (a container's log, a CI log, a file): each update on a line
    of its own, without the carriage returns and padding that redraw a bar in place (in a log they join every
    update of a stage into one line)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> None:
        for part in text.replace("\r", "\n").split("\n"):
            if part.strip():
                self.stream.write(part.rstrip() + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(iterable=None, **kwargs):
    """A tqdm bar for a long job: redrawn in place on a terminal; elsewhere one line per update, at most every
    ``LOG_PROGRESS_S`` seconds, and the last on its end (the count, the time and the rate)."""
    stream = sys.stderr
    if stream.isatty():
        from tqdm.auto import tqdm

        kwargs.setdefault("dynamic_ncols", True)
        return tqdm(iterable, **kwargs)
    from tqdm import tqdm

    class LogBar(tqdm):
        """A new postfix or description is shown with the next line, not drawn at once (a line a step)."""

        def set_postfix(self, ordered_dict=None, refresh=True, **kw):
            super().set_postfix(ordered_dict, refresh=False, **kw)

        def set_postfix_str(self, s="", refresh=True):
            super().set_postfix_str(s, refresh=False)

        def set_description(self, desc=None, refresh=True):
            super().set_description(desc, refresh=False)

    kwargs.pop("dynamic_ncols", None)
    kwargs["mininterval"] = max(float(kwargs.get("mininterval", 0.1)), LOG_PROGRESS_S)
    kwargs["maxinterval"] = kwargs["mininterval"]  # tqdm's monitor would redraw sooner
    return LogBar(iterable, file=_Lines(stream), ncols=120, **kwargs)
