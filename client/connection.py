"""`connect()` and the `Client`: slices, buffers, jitted functions, device status."""

from __future__ import annotations

import json
import os
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.sharding import AbstractMesh, PartitionSpec

from client.buffer import Buffer
from client.devices import DeviceTable
from client.jit import Function, as_array, leaf_specs
from client.lease import Lease
from client.program import ProgramFunction
from client.transport import Transport, Unauthorized
from ir import InvalidArgument, MeshAxes, NotFound, Spec, dtype_name

DEFAULT_ADDRESS = "http://127.0.0.1:8470"


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


class Slice:
    """A virtual slice: named mesh axes mapped by the server onto physical devices."""

    def __init__(self, client: Client, record: dict[str, Any]) -> None:
        self._client = client
        self.id: str = record["id"]
        self.mesh: dict[str, int] = dict(record["mesh"])
        self.island: str = record["island"]
        self.hosts: list[str] = record["hosts"]
        self.device_ids: list[int] = record["device_ids"]
        self.platform: str = record["platform"]

    @property
    def mesh_axes(self) -> MeshAxes:
        return MeshAxes.of(self.mesh)

    @property
    def abstract_mesh(self) -> AbstractMesh:
        """The slice's mesh without devices: what `shard_map` inside a jitted function names."""
        return AbstractMesh(tuple(self.mesh.values()), tuple(self.mesh))

    @property
    def size(self) -> int:
        return self.mesh_axes.size

    @property
    def export_platform(self) -> str:
        return {"gpu": "cuda"}.get(self.platform, self.platform)

    def delete(self) -> None:
        self._client._transport.request("DELETE", f"/v1/slices/{self.id}")
        self._client._slices.pop(self.id, None)

    def __repr__(self) -> str:
        return f"Slice({self.id}, {self.mesh}, island={self.island}, devices={self.device_ids})"


