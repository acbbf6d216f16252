"""The bounded queue counts requests whose clients still wait, and the model thread's turns stay short (issue
37's soak: valid requests got 503 `overloaded` and 504 once the model thread fell behind).

Before: a request answered 504 at its deadline (or whose client went away) kept its slot of ``--max-queue``
until the model thread reached it, so clients answered 504 came back and found the queue full of requests
nobody waited for; and one request of long texts tokenized all of them in one turn of the model thread
(seconds), holding every other request. In-process; the model thread is held by an event, not by time.
"""

from __future__ import annotations

import asyncio
import threading

import faults_testkit  # noqa: F401  (puts the other testkits on sys.path)
import httpx
import pytest
from aheadrank.services import create_app
from aheadrank.services.backend import StageClock, Work
from aheadrank.services.metrics import sample_sum

QUERY = "smoking increases the risk of lung cancer"


@pytest.fixture(scope="module")
def held(service_env):
    """A backend whose re-ranking waits for ``release`` on the model thread, a queue of 2, a 3 s deadline."""
    from test_service_api import make_backend  # tests/services: the same backend, warmed up

    backend = make_backend(service_env, max_queue=2, request_timeout_s=3.0)
    backend.release = threading.Event()
    inner = backend.rerank_steps

    def rerank_steps(*args, **kwargs):
        backend.release.wait(60)
        return inner(*args, **kwargs)

    backend.rerank_steps = rerank_steps
    yield backend
    backend.release.set()
    backend.close()


def test_requests_answered_at_their_deadline_free_their_queue_slots(held):
    held.release.clear()
    app = create_app(held)

    async def scenario():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=60) as c:
            body = {"query": QUERY, "depth": 5}
            # the first holds the model thread, the second waits behind it: both answered 504 at the deadline
            timed_out = await asyncio.gather(*(c.post("/v1/rerank", json=body) for _ in range(2)))
            depth = sample_sum((await c.get("/metrics")).text, "aheadrank_queue_depth")
            # the model thread is still held: a new request must be queued, not refused for a full queue
            later = asyncio.create_task(c.post("/v1/rerank", json=body))
            for _ in range(200):
                await asyncio.sleep(0.01)
                if later.done() or sample_sum((await c.get("/metrics")).text, "aheadrank_queue_depth") >= 1:
                    break
            held.release.set()
            return timed_out, depth, await later

    timed_out, depth, later = asyncio.run(scenario())
    assert [r.status_code for r in timed_out] == [504, 504], [r.text for r in timed_out]
    assert depth == 0  # before: 2, the two answered requests still counted
    assert later.status_code == 200, later.text  # before: 503 overloaded


def test_a_request_whose_client_left_frees_its_slot_before_the_model_thread_reaches_it(held):
    """Driven through ``ModelThread.run`` with a request whose client disconnects while it is queued."""
    from aheadrank.services.metrics import ServiceMetrics
    from aheadrank.services.modelthread import Drain, ModelThread
    from starlette.requests import Request

    held.release.clear()
    model = ModelThread(held.settings, ServiceMetrics(), Drain())
    entered = threading.Event()

    def hold(work):  # the first request: on the model thread until released
        entered.set()
        held.release.wait(60)
        return "held"

    ran = []

    async def scenario():
        import time

        gone = asyncio.Event()

        def request() -> Request:
            async def receive():
                await gone.wait()
                return {"type": "http.disconnect"}

            r = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)
            r.state.arrival = time.perf_counter()
            return r

        first = asyncio.create_task(model.run(hold, request(), "/v1/rerank"))
        await asyncio.to_thread(entered.wait, 10)
        second = asyncio.create_task(model.run(lambda work: ran.append(1), request(), "/v1/rerank"))
        await asyncio.sleep(0.05)
        assert model.pending[0] == 2
        gone.set()  # both clients go away; the model thread is still held by the first
        outcomes = await asyncio.gather(first, second, return_exceptions=True)
        pending = model.pending[0]
        held.release.set()
        return outcomes, pending

    try:
        outcomes, pending = asyncio.run(scenario())
    finally:
        held.release.set()
        model.close(jvm=False)
    # before: both waited for the model thread and got 504 at the deadline
    assert [getattr(o, "status", None) for o in outcomes] == [499, 499], outcomes
    assert pending == 0
    assert ran == []  # the queued one never ran


def test_long_texts_are_split_a_bounded_amount_per_turn_and_equal_texts_once(service_env, monkeypatch):
    from aheadrank.services import backend as backend_module
    from test_service_api import make_backend

    backend = make_backend(service_env)
    calls, log = [], []
    split = backend_module.split_passages

    def counting(tokenizer, texts, opts):
        calls.append(sum(map(len, texts)))
        log.append("split")
        return split(tokenizer, texts, opts)

    monkeypatch.setattr(backend_module, "split_passages", counting)
    words = "lung cancer risk smoking tobacco epidemiology cohort study " * 400  # ~24,000 characters
    texts = [f"{i} {words}" for i in range(40)] + [f"0 {words}"] * 40  # 40 distinct, each twice
    steps = backend.score_texts_steps(QUERY, texts, StageClock(), Work())
    while True:
        try:
            next(steps)
            log.append("turn")
        except StopIteration as stop:
            scores, _ = stop.value
            break
    backend.close()
    assert len(scores) == len(texts) and scores[0] == scores[40]
    # each distinct text split once, and other requests get turns between the groups
    assert sum(calls) == sum(map(len, set(texts)))
    assert max(calls) <= backend_module.SPLIT_CHARS_PER_TURN + max(map(len, texts))
    assert "split" in log and all(a != b or a != "split" for a, b in zip(log, log[1:], strict=False))
