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
- Errors: an operation the server refuses fails its own buffers with that error (by status:
  `Conflict`, `OverQuota`, `InvalidArgument`, ...); the server then refuses whatever reads
  them with the same cause (`RemoteError`). A batch that could not be sent or was refused
  whole (the server unreachable, say) fails every buffer in it, and the next blocking call
  raises that error too, once.

Thread-safety: any thread may queue, release or block. The queue is a `deque` (appends are
atomic, so a release from a finalizer cannot deadlock); `_sending` is held while a batch is
in flight, and the queue is drained only under it, so batches leave in queue order.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from jax.sharding import AbstractMesh, AxisType

from client.arrays import PLAIN, View
from client.buffer import Buffer
from client.eager import Operators
from client.specials import Specials
from client.transport import ERRORS, Transport, Unauthorized, Unsent
from ir import Aval, InvalidArgument, IsthmusError, MeshAxes, Spec, Unavailable, dtype_name

MAX_BATCH = 1000  # operations in one batch (the server takes up to 10 000)
MAX_BATCH_BYTES = 16 << 20  # inline array bytes in one batch (the server's JSON limit is 64 MiB)
MAX_RELEASES = 10_000  # ids in one release operation (the server takes up to 100 000)
MAX_BATCH_IDS = 200_000  # ids in one batch, its operations' together (the server's bound)
MAX_FORGETS = 20_000  # registrations forgotten in one batch
INLINE_BYTES = 64 << 10  # arrays up to this size are uploaded inside a batch, base64
SETTLED_ASKED = 10_000  # buffers a wait asks the state of (the server takes up to 10 000)
WAITS_BEFORE_ASKING = 2  # waits in a row, nothing queued between, after which a wait asks
FETCH_IDS = 10_000  # buffers fetched together in one request (the server's bound)
FETCH_BYTES = 64 << 20  # their bytes in all (the server takes up to 256 MiB)
DELETED_SLICES_KEPT = 4096  # deleted slice ids remembered, for the error a use of one gets
# How long the woken sender waits before it takes the queue: a blocking call made just after
# (`f(x).result()`) then carries the queue and its wait in one request, not two.
LINGER_S = 200e-6
Output = tuple[str, Aval, Spec, View]  # an output's slice, aval, spec and view (weakly typed, keys)


def new_id(client_id: str) -> str:
    """A buffer id: the client's id and a dot (where the server lets the client choose), then
    random, so no two sessions on one client ever choose the same one."""
    return f"{client_id}.{os.urandom(16).hex()}"


def refusal(status: int, error: str, detail: str) -> IsthmusError:
    """The error an operation the server refused raises, by its status, named as the
    transport names a refused request."""
    return ERRORS.get(status, IsthmusError)(f"POST /v1/batch: {detail}")


@dataclass
class Pending:
    """One queued operation: its body as sent, and the buffers it makes. They are held
    weakly: one dropped while its operation waits in the queue is released at once (its
    release is queued after the operation), and no one is left to see it fail."""

    body: dict[str, Any]
    outputs: list[weakref.ref[Buffer]]
    size: int = 0  # inline bytes it carries
    ids: int = 1  # buffer ids it names
    donors: list[Buffer] = field(default_factory=list)  # donated to it: theirs again if it is refused

    def fail(self, error: IsthmusError) -> None:
        for ref in self.outputs:
            b = ref()
            if b is not None and b.error is None:
                b.error = error


def mesh_axis_types(axis_types: Any, mesh: dict[str, int]) -> tuple[AxisType, ...]:
    """`Client.slice`'s `axis_types`: one `AxisType` for every axis, or one per axis; Auto
    or Explicit (Manual axes are `shard_map`'s, inside a function)."""
    if not isinstance(mesh, dict):
        raise InvalidArgument(f"mesh: expected a dict of axis names to sizes, got {type(mesh).__name__}")
    types = (axis_types,) * len(mesh) if isinstance(axis_types, AxisType) else axis_types
    if not isinstance(types, tuple | list) or len(types) != len(mesh) or not all(
            t in (AxisType.Auto, AxisType.Explicit) for t in types):
        raise InvalidArgument(
            f"axis_types: expected AxisType.Auto or AxisType.Explicit, or one of them per mesh "
            f"axis {tuple(mesh)}; got {axis_types!r}")
    return tuple(types)


