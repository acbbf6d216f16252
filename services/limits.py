"""Connection limits for uvicorn's h11 protocol: a read timeout and a cap on open connections.

uvicorn waits for a request's head forever and accepts connections until the process runs out of file
descriptors: a few thousand clients that send half a request (slowloris) starve every other client and
flood the log with ``Too many open files``. :func:`guarded_h11` returns the protocol the server runs:

- **Read timeout.** A connection must deliver a complete request head within ``read_timeout`` seconds of
  opening (or of its previous response), and a body may pause no longer than that between chunks; else
  the connection is closed without a response. A request being processed is never timed out here.
- **Connection cap.** At most ``max_connections`` are open. A new one beyond the cap closes the oldest
  connection that has no request in progress (idle keep-alive or half-sent); if every connection is busy,
  the new one is closed. So ``/health`` and real clients still get in while a flood holds the rest.
- **Send timeout.** A client that does not read its response (the transport's write buffer, over its
  high-water mark or left after the response, does not shrink for ``send_timeout`` seconds) has its
  connection aborted, which frees the buffered response and the descriptor; asyncio's ``close()`` would wait
  for a flush that never comes. A connection evicted or timed out with bytes unsent is aborted at once.

Closes are counted (:data:`STATS`) and logged at most once per ``_LOG_EVERY_S`` seconds.
"""

from __future__ import annotations

import collections
import logging
import resource
import time
from typing import Any

log = logging.getLogger("aheadrank.service")
STATS = {"read_timeouts": 0, "evicted": 0, "refused": 0, "send_timeouts": 0}
_LOG_EVERY_S = 10.0
_last_log = [0.0]
_FD_RESERVE = 128  # descriptors kept for the store, the index, logs and the JVM


def connection_cap(requested: int) -> int:
    """``requested``, lowered to fit the process's open-file limit (raised to its hard limit first)."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = requested + _FD_RESERVE
        if soft != resource.RLIM_INFINITY and soft < want:
            new = want if hard == resource.RLIM_INFINITY else min(want, hard)
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
    except (ValueError, OSError):
        return requested
    if soft == resource.RLIM_INFINITY:
        return requested
    cap = max(1, min(requested, soft - _FD_RESERVE))
    if cap < requested:
        log.warning("max_connections lowered from %d to %d by the open-file limit %d", requested, cap, soft)
    return cap


def _note(kind: str) -> None:
    STATS[kind] += 1
    now = time.monotonic()
    if now - _last_log[0] >= _LOG_EVERY_S:
        _last_log[0] = now
        log.warning(
            "closed connections so far: %d read timeouts, %d evicted at the connection cap, %d refused, "
            "%d send timeouts (client not reading)",
            STATS["read_timeouts"],
            STATS["evicted"],
            STATS["refused"],
            STATS["send_timeouts"],
        )


def guarded_h11(read_timeout: float, max_connections: int, send_timeout: float = 10.0) -> type:
    """uvicorn's H11Protocol with a read timeout, a connection cap and a send timeout (pass as
    ``uvicorn.Config(http=...)``)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    finished = (h11.DONE, h11.MUST_CLOSE, h11.CLOSED, h11.ERROR)

    class GuardedH11Protocol(H11Protocol):
        _read_timer: Any = None
        _write_timer: Any = None

        def _order(self) -> collections.OrderedDict:
            order = getattr(self.server_state, "aheadrank_order", None)
            if order is None:
                order = collections.OrderedDict()
                self.server_state.aheadrank_order = order
            return order

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            order = self._order()
            order[self] = None
            if len(order) > max_connections:
                self._make_room(order)
            if not self.transport.is_closing():
                self._arm()

        def _make_room(self, order: collections.OrderedDict) -> None:
            for other in order:
                if other is self:
                    continue
                cycle = other.cycle
                if cycle is None or cycle.response_complete:  # nothing in progress: idle or half-sent
                    del order[other]
                    other._disarm()
                    other._shut()
                    _note("evicted")
                    return
            del order[self]  # every other connection is busy with a request
            self.transport.close()
            _note("refused")

        def connection_lost(self, exc: Exception | None) -> None:
            self._order().pop(self, None)
            self._disarm()
            self._disarm_write()
            super().connection_lost(exc)

        def _shut(self) -> None:
            """Close; abort if response bytes are still unsent (a flush that may never come)."""
            if self.transport.get_write_buffer_size():
                self.transport.abort()
            else:
                self.transport.close()

        def pause_writing(self) -> None:  # the write buffer went over its high-water mark
            super().pause_writing()
            self._watch_write()

        def _watch_write(self) -> None:
            """Abort unless the write buffer shrinks within ``send_timeout`` (again and again until empty)."""
            if self._write_timer is None:
                size = self.transport.get_write_buffer_size()
                self._write_timer = self.loop.call_later(send_timeout, self._send_check, size)

        def _disarm_write(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _send_check(self, before: int) -> None:
            self._write_timer = None
            size = self.transport.get_write_buffer_size()
            if size == 0 and not self.flow.write_paused:
                return
            if size < before:  # a slow reader, but a reader
                self._watch_write()
                return
            self.transport.abort()  # uvicorn's connection_lost wakes a send() waiting to drain
            _note("send_timeouts")

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing() or self.conn.their_state in finished:
                self._disarm()
            elif self.conn.their_state is h11.SEND_BODY:
                self._arm()  # the body: an idle timeout between chunks
            # h11.IDLE: the head is still incomplete; its timer keeps running from the connection's start

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if self.transport.get_write_buffer_size():  # not yet taken by the client, maybe never
                self._watch_write()
            if not self.transport.is_closing() and self.conn.their_state not in finished:
                self._arm()  # the next request's head

        def _arm(self) -> None:
            self._disarm()
            self._read_timer = self.loop.call_later(read_timeout, self._timed_out)

        def _disarm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
                self._read_timer = None

        def _timed_out(self) -> None:
            self._read_timer = None
            if self.transport.is_closing() or self.conn.their_state in finished:
                return
            if (
                self.cycle is not None
                and not self.cycle.response_complete
                and self.conn.their_state is h11.IDLE
            ):
                return  # between pipelined requests while one is processed
            self._shut()
            _note("read_timeouts")

    return GuardedH11Protocol
