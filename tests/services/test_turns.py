"""services/turns.py: generator jobs take turns step by step on the one thread; plain jobs run in one turn."""

from __future__ import annotations

import threading

import pytest
from aheadrank.services.turns import TurnExecutor, drive


def _steps(name: str, n: int, log: list, gate: threading.Event | None = None):
    if gate is not None:
        gate.wait(10)
    for i in range(n):
        log.append((name, i))
        yield
    return f"{name} done"


def test_jobs_take_turns_and_a_short_one_finishes_first():
    log: list = []
    gate = threading.Event()
    ex = TurnExecutor("test-turns")
    try:
        first = ex.submit(lambda: _steps("long", 6, log, gate))  # holds the thread until all are queued
        short = ex.submit(lambda: _steps("short", 2, log))
        plain = ex.submit(lambda: log.append(("plain", 0)) or 42)
        gate.set()
        assert first.result(10) == "long done" and short.result(10) == "short done" and plain.result(10) == 42
    finally:
        ex.shutdown()
    names = [n for n, _ in log]
    assert names.index("plain") < names.index("long", 2)  # the plain job ran between the long one's steps
    assert max(i for i, (n, _) in enumerate(log) if n == "short") < max(
        i for i, (n, _) in enumerate(log) if n == "long"
    )
    assert [i for n, i in log if n == "long"] == list(range(6))  # each job's own steps stay in order
    assert all(n == "long" for n, _ in log[-3:])  # alone at the end: no turns to give


def test_errors_reach_the_caller_and_shutdown_finishes_the_line():
    def boom():
        yield
        raise ValueError("step 2")

    ex = TurnExecutor("test-turns")
    bad = ex.submit(boom)
    log: list = []
    good = ex.submit(lambda: _steps("g", 3, log))
    ex.shutdown(wait=True)
    with pytest.raises(ValueError, match="step 2"):
        bad.result(1)
    assert good.result(1) == "g done" and len(log) == 3
    with pytest.raises(RuntimeError):
        ex.submit(lambda: None)
    assert drive(_steps("d", 2, [])) == "d done"


def test_drive_reports_each_step_as_the_executor_does():
    got: list[float] = []
    assert drive(_steps("d", 3, []), got.append) == "d done"
    assert len(got) == 4 and all(s >= 0 for s in got)  # three steps that yield, the one that returns
