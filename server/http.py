"""The HTTP connection: uvicorn's httptools protocol, with bounds on connections that send
no request.

uvicorn closes a connection that stays idle after a response (`timeout_keep_alive`), but not
one that never sends a complete request: a client that opens connections and sends a few
bytes of headers each, never the end (slowloris), holds them forever, and with enough of
them (about 20 000 here, the process's file limit) every other client is locked out.

Contract (`guarded_http(header_timeout_s, max_idle)` gives the protocol class):
- A request's headers must be complete within `header_timeout_s` of the connection opening
  or of the request's first byte; else the connection is closed unanswered.
- A request's body must keep coming: at least `MIN_BODY_BYTES` in every `header_timeout_s`
  until it is complete; else the connection is closed (the request sees a disconnect, and
  what its body reserved of the body budgets is given back). A client that sends a large
  upload's headers and then stalls holds that reservation no longer.
- An answer must keep being read: while more of it waits in the connection's buffer than
  the transport holds before it pauses the writer, at least `MIN_BODY_BYTES` of it must
  go every `header_timeout_s`; else the connection is aborted, and what it buffered is
  freed (a client asking for a 128 MiB buffer on ten connections and reading none held
  1.3 GB of the server's memory for as long as it kept the sockets).
- A request line and headers take at most `MAX_HEAD_BYTES`: past that, before they are
  complete, the connection is answered 431 and closed `REFUSED_LINGER_S` later (uvicorn's
  httptools protocol keeps every header it is sent: 100 MB of them on two connections took
  the server's memory from 0.4 to 2 GB).
- A connection is idle from when it opens, or its last response is complete, until the
  next request's headers are complete. At most `max_idle` are idle at once: a new
  connection past that closes the one idle the longest. A request in progress is never
  closed, and a client that sends its request as it connects (every HTTP client does)
  loses nothing unless `max_idle` connections open in that moment.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any
from weakref import WeakKeyDictionary

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MIN_BODY_BYTES = 1 << 20  # a body's least progress per `header_timeout_s` (about 100 KiB/s)
MAX_HEAD_BYTES = 64 << 10  # a request line and its headers (nginx takes 8 to 32 KiB, h11 16 KiB)
REFUSED_LINGER_S = 1.0  # a connection answered 431 closes this long after
_TOO_LARGE = (b'{"error":"InvalidArgument","detail":"headers: the request line and headers take more than '
              + str(MAX_HEAD_BYTES).encode() + b' bytes; send fewer or shorter headers"}')
TOO_LARGE = (b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
             b"content-length: " + str(len(_TOO_LARGE)).encode() + b"\r\nconnection: close\r\n\r\n"
             + _TOO_LARGE)

Idle = OrderedDict[HttpToolsProtocol, None]  # oldest first
_IDLE: WeakKeyDictionary[Any, Idle] = WeakKeyDictionary()  # per uvicorn server (its state)


def guarded_http(header_timeout_s: float, max_idle: int) -> type[HttpToolsProtocol]:
    class GuardedHttp(_Guarded):
        pass

    GuardedHttp.header_timeout_s = header_timeout_s
    GuardedHttp.max_idle = max_idle
    return GuardedHttp


class _Guarded(HttpToolsProtocol):
    header_timeout_s: float
    max_idle: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._idle = _IDLE.setdefault(self.server_state, OrderedDict())
        self._headers_due: asyncio.TimerHandle | None = None
        self._body_due: asyncio.TimerHandle | None = None
        self._body_bytes = 0  # of the body read since the last check
        self._in_head = True  # what comes now is a request line or headers
        self._refused = False  # its headers ran past `MAX_HEAD_BYTES`: answered, closing
        self._drain_due: asyncio.TimerHandle | None = None  # while writing is paused
        self._drain_left = 0  # bytes buffered at the last check
        self._head_bytes = 0  # of them, read so far

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()
        self._now_idle()
        while len(self._idle) > self.max_idle:
            oldest, _ = self._idle.popitem(last=False)
            oldest.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._drain_off()
        self._disarm()
        self._body_done()
        self._idle.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:  # answered 431: what still comes is read and dropped until it closes
            return
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        # (a chunk that completed the headers has started the count again)
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._refuse_head()

    def _refuse_head(self) -> None:
        """Answer 431 and end the connection: the answer is sent, then the end of this side
        (closing with the client's bytes still unread would reset the connection, and the
        client might lose the answer); what the client still sends is dropped, and the
        connection closes `REFUSED_LINGER_S` later."""
        self._refused = True
        self._disarm()
        if self.cycle is None or self.cycle.response_complete:  # (not inside another's answer)
            self.transport.write(TOO_LARGE)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._headers_due is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._in_head, self._head_bytes = False, 0
        self._disarm()
        self._idle.pop(self, None)
        super().on_headers_complete()
        self._body_bytes = 0
        self._body_due = self.loop.call_later(self.header_timeout_s, self._body_check)

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        super().on_body(body)

    def on_message_complete(self) -> None:
        self._in_head, self._head_bytes = True, 0
        self._body_done()
        super().on_message_complete()

    def _body_done(self) -> None:
        _cancel(self._body_due)
        self._body_due = None

    def _body_check(self) -> None:
        """Every `header_timeout_s` while a body is read: too little came, the connection closes."""
        if self._body_bytes >= MIN_BODY_BYTES:
            self._body_bytes = 0
            self._body_due = self.loop.call_later(self.header_timeout_s, self._body_check)
            return
        self._body_due = None
        if not self.transport.is_closing():
            self.transport.close()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._drain_due is None:
            self._drain_left = self.transport.get_write_buffer_size()
            self._drain_due = self.loop.call_later(self.header_timeout_s, self._drain_check)

    def resume_writing(self) -> None:
        self._drain_off()
        super().resume_writing()

    def _drain_off(self) -> None:
        _cancel(self._drain_due)
        self._drain_due = None

    def _drain_check(self) -> None:
        """Every `header_timeout_s` while writing is paused: too little of the answer was
        read, the connection is aborted. (A transport closing already, after its keep-alive
        time, say, still waits for its buffer to be sent: it is aborted all the same.)"""
        self._drain_due = None
        left = self.transport.get_write_buffer_size()
        if left > max(0, self._drain_left - MIN_BODY_BYTES):
            self.transport.abort()
            return
        self._drain_left = left
        self._drain_due = self.loop.call_later(self.header_timeout_s, self._drain_check)

    def on_response_complete(self) -> None:
        busy = bool(self.pipeline)  # a request already read starts now
        super().on_response_complete()
        if not busy and not self.transport.is_closing():
            self._now_idle()

    def _now_idle(self) -> None:
        self._idle[self] = None
        self._idle.move_to_end(self)

    def _arm(self) -> None:
        self._headers_due = self.loop.call_later(self.header_timeout_s, self._headers_late)

    def _disarm(self) -> None:
        _cancel(self._headers_due)
        self._headers_due = None

    def _headers_late(self) -> None:
        self._headers_due = None
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.keep_alive = False  # (a request pipelined behind one in progress)
        elif not self.transport.is_closing():
            self.transport.close()


def _cancel(timer: asyncio.TimerHandle | None) -> None:
    """Cancel the timer, if any."""
    if timer is not None:
        timer.cancel()
