"""`Slice`, a client's handle on a virtual slice, and `Output`, what a call's output is
before it exists. A leaf: every other client module may import it, it imports none of them
(but `client.arrays`).

A slice reaches the session that made it through `SliceOwner` alone (to delete it); one
made without a session is a description only (the tracer's tests).
"""

from __future__ import annotations

from typing import Any, Protocol

from jax.sharding import AbstractMesh, AxisType

from client.arrays import View
from ir import Aval, InvalidArgument, MeshAxes, Spec

__all__ = ["Output", "Slice", "SliceOwner", "mesh_axis_types"]

Output = tuple[str, Aval, Spec, View]  # an output's slice, aval, spec and view (weakly typed, keys)


class SliceOwner(Protocol):
    """What a `Slice` asks of the session that made it."""

    def delete_slice(self, slice_id: str) -> None: ...


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

    def __init__(self, owner: SliceOwner | None, record: dict[str, Any],
                 axis_types: tuple[AxisType, ...] | None = None) -> None:
        self._owner = owner
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
        """Free the slice on the server, with every buffer on it (which then reads as freed
        with its slice) and the functions made for it."""
        assert self._owner is not None, "a slice made without a session is a description only"
        self._owner.delete_slice(self.id)

    def __repr__(self) -> str:
        return f"Slice({self.id}, {self.mesh}, island={self.island}, devices={self.device_ids})"
