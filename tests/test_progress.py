"""aheadrank.logs.progress_bar: a bar redrawn in place on a terminal, progress lines in a log."""

from __future__ import annotations

import io

from aheadrank import logs


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_progress_lines_not_a_redrawn_bar(monkeypatch):
    log = io.StringIO()
    monkeypatch.setattr("sys.stderr", log)
    bar = logs.progress_bar(range(6), desc="index", unit="doc", mininterval=0.5)
    assert bar.mininterval == bar.maxinterval == logs.LOG_PROGRESS_S  # a line at most every 30 s
    for i in bar:
        bar.set_postfix(step=i)  # shown with the next line, not a line of its own
    text = log.getvalue()
    lines = text.splitlines()
    assert "\r" not in text and text.endswith("\n") and all(line == line.rstrip() for line in lines)
    assert len(lines) == 2, lines  # the start and the end (the count, the time and the rate)
    assert lines[0].startswith("index:   0%") and lines[-1].startswith("index: 100%") and "6/6" in lines[-1]


def test_a_terminal_gets_the_bar_redrawn_in_place(monkeypatch):
    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    for _ in logs.progress_bar(range(3), desc="index", file=screen):
        pass
    assert "\r" in screen.getvalue()
