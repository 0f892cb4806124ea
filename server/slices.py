"""The clients' slices: creating, finding and releasing them, and where each one's devices are.

Contract:
- `create` places a slice (`resource_manager`) within the client's slice quota; one that
  would span hosts of an island that is not one JAX group is refused (`Conflict`). Slices
  are written to the registry, and survive a restart (`server.recovery`).
- `get` finds one of the caller's slices; another client's reads exactly like a missing one.
- `placement` and `mesh` say where a slice's devices are, as lowering and the executors name
  them. A slice never moves and its devices keep their host and index, so a placement is
  worked out once per slice (the newest `PLACEMENTS_KEPT` are kept).
- `release` forgets a slice; what lived on it is the caller's to free first (`server.service`).
"""

from __future__ import annotations

from executors import ExecutorPool
from ir import Conflict, DeviceMesh, InvalidArgument, MeshAxes, NotFound, Placement
from ir.passes import device_mesh
from resource_manager import ResourceManager, Slice
from server.quotas import Quotas
from server.records import ClientRecord
from server.registry import Registry

PLACEMENTS_KEPT = 4096  # slices whose placement is remembered (far more than are live)


class Slices:
    def __init__(self, rm: ResourceManager, pool: ExecutorPool, registry: Registry, quotas: Quotas) -> None:
        self._rm = rm
        self._pool = pool
        self._registry = registry
        self._quotas = quotas
        # id(slice) -> the slice (held, so its id names no other) and its placement
        self._placed: dict[int, tuple[Slice, Placement]] = {}

    def create(self, owner: ClientRecord, mesh: dict[str, int], island: str | None,
               device_kind: str | None) -> Slice:
        self._quotas.check("slices", len(self._rm.slices(owner=owner.id)), 1)
        s = self._rm.create_slice(MeshAxes.of(mesh), owner.id, island=island, device_kind=device_kind)
        if len(s.hosts) > 1 and s.island not in self._pool.groups:
            self._rm.release(s.id)
            raise Conflict(f"slice of {s.mesh.size} devices ({s.mesh.to_json()}) would span hosts "
                           f"{list(s.hosts)} of island {s.island}, which is not one JAX group")
        self._registry.add_slice(s)
        return s

    def get(self, owner: ClientRecord, slice_id: str) -> Slice:
        s = self._rm.get_slice(slice_id)  # NotFound names the id
        if s.owner != owner.id:  # another client's slice reads exactly like a missing one
            raise NotFound(f"slice {slice_id!r} does not exist")
        return s

    def of(self, owner: ClientRecord) -> list[Slice]:
        """The client's slices."""
        return self._rm.slices(owner=owner.id)

    def platform(self, s: Slice) -> str:
        return self._rm.device(s.device_ids[0]).platform

    def release(self, s: Slice) -> None:
        self._rm.release(s.id)
        self._registry.remove_slices([s.id])

    def placement(self, s: Slice) -> Placement:
        """Where the slice's mesh lives: its island, and (host, local index) per position."""
        placed = self._placed.get(id(s))
        if placed is not None:
            return placed[1]
        devices = [self._rm.device(d) for d in s.device_ids]
        placement = Placement(s.island, tuple((d.host, d.index) for d in devices))
        if len(self._placed) >= PLACEMENTS_KEPT:  # slices released long ago: start afresh
            self._placed.clear()
        self._placed[id(s)] = (s, placement)
        return placement

    def mesh(self, s: Slice) -> DeviceMesh:
        """The slice's devices as its executors name them (`ir.passes.device_mesh`)."""
        try:
            return device_mesh(self.placement(s), s.mesh, self._pool.ranks, f"slice {s.id}")
        except InvalidArgument as e:
            raise Conflict(str(e)) from None
