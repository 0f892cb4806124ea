"""`connect()` and the `Client`: slices, buffers, jitted functions, device status.

Beneath the API, for tests and tools, a client also offers the REST API itself
(`raw_request`, `raw_json`, `raw_call`), the count of requests it made (`requests_sent`)
and its lease (`lease`); a `Function` its registrations and exports, a `ProgramFunction`
its traces (`client.jit`, `client.program`).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import types
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
from jax.sharding import PartitionSpec

from client import traces
from client.arrays import NotAnArray, as_array, leaf_specs
from client.buffer import Buffer
from client.devices import DeviceTable
from client.donation import Donated
from client.jit import Function
from client.lease import Lease
from client.program import ProgramFunction
from client.session import Session
from client.slices import Slice, mesh_axis_types
from client.statics import Statics
from client.transport import Response, Transport, Unauthorized
from ir import Aval, InvalidArgument, IsthmusError, NotFound, Spec

DEFAULT_ADDRESS = "http://127.0.0.1:8470"
JITTED_KEPT = 256  # functions whose `Function` (or program) `Client.jit` (`.program`) gives again
EXIT_TIMEOUT_S = 5.0  # for closing, as the process exits, a session it opened
RESTART_GRACE_S = 30.0  # how long a request waits for the server to come back (`connect`)


def state_dir() -> Path:
    return Path(os.environ.get("ISTHMUS_STATE_DIR") or Path.home() / ".isthmus")


def find_token() -> str:
    """`ISTHMUS_TOKEN`, else the token the local server wrote into its state dir."""
    token = os.environ.get("ISTHMUS_TOKEN")
    if token:
        return token
    path = state_dir() / "token"
    if not path.exists():
        raise NotFound(f"no token: set ISTHMUS_TOKEN or start a local server (it writes {path})")
    return path.read_text().strip()


class Client:
    """One client session on the server.

    Opened with the admin `token` (a new session, whose secret this client keeps and sends
    from then on), or with the `secret` of a session the admin opened for it. While the
    client is open a background thread renews its lease; a client that stops (its process
    killed, say) is closed by the server after the lease, freeing what it held. A session
    this process opened is closed when the process exits, if `close()` was not called.

    Calls, runs, small uploads and releases do not wait: they are queued and sent in order,
    batched, by the client's session (`client.session`); a blocking call (a buffer's
    `result()` or `numpy()`, `buffers()`, `close()`) sends what is queued first.

    `timeout` bounds one request, its tries included; `restart_grace_s` is how long a
    request waits for a server that cannot be reached (restarting, say) before it raises
    (docs/client.md says which requests are tried again).
    """

    def __init__(self, address: str, token: str | None = None, name: str = "", timeout: float = 600.0,
                 weight: float = 1.0, secret: str | None = None, close_at_exit: bool = True,
                 restart_grace_s: float = RESTART_GRACE_S) -> None:
        if token is None and secret is None:
            raise InvalidArgument("connect: needs the server's admin token or a client secret")
        self._admin_token = token
        grace = seconds(restart_grace_s, "restart_grace_s")
        transport = Transport(address, secret or token or "", timeout, grace)
        if secret is None:
            record = transport.json("POST", "/v1/clients", json={"name": name, "weight": weight})
            transport.credential = record["secret"]
        else:
            record = transport.json("GET", "/v1/clients/self")
        self.id: str = record["id"]
        self.lease_s: float = record["lease_s"]
        self._closed = False
        self._session = Session(transport, self.id)
        self._jitted: OrderedDict[tuple[Any, ...], Function | ProgramFunction] = OrderedDict()  # newest last
        self._lease = Lease(transport, self.lease_s)
        # A client dropped without close() stops renewing (the server frees it after the
        # lease) and stops its sender.
        weakref.finalize(self, self._lease.stop)
        weakref.finalize(self, self._session.close)
        if secret is None and close_at_exit:  # opened here: closed as this process exits, if not before
            self._opener = os.getpid()
            _OPENED.add(self)

    @property
    def secret(self) -> str:
        """This session's credential: `connect(secret=...)` opens it from another process."""
        return self._session.transport.credential

    # -- beneath the API: the REST API itself, for tests and tools ---------------------------

    def raw_request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                    json: Any = None, content: bytes | None = None, headers: dict[str, str] | None = None,
                    credential: str | None = None, safe: bool | None = None) -> Response:
        """One request to the REST API (`GET /v1/islands`, say), sent after what is queued,
        with this client's secret (or `credential`) as its bearer: the `Response` (status,
        headers, content). An error status raises its `IsthmusError`, as every request of
        the client does; `safe` says whether it may be sent again after the server may have
        acted on it, while the server restarts (default: a GET may)."""
        return self._session.request(method, path, params=params, json_body=json, content=content,
                                     headers=headers, credential=credential, safe=safe)

    def raw_json(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                 json: Any = None, credential: str | None = None, safe: bool | None = None) -> Any:
        """`raw_request`, answered as JSON."""
        answer = self.raw_request(method, path, params=params, json=json, credential=credential, safe=safe)
        return answer.json()

    def trace(self, of: Any, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
        """The Chrome trace JSON of a traced run (`program(..., trace=True)`), once it has
        ended: `of` is its run id, or a value it computed (a `Buffer`, or a pytree of them);
        written to `path` too, if given. See `client.traces`."""
        return traces.fetch(self, of, path)

    def raw_view(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """`GET path` as JSON, as widely as this client may look: with the admin token it was
        opened with (every client's slices and runs, say), else with its own secret (its own);
        what the `isthmus` status commands show."""
        return self.raw_json("GET", path, params=params, credential=self._admin_token)

    @property
    def address(self) -> str:
        """The server's address, as `http://HOST:PORT`."""
        return self._session.transport.address

    @property
    def admin(self) -> bool:
        """Whether this client was opened with the admin token (and so may look at every
        client's work: `raw_view`)."""
        return self._admin_token is not None

    def raw_call(self, computation_id: str, inputs: list[str]) -> list[Buffer]:
        """A call of a computation registered by hand (`POST /v1/computations`), whose
        signature the client does not know: `POST /v1/calls`, its outputs typed by the
        server's answer."""
        record = self.raw_json("POST", "/v1/calls", json={"computation_id": computation_id, "inputs": inputs})
        return [Buffer(self._session, o["id"], o["slice_id"], Aval(tuple(o["shape"]), o["dtype"]),
                       Spec.from_json(o["spec"])) for o in record["outputs"]]

    @property
    def requests_sent(self) -> int:
        """The requests this client has made to the server (a request tried again while the
        server restarts counts once; the lease's renewals not at all)."""
        return self._session.transport.requests

    @property
    def lease(self) -> Lease:
        """The thread that renews this client's lease (`Lease.stop()` stops it, as a killed
        process would)."""
        return self._lease

    # -- API -------------------------------------------------------------------------------

    def devices(self) -> DeviceTable:
        """Islands, hosts and devices, with their status and load."""
        return DeviceTable(self.raw_json("GET", "/v1/islands"), self.raw_json("GET", "/v1/devices"))

    def restart_island(self, island: str) -> int:
        """New executors for the island's hosts (its JAX group formed again); returns how many
        buffers lost their values with the old ones. Every client's values there are lost, so
        it needs the admin token (a client connected with it has it)."""
        if self._admin_token is None:
            raise Unauthorized("restart_island needs the admin token: connect(token=...)")
        path = f"/v1/islands/{island}/restart"
        return int(self.raw_json("POST", path, credential=self._admin_token)["lost_buffers"])

    def slice(self, mesh: dict[str, int], island: str | None = None,
              device_kind: str | None = None, axis_types: Any = None) -> Slice:
        """Ask for a virtual slice with these named mesh axes, e.g. {"data": 2, "model": 2}.

        `axis_types`, as `jax.make_mesh` takes it: one `jax.sharding.AxisType` per axis (or
        one for all). Auto (the default) traces the slice's functions as JAX's automatic
        sharding does; Explicit, in JAX's explicit sharding mode (shardings in the types,
        `jax.sharding.reshard`, `out_sharding=`), where results keep their types' shardings
        unless `out_specs` says otherwise."""
        types = None if axis_types is None else mesh_axis_types(axis_types, mesh)
        body = {"mesh": mesh, "island": island, "device_kind": device_kind}
        s = Slice(self._session, self.raw_json("POST", "/v1/slices", json=body), types)
        self._session.slices[s.id] = s
        return s

    def put(self, tree: Any, slice: Slice, spec: Any = None) -> Any:
        """Upload arrays (a pytree) onto a slice; `spec` is one spec or a pytree prefix.

        Unlike a call (and the uploads of a call's array arguments), this returns once the
        server holds the arrays, so a refusal (over quota, a spec the slice lacks) is raised
        here; small arrays still travel together, in one request with what was queued."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        specs = leaf_specs(spec, tree, "specs")
        arrays = []
        for i, x in enumerate(leaves):
            try:
                arrays.append(as_array(x))
            except NotAnArray as e:
                path = jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(tree)[0][i][0])
                raise InvalidArgument(f"put: the value{path and ' at ' + path} {e}") from None
        bufs = [self._session.put(a, slice.id, s, view)
                for (a, view), s in zip(arrays, specs, strict=True)]
        self._session.flush()
        for b in bufs:
            if b.error is not None:
                raise b.error
        return jax.tree_util.tree_unflatten(treedef, bufs)

    def flush(self) -> None:
        """Send what is queued now and return once the server has taken it (not run it);
        raise an error a background send met since the last blocking call."""
        self._session.flush()

    def program(self, fn: Callable[..., Any] | None = None, *, dispatch: str | None = None,
                fuse: bool | None = None, name: str | None = None, parallel_iterations: int = 1,
                trace: bool = False) -> Any:
        """Trace `fn`, whose calls are jitted functions on any slices, into one program.

        Calling the result submits one run and returns `Buffer` futures. `dispatch` asks for
        "parallel" (one message per host, the default) or "sequential" dispatch; `fuse`
        whether adjacent computations on one slice become one executable (default: the
        server's setting); `parallel_iterations` how many iterations of each of its loops a
        host may run at once, unless the loop says otherwise (`isthmus.while_loop`); `trace`
        records every run of it for `Client.trace`. See `client.program`.
        """
        if fn is None:
            return lambda f: self.program(f, dispatch=dispatch, fuse=fuse, name=name,
                                          parallel_iterations=parallel_iterations, trace=trace)
        key = ("program", _identity(fn), dispatch, fuse, name, parallel_iterations, trace)
        return self._kept(key, fn, lambda: ProgramFunction(self._session, fn, dispatch, name, fuse,
                                                           parallel_iterations, trace))

    def jit(self, fn: Callable[..., Any] | None = None, *, slice: Slice, in_specs: Any = None,
            out_specs: Any = None, name: str | None = None, static_argnums: int | Sequence[int] | None = None,
            static_argnames: str | Sequence[str] | None = None,
            donate_argnums: int | Sequence[int] | None = None,
            donate_argnames: str | Sequence[str] | None = None, in_shardings: Any = None,
            out_shardings: Any = None) -> Any:
        """Compile `fn` for `slice`; use directly or as a decorator. See `client.jit`;
        `static_argnums` / `static_argnames` (`client.statics`) and `donate_argnums` /
        `donate_argnames` (`client.donation`) as `jax.jit`'s. `in_shardings` /
        `out_shardings` are `in_specs` / `out_specs` by `jax.jit`'s names (`PartitionSpec`s
        or `NamedSharding`s over the slice's axes)."""
        in_specs = _one_of(in_specs, in_shardings, "in_specs", "in_shardings")
        out_specs = _one_of(out_specs, out_shardings, "out_specs", "out_shardings")
        if fn is None:
            return lambda f: self.jit(f, slice=slice, in_specs=in_specs, out_specs=out_specs, name=name,
                                      static_argnums=static_argnums, static_argnames=static_argnames,
                                      donate_argnums=donate_argnums, donate_argnames=donate_argnames)
        statics = Statics.of(fn, static_argnums, static_argnames)
        donated = Donated.of(fn, donate_argnums, donate_argnames, statics)
        return self._kept(
            ("jit", _identity(fn), slice.id, in_specs, out_specs, name, statics, donated), fn,
            lambda: Function(self._session, fn, slice, in_specs, out_specs, name, statics, donated))

    def _kept(self, key: tuple[Any, ...], fn: Callable[..., Any],
              make: Callable[[], Function | ProgramFunction]) -> Function | ProgramFunction:
        """As `jax.jit` keeps what it traced per function, jitting (or making a program of)
        the same function again, `c.jit(step, slice=s)(x)` inside a loop, gives what was
        made the first time, with its exports and registrations: for the newest
        `JITTED_KEPT` functions, and specs that can be hashed (not dicts)."""
        try:
            known = self._jitted.get(key)
        except TypeError:
            return make()
        if known is not None:  # a kept one holds its fn, so its identity names no other function
            self._jitted.move_to_end(key)
            return known
        made = self._jitted[key] = make()
        if len(self._jitted) > JITTED_KEPT:
            self._jitted.popitem(last=False)
        return made

    def buffers(self) -> list[dict[str, Any]]:
        """The server's records of this client's live buffers."""
        return self.raw_json("GET", "/v1/buffers")

    def close(self) -> None:
        """Free every buffer and slice of this client on the server. A call of another thread
        waiting for a restarting server stops waiting (it raises why it waited); closing
        does not wait either."""
        if self._closed:
            return
        self._session.transport.stop_waiting()
        self._lease.stop()
        with contextlib.suppress(IsthmusError):  # closing frees it all, whatever became of it
            self._session.flush()  # what was queued is submitted (and then freed), in order
        self._session.close()
        try:
            self._session.transport.request("DELETE", f"/v1/clients/{self.id}")
        finally:
            self._closed = True
            self._session.transport.close()

    def detach(self) -> None:
        """Stop using the session here, leaving it open on the server with all it holds (a
        session attached by its secret is its opener's to close): what is queued is sent
        first; the lease is no longer renewed from here."""
        if self._closed:
            return
        self._lease.stop()
        try:
            self._session.flush()
        finally:
            self._closed = True
            self._session.close()
            self._session.transport.close()

    def _close_at_exit(self) -> None:
        """The process is exiting with this session open: close it on the server now (its
        queued work could never be read), rather than hold it all for a lease."""
        if self._closed or os.getpid() != self._opener:  # (a forked child exiting: not its own)
            return
        self._closed = True
        self._lease.stop()
        self._session.close()
        with contextlib.suppress(IsthmusError):
            transport = Transport(self._session.transport.address, self.secret, EXIT_TIMEOUT_S)
            transport.request("DELETE", f"/v1/clients/{self.id}")
            transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# The sessions this process opened (with the admin token), closed when it exits, as its files
# are: a script that ends without close() leaves nothing held on the server for a lease. A
# session attached by its secret is for its opener to close.
_OPENED: weakref.WeakSet[Client] = weakref.WeakSet()


@atexit.register
def _close_opened() -> None:
    for c in list(_OPENED):
        c._close_at_exit()


def _identity(fn: Callable[..., Any]) -> Any:
    """The function, as `jax.jit`'s caches tell functions apart: by identity, except that a
    method bound anew (`model.apply`, each time it is read) is its object and its function."""
    if isinstance(fn, types.MethodType):
        return id(fn.__self__), id(fn.__func__)
    return id(fn)


def _one_of(value: Any, alias: Any, name: str, alias_name: str) -> Any:
    """A parameter that `jax.jit` calls by another name: either may be given, not both."""
    if alias is None:
        return value
    if value is not None:
        raise InvalidArgument(f"{alias_name} is {name} by jax.jit's name: give one of them, not both")
    return alias


def connect(address: str | None = None, token: str | None = None, name: str = "",
            weight: float = 1.0, secret: str | None = None, close_at_exit: bool = True,
            restart_grace_s: float | None = None) -> Client:
    """Connect to an Isthmus server (default: `ISTHMUS_ADDRESS`, else the local one).

    With the admin `token` (default: `ISTHMUS_TOKEN`, else the local server's token file) a
    new client session is opened; with a session's `secret` (default:
    `ISTHMUS_CLIENT_SECRET`), that session is used. `weight` is the new session's share of
    an island when the server schedules by proportional share (`ISTHMUS_GANG_POLICY=share`).
    A session opened here is closed when this process exits unless `close_at_exit` is False
    (its secret handed to other processes that go on using it, say).

    `restart_grace_s` (default: `ISTHMUS_RESTART_GRACE_S`, else 30): how long a request
    waits for a server that cannot be reached (restarting, say) before it raises; 0 does
    not wait. docs/client.md says which requests are sent again."""
    address = address or os.environ.get("ISTHMUS_ADDRESS") or DEFAULT_ADDRESS
    secret = secret or (None if token else os.environ.get("ISTHMUS_CLIENT_SECRET"))
    if restart_grace_s is None:
        grace = seconds(os.environ.get("ISTHMUS_RESTART_GRACE_S", RESTART_GRACE_S), "ISTHMUS_RESTART_GRACE_S")
    else:
        grace = seconds(restart_grace_s, "restart_grace_s")
    if secret:
        return Client(address, token, name=name, weight=weight, secret=secret, restart_grace_s=grace)
    return Client(address, token or find_token(), name=name, weight=weight, close_at_exit=close_at_exit,
                  restart_grace_s=grace)


def seconds(value: Any, name: str) -> float:
    """A number of seconds, 0 or more (a number, or its text from the environment)."""
    try:
        s = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        s = math.nan
    if not math.isfinite(s) or s < 0:
        raise InvalidArgument(f"{name}: expected a number of seconds, 0 or more (0: requests do not "
                              f"wait for a restarting server), got {value!r}")
    return s


__all__ = ["Client", "PartitionSpec", "Slice", "connect"]
