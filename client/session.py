"""The session: one client's link to the server, shared by its slices, functions and buffers.

Contract:
- `call`, `run` and `put` (of an array up to `INLINE_BYTES`) return `Buffer`s at once. Their
  ids are chosen here (the client's id, a dot and 128 random bits in hex: the server takes
  only ids in the client's own part of its namespace), so nothing waits for the server;
  the operation joins one queue. A background sender takes everything queued and sends it
  as one `POST /v1/batch` (at most `MAX_BATCH` operations, `MAX_BATCH_BYTES` of inline
  data), one batch at a time: the server submits the operations in queue order.
- A dropped buffer's release joins the same queue. A buffer cannot be dropped while a
  queued call still names it (the caller held it to make the call), so its release comes
  after every use. Releases do not wake the sender: they ride with the next batch.
- A registration let go of (`let_go`: a function dropped, a signature evicted) is forgotten
  on the server the same way, at the end of a batch, after every operation queued before
  it. The server counts an id's registrations (it answers the same function registered
  again with the id it gave before, to this session or another on the same secret) and
  drops the computation or program once none holds it.
- Everything else that talks to the server (`json`, `request`, `wait`, `ready`, `fetch`)
  first sends what is queued, so the server sees the session's requests in the order they
  were made. `wait` sends the queued operations and waits in the same request.
- While the server restarts, requests wait for it (the transport's `restart_grace_s`); a
  batch whose answer was lost is sent again as what the server did not take of it
  (`client.sender`).
- Errors: an operation the server refuses fails its own buffers with that error (by status:
  `Conflict`, `OverQuota`, `InvalidArgument`, ...); the server then refuses whatever reads
  them with the same cause (`RemoteError`). A batch that could not be sent or was refused
  whole (the server unreachable, say) fails every buffer in it, and the next blocking call
  raises that error too, once.

Thread-safety: any thread may queue, release or block. The queue is the sender's
(`client.sender`): drained only under its lock, held while a batch is in flight, so batches
leave in queue order.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

import numpy as np

from client.arrays import PLAIN, View
from client.buffer import Buffer
from client.eager import Operators
from client.jit import Function
from client.sender import MAX_BATCH, MAX_BATCH_IDS, Pending, Sender, refusal
from client.slices import Output, Slice
from client.specials import Specials
from client.transport import Dropped, Transport, Unauthorized
from ir import Aval, IsthmusError, Spec, dtype_name

__all__ = ["MAX_BATCH", "MAX_BATCH_IDS", "Session", "new_id"]

INLINE_BYTES = 64 << 10  # arrays up to this size are uploaded inside a batch, base64
SETTLED_ASKED = 10_000  # buffers a wait asks the state of (the server takes up to 10 000)
WAITS_BEFORE_ASKING = 2  # waits in a row, nothing queued between, after which a wait asks
FETCH_IDS = 10_000  # buffers fetched together in one request (the server's bound)
FETCH_BYTES = 64 << 20  # their bytes in all (the server takes up to 256 MiB)
DELETED_SLICES_KEPT = 4096  # deleted slice ids remembered, for the error a use of one gets


def new_id(client_id: str) -> str:
    """A buffer id: the client's id and a dot (where the server lets the client choose), then
    random, so no two sessions on one client ever choose the same one."""
    return f"{client_id}.{os.urandom(16).hex()}"


class Session:
    def __init__(self, transport: Transport, client_id: str, background: bool = True) -> None:
        """`client_id` is the server's id of the client, which the ids chosen here begin with.
        `background` False: no sender thread; what is queued leaves with the next blocking
        call (the tests of the queue say when with it)."""
        self.transport = transport
        self.client_id = client_id
        self.slices: dict[str, Slice] = {}  # the slices this client created, by id
        # the newest it deleted, so that a buffer freed with one is told apart from a stranger's
        self.deleted_slices: dict[str, None] = {}  # the newest `DELETED_SLICES_KEPT`, in order
        self._sender = Sender(transport, self.release, background)
        # Buffers made here not yet known to exist, and those asked to be fetched together
        # (`prefetch`), by id; a release drops its id from both (a dict's pop is atomic, so a
        # finalizer needs no lock). `_waits`: waits in a row with nothing queued between.
        self._unsettled: dict[str, weakref.ref[Buffer]] = {}
        self._prefetch: dict[str, weakref.ref[Buffer]] = {}
        self._waits = 0
        self._operators = Operators(self)  # a buffer's operators, run on its slice
        # jax_debug_nans / jax_debug_infs, checked by a function of the slice
        self._specials = Specials(lambda fn, s, name: Function(self, fn, s, name=name))

    # -- queueing ---------------------------------------------------------------------------

    def call(self, computation_id: str, inputs: list[str], outputs: list[Output],
             donated: Sequence[Buffer] = ()) -> list[Buffer]:
        """Queue a call; `outputs` are each output's slice, aval, spec and view (weakly typed,
        typed PRNG keys). `donated` buffers are the call's: the server frees them after it,
        if it accepts it; if it refuses it, they are usable again."""
        self.check_open()
        outs = [Buffer(self, new_id(self.client_id), s, a, sp, v) for s, a, sp, v in outputs]
        body = {"op": "call", "computation_id": computation_id, "inputs": inputs, "ids": [b.id for b in outs]}
        if donated:
            body["donate"] = [b.id for b in donated]
            for b in donated:
                b.donate()
        self._enqueue(Pending(body, self._unsettle(outs), donors=list(donated),
                              ids=len(inputs) + len(outs) + len(donated)))
        return outs

    def run(self, program_id: str, inputs: list[str], dispatch: str | None,
            outputs: list[Output], trace: bool = False) -> list[Buffer]:
        """Queue a program run (traced, if `trace`); `outputs` as for `call`."""
        self.check_open()
        outs = [Buffer(self, new_id(self.client_id), s, a, sp, v) for s, a, sp, v in outputs]
        body: dict[str, Any] = {"op": "run", "program_id": program_id, "inputs": inputs,
                                "ids": [b.id for b in outs], "dispatch": dispatch}
        if trace:
            body["trace"] = True
        self._enqueue(Pending(body, self._unsettle(outs), ids=len(inputs) + len(outs)))
        return outs

    def put(self, array: np.ndarray, slice_id: str, spec: Spec, view: View = PLAIN) -> Buffer:
        """Upload an array (typed keys' data, if `view` names their impl; weakly typed, if it
        says so): queued when small, else sent now (after what is queued)."""
        self.check_open()
        aval = Aval(tuple(array.shape), dtype_name(array.dtype))
        buf = Buffer(self, new_id(self.client_id), slice_id, aval, spec, view)
        data = little_endian(array).tobytes()  # C order, whatever the array's layout
        if len(data) <= INLINE_BYTES:
            body = {"op": "put", "id": buf.id, "slice_id": slice_id, "dtype": aval.dtype,
                    "shape": list(aval.shape), "spec": spec.to_json(),
                    "data": base64.b64encode(data).decode()}
            self._enqueue(Pending(body, self._unsettle([buf]), len(data)))
            return buf
        params = {"slice_id": slice_id, "dtype": aval.dtype, "shape": ",".join(map(str, aval.shape)),
                  "spec": json.dumps(spec.to_json()), "id": buf.id}
        self.flush()
        self._upload(buf.id, params, data)
        self._unsettle([buf])
        return buf

    def _upload(self, buffer_id: str, params: dict[str, str], data: bytes) -> None:
        """`POST /v1/buffers`. Its answer lost (within the grace), it is sent again if the
        server has no buffer of its id, or lost it unfinished at a restart (released first),
        as a batch's put is (`client.sender`)."""
        def post() -> None:
            self.transport.request("POST", "/v1/buffers", params=params, content=data,
                                   headers={"Content-Type": "application/octet-stream"},
                                   progress=f"upload {buffer_id}")

        try:
            post()
        except Dropped:
            if self.transport.retry.grace_s <= 0 or self.transport.retry.stopped:
                raise
            unknown, unfinished = self._sender.fates([buffer_id])
            if unfinished:  # (released first: its id is free again)
                release = {"op": "release", "ids": sorted(unfinished)}
                self.transport.json("POST", "/v1/batch", json={"ops": [release]}, safe=True)
            if unknown or unfinished:
                post()

    def operate(self, symbol: str, op: Callable[..., Any], operands: tuple[Any, ...]) -> Any:
        """An operator on buffers, run on their slice (`client.eager`)."""
        return self._operators.apply(symbol, op, operands)

    def check_specials(self, name: str, slice: Slice, outs: Sequence[Buffer], nans: bool, infs: bool) -> None:
        """Raise FloatingPointError where a call's results hold a NaN or an infinity that
        JAX's flags look for (`client.specials`)."""
        self._specials.check(name, slice, outs, nans, infs)

    def index(self, buffer: Buffer, key: Any) -> Buffer:
        """`buffer[key]`, run on its slice (`client.eager`)."""
        return self._operators.index(buffer, key)

    def method(self, buffer: Buffer, name: str, args: tuple[Any, ...] | None,
               kwargs: dict[str, Any]) -> Buffer:
        """`buffer.name(*args, **kwargs)`, run on its slice (`client.eager`)."""
        return self._operators.method(buffer, name, args, kwargs)

    def release(self, buffer_id: str) -> None:
        self._sender.release(buffer_id)
        self._unsettled.pop(buffer_id, None)
        self._prefetch.pop(buffer_id, None)

    def _unsettle(self, buffers: list[Buffer]) -> list[weakref.ref[Buffer]]:
        """Count the new buffers as not yet known to exist; their weak references."""
        refs = [weakref.ref(b) for b in buffers]
        for b, ref in zip(buffers, refs, strict=True):
            self._unsettled[b.id] = ref
        return refs

    def prefetch(self, buffer: Buffer) -> None:
        """Fetch the buffer with the others asked for likewise, when one of them is read."""
        self._prefetch[buffer.id] = weakref.ref(buffer)

    def register(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """Register a computation or program (`POST path`): the server counts the
        registration until it is let go of (`let_go`), whatever id it answers with (one it
        has answered before, for the same function registered again)."""
        self.flush()  # what was let go is forgotten first: its room in the quota is free
        return self.transport.request("POST", path, json_body=body,
                                      waits=f"compile {body.get('name') or path.rsplit('/', 1)[-1]}").json()

    def let_go(self, kind: Literal["computations", "programs"], record_ids: Iterable[str]) -> None:
        """Registrations that are gone (a signature evicted, a function dropped), an id once
        for each: forgotten on the server after everything queued before (which may still
        use them). Like a release, this rides with the next batch."""
        self._sender.let_go([(kind, r) for r in record_ids])

    def _enqueue(self, op: Pending) -> None:
        self._sender.enqueue(op)
        self._waits = 0

    def delete_slice(self, slice_id: str) -> None:
        """`Slice.delete`: freed on the server (after what is queued), then remembered as
        deleted, so that a buffer freed with it says so."""
        self.request("DELETE", f"/v1/slices/{slice_id}")
        self.slices.pop(slice_id, None)
        self.deleted_slices[slice_id] = None
        if len(self.deleted_slices) > DELETED_SLICES_KEPT:
            del self.deleted_slices[next(iter(self.deleted_slices))]

    def check_open(self) -> None:
        """`Unauthorized` once the client is closed: what it made cannot be used any more."""
        if self._sender.stopped:
            raise Unauthorized("this client is closed (by close(), or dropped, or as its process "
                               "exits): what it made cannot be used any more; connect again")

    def flush(self) -> None:
        """Send what is queued now; return once the server has taken it (not run it)."""
        self.check_open()
        self._sender.send()
        self._sender.raise_deferred()

    # -- blocking ---------------------------------------------------------------------------

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        """One request to the server, after what is queued."""
        self.flush()
        return self.transport.request(method, path, **kwargs)

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        self.flush()
        return self.transport.json(method, path, **kwargs)

    def wait(self, buffer: Buffer) -> None:
        """Block until `buffer` exists; raise why it does not. What is queued is sent with
        the wait, in one request. The third wait in a row with nothing queued between (a
        pytree's leaves waited for one by one, as `jax.block_until_ready` does) also asks
        which of the session's other buffers exist: those need no request of their own."""
        if buffer.error is None:
            self.check_open()
            self._waits += 1
            asked = self._asked(buffer) if self._waits > WAITS_BEFORE_ASKING else []
            answer = self._sender.send(wait=buffer.id, asked=asked)
            self._sender.raise_deferred()
            if buffer.error is None and answer is None:
                if asked:
                    answer = self.transport.json("POST", "/v1/batch", safe=True, json={
                        "ops": [], "wait": buffer.id, "settled": asked})
                else:
                    self.transport.json("GET", f"/v1/buffers/{buffer.id}", params={"wait": True})
            if buffer.error is None and answer is not None and answer["wait"] is not None:
                raise refusal(**answer["wait"])
            if buffer.error is None:
                self._settle([buffer.id, *(answer or {}).get("ready", ())])
        if buffer.error is not None:
            raise buffer.error

    def _asked(self, buffer: Buffer) -> list[str]:
        """Up to `SETTLED_ASKED` ids of the session's other buffers not known to exist."""
        ids = list(self._unsettled)  # (copied in one step under the GIL: no release cuts in)
        return [b for b in ids[:SETTLED_ASKED + 1] if b != buffer.id][:SETTLED_ASKED]

    def _settle(self, buffer_ids: Iterable[str]) -> None:
        """These buffers exist (the server said so): waiting for them needs no request."""
        for b in buffer_ids:
            ref = self._unsettled.pop(b, None)
            found = ref() if ref is not None else None
            if found is not None:
                found.known_ready = True

    def ready(self, buffer: Buffer) -> bool:
        self.flush()
        if buffer.error is not None:
            return True
        return self.transport.json("GET", f"/v1/buffers/{buffer.id}")["state"] in ("ready", "failed")

    def fetch(self, buffer: Buffer) -> bytes:
        """The buffer's bytes. What is queued is sent first, with a wait for the buffer (one
        request, as a flush: its answer comes once the value exists, so an answer lost to a
        server restart covers the work, `client.sender`). One asked to be fetched with
        others (`prefetch`) comes with those others, up to `FETCH_IDS` of them and
        `FETCH_BYTES`, in one request; if that is refused, each is fetched alone (and raises
        its own error)."""
        if buffer.error is None:
            self.check_open()
            answer = self._sender.send(wait=None if buffer.known_ready else buffer.id)
            self._sender.raise_deferred()
            if buffer.error is None and answer is not None and answer["wait"] is not None:
                raise refusal(**answer["wait"])
        if buffer.error is not None:
            raise buffer.error
        group = self._prefetched(buffer)
        if len(group) > 1:
            try:
                data = self.transport.request("POST", "/v1/buffers/data", safe=True, progress="fetch",
                                              json_body={"ids": [b.id for b in group]}).content
            except IsthmusError:
                data = None
            if data is not None and len(data) == sum(b.aval.nbytes for b in group):
                at = buffer.aval.nbytes
                for b in group[1:]:
                    b.fetched(data[at:at + b.aval.nbytes])
                    at += b.aval.nbytes
                return data[:buffer.aval.nbytes]
        return self.transport.request("GET", f"/v1/buffers/{buffer.id}/data",
                                      progress=f"fetch {buffer.id}").content

    def _prefetched(self, buffer: Buffer) -> list[Buffer]:
        """`buffer` and, if it was asked to be fetched with others, those of them still
        unfetched, within the bounds of one request; all taken off the list."""
        if self._prefetch.pop(buffer.id, None) is None:
            return [buffer]
        group, size = [buffer], buffer.aval.nbytes
        while self._prefetch and len(group) < FETCH_IDS:
            try:
                b_id = next(iter(self._prefetch))
                ref = self._prefetch.pop(b_id)
            except (StopIteration, KeyError, RuntimeError):  # (a finalizer took it meanwhile)
                continue
            b = ref()
            if b is None or b.error is not None or b.is_deleted() or b.has_value:
                continue
            if size + b.aval.nbytes > FETCH_BYTES:
                self._prefetch[b_id] = ref  # (the next request takes it)
                break
            group.append(b)
            size += b.aval.nbytes
        return group

    def close(self) -> None:
        """Stop the sender; what is still queued is dropped (closing frees it all anyway)."""
        self._sender.stop()


def little_endian(array: np.ndarray) -> np.ndarray:
    """The array in the wire's byte order: a big-endian one (read from a file, say) converted,
    its values unchanged."""
    order = array.dtype.byteorder
    if order == ">" or (order == "=" and sys.byteorder == "big"):
        return array.astype(array.dtype.newbyteorder("<"))
    return array