class Slice:
    """A virtual slice: named mesh axes mapped by the server onto physical devices."""

    def __init__(self, session: Session | None, record: dict[str, Any],
                 axis_types: tuple[AxisType, ...] | None = None) -> None:
        self._session = session
        self.id: str = record["id"]
        self.mesh: dict[str, int] = dict(record["mesh"])
        self.axis_types = axis_types or (AxisType.Auto,) * len(self.mesh)
        self.island: str = record["island"]
        self.hosts: list[str] = record["hosts"]
        self.device_ids: list[int] = record["device_ids"]
        self.platform: str = record["platform"]

    @property
    def mesh_axes(self) -> MeshAxes:
        return MeshAxes.of(self.mesh)

    @property
    def abstract_mesh(self) -> AbstractMesh:
        """The slice's mesh without devices: the context mesh its functions are traced in,
        and what `shard_map` inside them names. Its axes are Auto unless the slice was asked
        for with others (`Client.slice`'s `axis_types`); the executors run the same
        shardings whichever the types."""
        return AbstractMesh(tuple(self.mesh.values()), tuple(self.mesh), axis_types=self.axis_types)

    @property
    def explicit(self) -> bool:
        """Whether an axis is Explicit: functions then trace in JAX's explicit sharding mode."""
        return AxisType.Explicit in self.axis_types

    @property
    def size(self) -> int:
        return self.mesh_axes.size

    @property
    def export_platform(self) -> str:
        return {"gpu": "cuda"}.get(self.platform, self.platform)

    def delete(self) -> None:
        assert self._session is not None, "a slice made without a session is a description only"
        self._session.request("DELETE", f"/v1/slices/{self.id}")
        self._session.slices.pop(self.id, None)
        deleted = self._session.deleted_slices
        deleted[self.id] = None
        if len(deleted) > DELETED_SLICES_KEPT:
            del deleted[next(iter(deleted))]

    def __repr__(self) -> str:
        return f"Slice({self.id}, {self.mesh}, island={self.island}, devices={self.device_ids})"


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
        self._queue: deque[Pending | str] = deque()  # operations, and released ids
        self._sending = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._deferred: IsthmusError | None = None  # a background send's failure, for the next blocking call
        # registrations let go of ("computations" or "programs", id), to be forgotten on the
        # server, which counts each id's registrations (an id once for each: `_forgets`)
        self._unheld: list[tuple[str, str]] = []
        self._unheld_lock = threading.Lock()  # (a finalizer may let go in any thread)
        # Buffers made here not yet known to exist, and those asked to be fetched together
        # (`prefetch`), by id; a release drops its id from both (a dict's pop is atomic, so a
        # finalizer needs no lock). `_waits`: waits in a row with nothing queued between.
        self._unsettled: dict[str, weakref.ref[Buffer]] = {}
        self._prefetch: dict[str, weakref.ref[Buffer]] = {}
        self._waits = 0
        self._operators = Operators(self)  # a buffer's operators, run on its slice
        self._specials = Specials(self)  # jax_debug_nans / jax_debug_infs
        if background:
            threading.Thread(target=self._send_forever, name="isthmus-sender", daemon=True).start()

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
            outputs: list[Output]) -> list[Buffer]:
        """Queue a program run; `outputs` as for `call`."""
        self.check_open()
        outs = [Buffer(self, new_id(self.client_id), s, a, sp, v) for s, a, sp, v in outputs]
        self._enqueue(Pending({"op": "run", "program_id": program_id, "inputs": inputs,
                               "ids": [b.id for b in outs], "dispatch": dispatch},
                              self._unsettle(outs), ids=len(inputs) + len(outs)))
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
        self.request("POST", "/v1/buffers", params=params, content=data,
                     headers={"Content-Type": "application/octet-stream"})
        self._unsettle([buf])
        return buf

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
        if not self._stopped:
            self._queue.append(buffer_id)
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
        return self.json("POST", path, json=body)

    def let_go(self, kind: Literal["computations", "programs"], record_ids: Iterable[str]) -> None:
        """Registrations that are gone (a signature evicted, a function dropped), an id once
        for each: forgotten on the server after everything queued before (which may still
        use them). Like a release, this rides with the next batch."""
        with self._unheld_lock:
            self._unheld += [(kind, r) for r in record_ids]

    def _take_unheld(self) -> list[tuple[str, str]]:
        """The registrations let go of, up to a batch's share of ids (the rest wait)."""
        with self._unheld_lock:
            taken, self._unheld = self._unheld[:MAX_FORGETS], self._unheld[MAX_FORGETS:]
        return taken

    def _keep_unheld(self, taken: list[tuple[str, str]]) -> None:
        """Registrations taken to be forgotten, not sent after all: first in line again."""
        with self._unheld_lock:
            self._unheld[:0] = taken

    def _enqueue(self, op: Pending) -> None:
        self._queue.append(op)
        self._waits = 0
        self._wake.set()

    # -- sending ----------------------------------------------------------------------------

    def _take(self, ids: int = MAX_BATCH_IDS) -> tuple[list[dict[str, Any]], list[Pending | None]]:
        """The next batch from the queue (under `_sending`), naming at most `ids` buffer ids:
        bodies, and whose each is."""
        ops: list[dict[str, Any]] = []
        owners: list[Pending | None] = []
        released: list[str] = []
        size = 0
        while self._queue and len(ops) < MAX_BATCH and size <= MAX_BATCH_BYTES:
            item = self._queue[0]
            ids -= 1 if isinstance(item, str) else item.ids
            if ids < 0 and (ops or released):  # (an operation alone always fits)
                break
            self._queue.popleft()
            if isinstance(item, str):
                released.append(item)
                if len(released) == MAX_RELEASES:
                    ops.append({"op": "release", "ids": released})
                    owners.append(None)
                    released = []
                continue
            if released:  # the releases queued before this operation go before it
                ops.append({"op": "release", "ids": released})
                owners.append(None)
                released = []
            ops.append(item.body)
            owners.append(item)
            size += item.size
        if released:
            ops.append({"op": "release", "ids": released})
            owners.append(None)
        return ops, owners

    def _send(self, wait: Buffer | None = None, releases: bool = True,
              asked: Sequence[str] = ()) -> dict[str, Any] | None:
        """Send what is queued, in batches; `wait` rides on the last one, and `asked` (ids
        whose state the answer gives). Returns the last answer (None: nothing was queued,
        so nothing waited). `releases` False: a queue of releases only stays queued. Hold
        `_sending`."""
        while True:
            # Taken before the operations: each was let go of after every operation that
            # used it had been queued, so those are in this batch or an earlier one.
            unheld = self._take_unheld()
            ops, owners = self._take(MAX_BATCH_IDS - len(unheld) - len(asked))
            last = not self._queue
            # Forgets go last, after whatever may still use what they name, and like releases
            # ride with operations.
            forgets = _forgets(unheld) if last and (releases or any(owners)) else []
            if unheld and not forgets:
                self._keep_unheld(unheld)
            ops, owners = [*ops, *forgets], [*owners, *[None] * len(forgets)]
            try:
                if not ops:
                    return None
                if not releases and not any(owners):  # they wait for the next batch
                    self._queue.extendleft(reversed([b for op in ops for b in op["ids"]]))
                    return None
                body: dict[str, Any] = {"ops": ops, "wait": wait.id if wait is not None and last else None}
                if asked and last:
                    body["settled"] = list(asked)
                answer = self.transport.json("POST", "/v1/batch", json=body)
                failed = [(owners[f["index"]], refusal(f["status"], f["error"], f["detail"]))
                          for f in answer["failed"]]
            except Exception as e:  # sent or not, none of these can be trusted to exist
                error = e if isinstance(e, IsthmusError) else Unavailable(
                    f"POST /v1/batch: an answer the client cannot read: {type(e).__name__}: {e}")
                failed = [(p, error) for p in owners]
                answer = None
                # A batch the server answered with a refusal took nothing: its forgets are
                # sent again. One that may have been taken is not: the server counts them.
                if forgets and not isinstance(error, Unavailable):
                    self._keep_unheld(unheld)
            for p, error in failed:
                if p is not None:
                    p.fail(error)
                    for b in p.donors:  # refused or never sent: the caller's again; unknown: freed
                        unknown = isinstance(error, Unavailable) and not isinstance(error, Unsent)
                        if answer is None and unknown:
                            self.release(b.id)
                        else:
                            b.undonate()
            if answer is None:
                raise error
            if last:
                return answer

    def _send_forever(self) -> None:
        while True:
            self._wake.wait()
            if self._stopped:
                return
            self._wake.clear()
            time.sleep(LINGER_S)
            with self._sending:
                try:
                    self._send(releases=False)  # a blocking call may have sent the operations
                except IsthmusError as e:
                    self._deferred = e

    def _raise_deferred(self) -> None:
        error, self._deferred = self._deferred, None
        if error is not None:
            raise error

    def check_open(self) -> None:
        """`Unauthorized` once the client is closed: what it made cannot be used any more."""
        if self._stopped:
            raise Unauthorized("this client is closed (by close(), or dropped, or as its process "
                               "exits): what it made cannot be used any more; connect again")

    def flush(self) -> None:
        """Send what is queued now; return once the server has taken it (not run it)."""
        self.check_open()
        with self._sending:
            self._send()
        self._raise_deferred()

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
            with self._sending:
                answer = self._send(wait=buffer, asked=asked)
            self._raise_deferred()
            if buffer.error is None and answer is None:
                if asked:
                    answer = self.transport.json("POST", "/v1/batch", json={
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
        """The buffer's bytes. One asked to be fetched with others (`prefetch`) comes with
        those others, up to `FETCH_IDS` of them and `FETCH_BYTES`, in one request; if that
        is refused, each is fetched alone (and raises its own error)."""
        if buffer.error is None:
            self.flush()
        if buffer.error is not None:
            raise buffer.error
        group = self._prefetched(buffer)
        if len(group) > 1:
            try:
                data = self.transport.request("POST", "/v1/buffers/data",
                                              json_body={"ids": [b.id for b in group]}).content
            except IsthmusError:
                data = None
            if data is not None and len(data) == sum(b.aval.nbytes for b in group):
                at = buffer.aval.nbytes
                for b in group[1:]:
                    b.fetched(data[at:at + b.aval.nbytes])
                    at += b.aval.nbytes
                return data[:buffer.aval.nbytes]
        return self.transport.request("GET", f"/v1/buffers/{buffer.id}/data").content

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
        self._stopped = True
        self._wake.set()
        self._queue.clear()


def _forgets(unheld: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """The forget operations for registrations let go of (an id once for each)."""
    by_kind: dict[str, list[str]] = {"computations": [], "programs": []}
    for kind, r in unheld:
        by_kind[kind].append(r)
    return [{"op": "forget", kind: ids[i:i + MAX_RELEASES]}
            for kind, ids in by_kind.items() for i in range(0, len(ids), MAX_RELEASES)]


def little_endian(array: np.ndarray) -> np.ndarray:
    """The array in the wire's byte order: a big-endian one (read from a file, say) converted,
    its values unchanged."""
    order = array.dtype.byteorder
    if order == ">" or (order == "=" and sys.byteorder == "big"):
        return array.astype(array.dtype.newbyteorder("<"))
    return array