class Client:
    """One client session on the server.

    Opened with the admin `token` (a new session, whose secret this client keeps and sends
    from then on), or with the `secret` of a session the admin opened for it. While the
    client is open a background thread renews its lease; a client that stops (its process
    killed, say) is closed by the server after the lease, freeing what it held.
    """

    def __init__(self, address: str, token: str | None = None, name: str = "", timeout: float = 600.0,
                 weight: float = 1.0, secret: str | None = None) -> None:
        if token is None and secret is None:
            raise InvalidArgument("connect: needs the server's admin token or a client secret")
        self._admin_token = token
        self._transport = Transport(address, secret or token or "", timeout)
        self._released: list[str] = []
        self._slices: dict[str, Slice] = {}  # the slices this client created, by id
        self._lock = threading.Lock()
        if secret is None:
            record = self._transport.json("POST", "/v1/clients", json={"name": name, "weight": weight})
            self._transport.credential = record["secret"]
        else:
            record = self._transport.json("GET", "/v1/clients/self")
        self.id: str = record["id"]
        self.lease_s: float = record["lease_s"]
        self._closed = False
        self._lease = Lease(self._transport, self.lease_s)
        # A client dropped without close() stops renewing: the server frees it after the lease.
        weakref.finalize(self, self._lease.stop)

    @property
    def secret(self) -> str:
        """This session's credential: `connect(secret=...)` opens it from another process."""
        return self._transport.credential

    # -- buffers a program dropped are freed with the next request ---------------------------

    def _release(self, buffer_id: str) -> None:
        with self._lock:
            self._released.append(buffer_id)

    def _take_released(self) -> list[str]:
        with self._lock:
            ids, self._released = self._released, []
        return ids

    def _flush(self) -> None:
        ids = self._take_released()
        if ids and not self._closed:
            self._transport.request("POST", "/v1/buffers/delete", json_body={"ids": ids})

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        self._flush()
        return self._transport.json(method, path, **kwargs)

    # -- API -------------------------------------------------------------------------------

    def devices(self) -> DeviceTable:
        """Islands, hosts and devices, with their status and load."""
        return DeviceTable(self._json("GET", "/v1/islands"), self._json("GET", "/v1/devices"))

    def restart_island(self, island: str) -> int:
        """New executors for the island's hosts (its JAX group formed again); returns how many
        buffers lost their values with the old ones. Every client's values there are lost, so
        it needs the admin token (a client connected with it has it)."""
        if self._admin_token is None:
            raise Unauthorized("restart_island needs the admin token: connect(token=...)")
        path = f"/v1/islands/{island}/restart"
        return int(self._json("POST", path, credential=self._admin_token)["lost_buffers"])

    def slice(self, mesh: dict[str, int], island: str | None = None,
              device_kind: str | None = None) -> Slice:
        """Ask for a virtual slice with these named mesh axes, e.g. {"data": 2, "model": 2}."""
        body = {"mesh": mesh, "island": island, "device_kind": device_kind}
        s = Slice(self, self._json("POST", "/v1/slices", json=body))
        self._slices[s.id] = s
        return s

    def put(self, tree: Any, slice: Slice, spec: Any = None) -> Any:
        """Upload arrays (a pytree) onto a slice; `spec` is one spec or a pytree prefix."""
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        specs = leaf_specs(spec, tree, "specs")
        bufs = [self._upload(as_array(x)[0], slice.id, s) for x, s in zip(leaves, specs, strict=True)]
        return jax.tree_util.tree_unflatten(treedef, bufs)

    def _upload(self, array: np.ndarray, slice_id: str, spec: Spec) -> Buffer:
        self._flush()
        params = {"slice_id": slice_id, "dtype": dtype_name(array.dtype),
                  "shape": ",".join(map(str, array.shape)), "spec": json.dumps(spec.to_json())}
        record = self._transport.json(
            "POST", "/v1/buffers", params=params, content=np.ascontiguousarray(array).tobytes(),
            headers={"Content-Type": "application/octet-stream"},
        )
        return Buffer(self, record)

    def _call(self, computation_id: str, inputs: list[str]) -> list[Buffer]:
        body = {"computation_id": computation_id, "inputs": inputs,
                "release": self._take_released()}
        record = self._transport.json("POST", "/v1/calls", json=body)
        return [Buffer(self, o) for o in record["outputs"]]

    def _run(self, program_id: str, inputs: list[str], dispatch: str | None) -> list[Buffer]:
        body = {"program_id": program_id, "inputs": inputs, "release": self._take_released(),
                "dispatch": dispatch}
        record = self._transport.json("POST", "/v1/runs", json=body)
        return [Buffer(self, o) for o in record["outputs"]]

    def program(self, fn: Callable[..., Any] | None = None, *, dispatch: str | None = None,
                fuse: bool | None = None, name: str | None = None) -> Any:
        """Trace `fn`, whose calls are jitted functions on any slices, into one program.

        Calling the result submits one run and returns `Buffer` futures. `dispatch` asks for
        "parallel" (one message per host, the default) or "sequential" dispatch; `fuse`
        whether adjacent computations on one slice become one executable (default: the
        server's setting). See `client.program`.
        """
        if fn is None:
            return lambda f: ProgramFunction(self, f, dispatch, name, fuse)
        return ProgramFunction(self, fn, dispatch, name, fuse)

    def jit(self, fn: Callable[..., Any] | None = None, *, slice: Slice, in_specs: Any = None,
            out_specs: Any = None, name: str | None = None) -> Any:
        """Compile `fn` for `slice`; use directly or as a decorator. See `client.jit`."""
        if fn is None:
            return lambda f: Function(self, f, slice, in_specs, out_specs, name)
        return Function(self, fn, slice, in_specs, out_specs, name)

    def buffers(self) -> list[dict[str, Any]]:
        """The server's records of this client's live buffers."""
        return self._json("GET", "/v1/buffers")

    def close(self) -> None:
        """Free every buffer and slice of this client on the server."""
        if self._closed:
            return
        self._lease.stop()
        try:
            self._transport.request("DELETE", f"/v1/clients/{self.id}")
        finally:
            self._closed = True
            self._transport.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(address: str | None = None, token: str | None = None, name: str = "",
            weight: float = 1.0, secret: str | None = None) -> Client:
    """Connect to an Isthmus server (default: `ISTHMUS_ADDRESS`, else the local one).

    With the admin `token` (default: `ISTHMUS_TOKEN`, else the local server's token file) a
    new client session is opened; with a session's `secret` (default:
    `ISTHMUS_CLIENT_SECRET`), that session is used. `weight` is the new session's share of
    an island when the server schedules by proportional share (`ISTHMUS_GANG_POLICY=share`)."""
    address = address or os.environ.get("ISTHMUS_ADDRESS") or DEFAULT_ADDRESS
    secret = secret or (None if token else os.environ.get("ISTHMUS_CLIENT_SECRET"))
    if secret:
        return Client(address, token, name=name, weight=weight, secret=secret)
    return Client(address, token or find_token(), name=name, weight=weight)


__all__ = ["Client", "PartitionSpec", "Slice", "connect"]
