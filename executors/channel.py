"""A direct stream from the server to one executor, for the requests on every call's path.

The executors stay Ray actors: Ray starts, places and replaces them, answers the rare
requests (compile, inventory, stats) and carries large uploads through its object store.
The requests every call or program run makes (run messages, reads, deletes, small uploads)
take this stream instead: an actor call costs the server about a millisecond of CPU on a
small machine, a frame on an open connection a few tens of microseconds (docs/benchmarks.md).

Contract:
- `serve` (in the executor's event loop) listens on the node's address at a port the OS
  picks. A connection is taken only if its first frame, within `AUTH_TIMEOUT_S`, is the
  secret the pool handed the executor through Ray; anything else is closed unanswered.
  After that a frame is at most `MAX_REQUEST` bytes, and a method outside `methods` is
  answered with an error, never called.
- Frames are an 8-byte big-endian length and a pickle. A request is `(id, method, args)`;
  id 0 wants no answer, any other gets `(id, True, value)` or `(id, False, cause)`, in the
  order the answers are ready (the host orders sequenced requests by their numbers).
- `Channel` is the server's end: `call` returns a `concurrent.futures.Future` of the answer,
  failed with `RemoteError` for a cause. When the connection ends, every pending and later
  call fails with `Unavailable`: requests may have been lost on the way, so the host's order
  has a gap, and only a new executor (an island restart) serves its slices again; the
  channel's `on_lost` is told, unless the server closed it.
- `Link` is a peer executor's end, for requests that want no answer (a program's sends from
  host to host): a plain blocking socket written by the thread that sends, with no event
  loop between the sender and the wire. A failed write closes it and raises `Unavailable`.
- `PeerListener` is where `Link`s connect (a port of its own on each executor): a thread per
  connection reads the frames and calls the method at once, under the rules of `serve`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import pickle
import socket
import struct
import threading
import traceback
from collections.abc import Callable, Collection
from concurrent.futures import Future
from typing import Any

from ir import RemoteError, Unavailable

log = logging.getLogger("isthmus.executors")
HEADER = struct.Struct("!Q")
AUTH_TIMEOUT_S = 10.0
MAX_REQUEST = 64 << 20  # a request frame, on the executor's side (large uploads go through Ray)
SECRET_BYTES = 32
COPY_BYTES = 1 << 16  # a frame smaller than this is copied behind its header and written once


async def _frame(reader: asyncio.StreamReader, limit: int) -> bytes:
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > limit:
        raise ValueError(f"a frame of {size} bytes, over the limit of {limit}")
    return await reader.readexactly(size)


def _write(writer: asyncio.StreamWriter, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    if len(data) < COPY_BYTES:  # one write, one system call
        writer.write(HEADER.pack(len(data)) + data)
    else:
        writer.write(HEADER.pack(len(data)))
        writer.write(data)


# -- the executor's end -------------------------------------------------------------------


async def serve(target: object, secret: bytes, address: str, methods: Collection[str]) -> tuple[str, int]:
    """Listen for the server on `address`; answer its requests with `target`'s methods.
    Returns the address and port listened on."""
    allowed = frozenset(methods)

    async def session(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            first = await asyncio.wait_for(_frame(reader, len(secret)), AUTH_TIMEOUT_S)
            if not hmac.compare_digest(first, secret):
                log.warning("channel: a connection from %s without the secret was closed",
                            writer.get_extra_info("peername"))
                return
            await _answer_requests(target, allowed, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError, TimeoutError, ValueError) as e:
            log.info("channel: a connection ended: %s", e or type(e).__name__)
        finally:
            writer.close()

    server = await asyncio.start_server(session, address, 0)
    port = server.sockets[0].getsockname()[1]
    return address, port


async def _answer_requests(target: object, allowed: frozenset[str], reader: asyncio.StreamReader,
                           writer: asyncio.StreamWriter) -> None:
    pending: set[asyncio.Task[None]] = set()  # answers still computing (kept from the collector)
    while True:
        call_id, method, args = pickle.loads(await _frame(reader, MAX_REQUEST))
        if method not in allowed:
            if call_id:
                _write(writer, (call_id, False, f"method {method!r} is not served on this channel"))
            continue
        try:
            result = getattr(target, method)(*args)
        except Exception:
            if call_id:
                _write(writer, (call_id, False, traceback.format_exc(limit=8)))
            else:
                log.exception("channel: %s failed", method)
            continue
        if asyncio.iscoroutine(result):
            task = asyncio.create_task(_later(writer, call_id, result))
            pending.add(task)
            task.add_done_callback(pending.discard)
        elif call_id:
            _write(writer, (call_id, True, result))


async def _later(writer: asyncio.StreamWriter, call_id: int, result: Any) -> None:
    try:
        answer = (call_id, True, await result)
    except Exception:
        answer = (call_id, False, traceback.format_exc(limit=8))
    if call_id and not writer.is_closing():
        _write(writer, answer)


# -- the server's end ---------------------------------------------------------------------


class Channel:
    def __init__(self, host: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.host = host
        self._writer = writer
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self._pending: dict[int, Future[Any]] = {}
        self._next = 1
        self._lock = threading.Lock()
        self._closed: str | None = None  # why, once closed
        # Called (on the event loop, with why) when the connection ends other than by `close`:
        # the executor is gone, or unreachable.
        self.on_lost: Callable[[str], None] | None = None
        self._reading = asyncio.create_task(self._read(reader))

    @classmethod
    async def connect(cls, host: str, address: str, port: int, secret: bytes, timeout: float) -> Channel:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(address, port), timeout)
        except (OSError, TimeoutError) as e:
            raise Unavailable(f"host {host}: cannot reach its executor at {address}:{port}: {e}") from None
        writer.write(HEADER.pack(len(secret)) + secret)
        return cls(host, reader, writer)

    def call(self, method: str, *args: Any) -> Future[Any]:
        """Send a request; the future settles with its answer."""
        answer: Future[Any] = Future()
        with self._lock:
            if self._closed is not None:
                answer.set_exception(Unavailable(self._closed))
                return answer
            call_id, self._next = self._next, self._next + 1
            self._pending[call_id] = answer
        try:
            self._send((call_id, method, args))
        except Unavailable as e:
            with self._lock:
                self._pending.pop(call_id, None)
            if not answer.done():
                answer.set_exception(e)
        return answer

    def tell(self, method: str, *args: Any) -> None:
        """Send a request that wants no answer (its failure is the executor's to log)."""
        if self._closed is not None:
            raise Unavailable(self._closed)
        self._send((0, method, args))

    def _send(self, message: Any) -> None:
        """Write a frame; `Unavailable` where the connection has ended and the reader has not
        yet seen it (a write to a closed transport raises)."""
        if threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self._write_later, message)
            return
        try:
            if self._writer.is_closing():
                raise RuntimeError("the transport is closing")
            _write(self._writer, message)
        except (RuntimeError, OSError) as e:
            raise Unavailable(f"host {self.host}: the executor's channel was lost: {e}") from None

    def _write_later(self, message: Any) -> None:
        """(On the loop.) Where the connection has ended, the frame is dropped: the reader's
        end fails every pending answer."""
        if not self._writer.is_closing():
            with contextlib.suppress(RuntimeError, OSError):
                _write(self._writer, message)

    async def _read(self, reader: asyncio.StreamReader) -> None:
        why, lost = "closed", True
        try:
            while True:
                call_id, ok, value = pickle.loads(await _frame(reader, 1 << 62))
                answer = self._pending.pop(call_id, None)
                if answer is None:
                    continue
                if ok:
                    answer.set_result(value)
                else:
                    answer.set_exception(RemoteError(value))
        except asyncio.CancelledError:
            why, lost = "closed by the server", False
        except (asyncio.IncompleteReadError, ConnectionError, OSError) as e:
            why = f"lost: {e or type(e).__name__}"
        finally:
            why = f"host {self.host}: the executor's channel was {why}"
            self._fail(why)
            if lost and self.on_lost is not None:
                self.on_lost(why)

    def _fail(self, why: str) -> None:
        with self._lock:
            self._closed = why
            pending, self._pending = self._pending, {}
        for answer in pending.values():
            if not answer.done():
                answer.set_exception(Unavailable(why))

    def close(self) -> None:
        self._fail(f"host {self.host}: the executor's channel was closed by the server")
        self._reading.cancel()
        self._writer.close()

    @property
    def closed(self) -> bool:
        return self._closed is not None



