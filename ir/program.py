"""Programs of the sharded dataflow IR: a graph (`ir.node.Graph`) and its tables.

Contract:
- A `Program` is a graph plus the tables its nodes refer to by name: the slice table (name
  -> `MeshAxes` and an optional island) and the artifact table (content hash -> bytes and
  optional string metadata), so the graph itself stays small and readable. Sub-graphs
  share their program's tables.
- Everything is frozen and checks itself when built; `verify` checks the whole program.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from ir.errors import InvalidArgument
from ir.node import IDENTIFIER, Graph, Node, check_name
from ir.types import MeshAxes

VERSIONS = (1,)


@dataclass(frozen=True)
class Placement:
    """Where a slice's mesh lives: its island, and (host, local device index) per mesh position.

    Positions are the mesh's devices in row-major order, as `jax.sharding.Mesh` lays them out.
    """

    island: str
    devices: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        check_name(self.island, IDENTIFIER, "placement: island")
        if not isinstance(self.devices, tuple) or not self.devices or not all(
            isinstance(d, tuple) and len(d) == 2 and isinstance(d[0], str) and isinstance(d[1], int)
            and not isinstance(d[1], bool) and d[1] >= 0
            for d in self.devices
        ):
            raise InvalidArgument(
                f"placement: expected a non-empty tuple of (host, local index) pairs, found {self.devices!r}"
            )
        for host, _ in self.devices:
            check_name(host, IDENTIFIER, "placement: host")
        if len(set(self.devices)) != len(self.devices):
            raise InvalidArgument(f"placement: expected distinct devices, found {self.devices!r}")

    @property
    def hosts(self) -> tuple[str, ...]:
        """The hosts, in order of first appearance."""
        return tuple(dict.fromkeys(h for h, _ in self.devices))

    def local(self, host: str) -> tuple[int, ...]:
        """The local device indices on `host`, in mesh order."""
        return tuple(i for h, i in self.devices if h == host)


@dataclass(frozen=True)
class SliceDef:
    """One virtual slice: its mesh's named axes, optionally the island it must live on, and,
    once the `place` pass has run, the physical devices it is mapped onto."""

    name: str
    mesh: MeshAxes
    island: str | None = None
    placement: Placement | None = None

    def __post_init__(self) -> None:
        check_name(self.name, IDENTIFIER, "slice name")
        if not isinstance(self.mesh, MeshAxes):
            raise InvalidArgument(f"slice {self.name}: expected MeshAxes, found {self.mesh!r}")
        if self.island is not None:
            check_name(self.island, IDENTIFIER, f"slice {self.name}: island")
        if self.placement is not None:
            if not isinstance(self.placement, Placement):
                raise InvalidArgument(f"slice {self.name}: expected a Placement, found {self.placement!r}")
            if len(self.placement.devices) != self.mesh.size:
                raise InvalidArgument(
                    f"slice {self.name}: expected {self.mesh.size} placed devices for mesh "
                    f"{self.mesh.to_json()}, found {len(self.placement.devices)}"
                )
            if self.island is not None and self.placement.island != self.island:
                raise InvalidArgument(
                    f"slice {self.name}: expected a placement on island {self.island}, "
                    f"found one on {self.placement.island}"
                )


@dataclass(frozen=True)
class Artifact:
    """A serialized computation, addressed by `sha256:<hex digest of data>`."""

    hash: str
    data: bytes
    meta: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes):
            raise InvalidArgument(f"artifact {self.hash}: expected bytes, found {type(self.data).__name__}")
        digest = content_hash(self.data)
        if self.hash != digest:
            raise InvalidArgument(f"artifact: expected hash {digest} of its bytes, found {self.hash!r}")
        if not isinstance(self.meta, tuple) or not all(
            isinstance(kv, tuple) and len(kv) == 2 and all(isinstance(s, str) for s in kv) for kv in self.meta
        ):
            raise InvalidArgument(f"artifact {self.hash}: meta must be (str, str) pairs, found {self.meta!r}")
        object.__setattr__(self, "meta", tuple(sorted(dict(self.meta).items())))

    @classmethod
    def of(cls, data: bytes, meta: Mapping[str, str] | None = None) -> Artifact:
        return cls(content_hash(data), data, tuple((meta or {}).items()))


def content_hash(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Program:
    graph: Graph
    slices: tuple[SliceDef, ...] = ()
    artifacts: tuple[Artifact, ...] = ()
    version: int = 1

    def __post_init__(self) -> None:
        if self.version not in VERSIONS:
            raise InvalidArgument(f"program: expected a version in {VERSIONS}, found {self.version!r}")
        if not isinstance(self.graph, Graph):
            raise InvalidArgument(f"program: expected a Graph, found {self.graph!r}")
        if not isinstance(self.slices, tuple) or not all(isinstance(s, SliceDef) for s in self.slices):
            raise InvalidArgument(f"program: expected a tuple of SliceDef, found {self.slices!r}")
        if not isinstance(self.artifacts, tuple) or not all(isinstance(a, Artifact) for a in self.artifacts):
            raise InvalidArgument(f"program: expected a tuple of Artifact, found {self.artifacts!r}")
        names = [s.name for s in self.slices]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"program: expected distinct slice names, found {names}")
        hashes = [a.hash for a in self.artifacts]
        if len(set(hashes)) != len(hashes):
            raise InvalidArgument(f"program: expected distinct artifacts, found {hashes}")
        # The artifact table is a set: keep it in one order so equal programs compare equal.
        object.__setattr__(self, "artifacts", tuple(sorted(self.artifacts, key=lambda a: a.hash)))

    @property
    def nodes(self) -> tuple[Node, ...]:
        return self.graph.nodes

    @property
    def results(self) -> tuple[str, ...]:
        return self.graph.results

    @property
    def slice_table(self) -> dict[str, SliceDef]:
        return {s.name: s for s in self.slices}

    @property
    def artifact_table(self) -> dict[str, Artifact]:
        return {a.hash: a for a in self.artifacts}

    def stats(self) -> dict[str, int]:
        return self.graph.stats()
