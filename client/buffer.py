"""`Buffer`: a future of an array held on the executors.

Shape, dtype and sharding are known the moment the buffer exists; the data moves only when
asked for. A `Buffer` can be passed to another call without being fetched. When the last
reference to it goes away, the server is told to free it (batched with the next request).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np
from jax.sharding import PartitionSpec

from ir import Aval, Spec, parse_dtype

if TYPE_CHECKING:
    from client.connection import Client


class Shaped:
    """Shape, dtype and rank from an `aval`: what every array-like value of the client shows."""

    __slots__ = ()
    aval: Aval

    @property
    def shape(self) -> tuple[int, ...]:
        return self.aval.shape

    @property
    def dtype(self) -> np.dtype:
        return parse_dtype(self.aval.dtype)

    @property
    def ndim(self) -> int:
        return len(self.aval.shape)


class Buffer(Shaped):
    __slots__ = ("__weakref__", "_client", "_value", "aval", "id", "slice_id", "spec")

    def __init__(self, client: Client, record: dict[str, Any]) -> None:
        self._client = client
        self.id: str = record["id"]
        self.slice_id: str = record["slice_id"]
        self.aval = Aval(tuple(record["shape"]), record["dtype"])
        self.spec = Spec.from_json(record["spec"])
        self._value: np.ndarray | None = None
        weakref.finalize(self, client._release, self.id)

    @property
    def sharding(self) -> PartitionSpec:
        """The partition spec over the mesh of the buffer's slice."""
        return PartitionSpec(*self.spec.entries)

    def ready(self) -> bool:
        """True once the value exists or has failed; never blocks."""
        state = self._client._transport.json("GET", f"/v1/buffers/{self.id}")["state"]
        return state in ("ready", "failed")

    def result(self) -> Buffer:
        """Block until the value exists; raise `RemoteError` with the remote cause if it failed."""
        self._client._transport.json("GET", f"/v1/buffers/{self.id}", params={"wait": True})
        return self

    def numpy(self) -> np.ndarray:
        """Fetch the value (once) as a numpy array."""
        if self._value is None:
            response = self._client._transport.request("GET", f"/v1/buffers/{self.id}/data")
            value = np.frombuffer(response.content, dtype=self.dtype).reshape(self.shape)
            value.flags.writeable = False
            self._value = value
        return self._value

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        value = self.numpy()
        return value.astype(dtype) if dtype is not None else np.array(value) if copy else value

    def __repr__(self) -> str:
        return f"Buffer({self.id}, {self.aval}, {self.spec}, slice={self.slice_id})"