# -- a peer's end -------------------------------------------------------------------------


class Link:
    """Requests that want no answer, to one executor, over a blocking socket (thread-safe)."""

    def __init__(self, host: str, sock: socket.socket) -> None:
        self.host = host
        self._sock = sock
        self._lock = threading.Lock()
        self.closed = False

    @classmethod
    def connect(cls, host: str, address: str, port: int, secret: bytes, timeout: float) -> Link:
        try:
            sock = socket.create_connection((address, port), timeout=timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(HEADER.pack(len(secret)) + secret)
        except OSError as e:
            raise Unavailable(f"host {host}: cannot reach its executor at {address}:{port}: {e}") from None
        return cls(host, sock)

    def tell(self, method: str, *args: Any) -> None:
        data = pickle.dumps((0, method, args), protocol=pickle.HIGHEST_PROTOCOL)
        with self._lock:
            if self.closed:
                raise Unavailable(f"host {self.host}: the link to its executor is closed")
            try:
                self._sock.sendall(HEADER.pack(len(data)) + data)
            except OSError as e:
                self._close()
                raise Unavailable(f"host {self.host}: the link to its executor was lost: {e}") from None

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        self.closed = True
        self._sock.close()


# -- peers' sends, read by threads --------------------------------------------------------


class PeerListener:
    """Where peer executors' `Link`s connect: a thread per connection reads its frames and
    calls the target's method at once, in that thread (no event loop between the wire and
    the host: a value another host sends reaches the waiting dispatch thread a hop sooner).

    The same rules as `serve`: the first frame, within `AUTH_TIMEOUT_S`, must be the secret
    (read through `secret`, so a new server's secret applies to connections made after it);
    a frame is at most `MAX_REQUEST` bytes; only `methods` are called, and only as requests
    that want no answer. At most `MAX_PEERS` connections are open at once; more are closed.
    """

    MAX_PEERS = 256

    def __init__(self, target: object, secret: Callable[[], bytes], address: str,
                 methods: Collection[str]) -> None:
        self._target = target
        self._secret = secret
        self._allowed = frozenset(methods)
        self._sock = socket.create_server((address, 0))
        self.port: int = self._sock.getsockname()[1]
        self._open = threading.BoundedSemaphore(self.MAX_PEERS)
        threading.Thread(target=self._accept, name="peer-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            if not self._open.acquire(blocking=False):
                log.warning("channel: over %d peer connections; one more was closed", self.MAX_PEERS)
                conn.close()
                continue
            try:
                threading.Thread(target=self._serve, args=(conn,), name="peer", daemon=True).start()
            except RuntimeError:  # no thread to be had: this peer sends through Ray instead
                log.exception("channel: no thread for a peer connection; it was closed")
                self._open.release()
                conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            with conn:
                conn.settimeout(AUTH_TIMEOUT_S)
                secret = self._secret()
                if not hmac.compare_digest(_read_frame(conn, len(secret)), secret):
                    log.warning("channel: a peer connection without the secret was closed")
                    return
                conn.settimeout(None)
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                while True:
                    call_id, method, args = pickle.loads(_read_frame(conn, MAX_REQUEST))
                    if call_id or method not in self._allowed:
                        log.warning("channel: a peer asked for %r (answered: %s); not served",
                                    method, bool(call_id))
                        continue
                    try:
                        getattr(self._target, method)(*args)
                    except Exception:
                        log.exception("channel: a peer's %s failed", method)
        except (EOFError, OSError, ValueError, pickle.UnpicklingError) as e:
            log.info("channel: a peer connection ended: %s", e or type(e).__name__)
        except Exception:  # a frame that is no request: the connection ends, the host goes on
            log.exception("channel: a peer connection sent what is not a request; it was closed")
        finally:
            self._open.release()

    def close(self) -> None:
        self._sock.close()


def _read_frame(conn: socket.socket, limit: int) -> bytearray:
    (size,) = HEADER.unpack(_read_exactly(conn, HEADER.size))
    if size > limit:
        raise ValueError(f"a frame of {size} bytes, over the limit of {limit}")
    return _read_exactly(conn, size)


def _read_exactly(conn: socket.socket, size: int) -> bytearray:
    data = bytearray(size)
    view, got = memoryview(data), 0
    while got < size:
        n = conn.recv_into(view[got:])
        if n == 0:
            raise EOFError("the peer closed the connection")
        got += n
    return data
