"""Virtual slices: a named mesh of virtual devices mapped onto physical devices.

Contract: a `Slice` is frozen and valid by construction: `device_ids` are global
`Device.id`s in the mesh's row-major order, exactly `mesh.size` of them, all distinct
(a slice never uses a physical device twice); `hosts` lists the hosts those devices live
on, in host order. `to_json`/`from_json` give the wire and persistence form, with the
mesh as an ordered `{axis: size}` object.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ir.errors import InvalidArgument
from ir.node import check_hosts
from ir.types import MeshAxes


@dataclass(frozen=True)
class Slice:
    """A virtual slice owned by one client, placed on devices of one island."""

    id: str
    owner: str
    mesh: MeshAxes
    island: str
    hosts: tuple[str, ...]
    device_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        for field in ("id", "owner", "island"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise InvalidArgument(
                    f"slice {self.id!r}: {field}: expected a non-empty string, got {value!r}"
                )
        if not isinstance(self.mesh, MeshAxes):
            raise InvalidArgument(f"slice {self.id!r}: mesh: expected MeshAxes, got {self.mesh!r}")
        check_hosts(self.hosts, f"slice {self.id!r}: hosts")
        ids = self.device_ids
        if not isinstance(ids, tuple) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids
        ):
            raise InvalidArgument(
                f"slice {self.id!r}: device_ids: expected a tuple of ints >= 0, got {ids!r}"
            )
        if len(ids) != self.mesh.size:
            raise InvalidArgument(
                f"slice {self.id!r}: mesh {self.mesh.to_json()} has {self.mesh.size} devices "
                f"but device_ids has {len(ids)}"
            )
        if len(set(ids)) != len(ids):
            dup = sorted({i for i in ids if ids.count(i) > 1})
            raise InvalidArgument(f"slice {self.id!r}: device_ids repeat: {dup}")

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "owner": self.owner,
            "mesh": self.mesh.to_json(),
            "island": self.island,
            "hosts": list(self.hosts),
            "device_ids": list(self.device_ids),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Slice:
        """The inverse of `to_json`, for persisted state; bad input is InvalidArgument."""
        try:
            mesh = d["mesh"]
            if not isinstance(mesh, Mapping):
                raise InvalidArgument(
                    f"slice: mesh: expected an object {{axis: size}}, got {mesh!r}"
                )
            return cls(
                id=d["id"],
                owner=d["owner"],
                mesh=MeshAxes.of(dict(mesh)),
                island=d["island"],
                hosts=tuple(d["hosts"]),
                device_ids=tuple(d["device_ids"]),
            )
        except KeyError as e:
            raise InvalidArgument(f"slice: missing key {e.args[0]!r} in {dict(d)!r}") from None
        except TypeError as e:
            raise InvalidArgument(f"slice: malformed {dict(d)!r}: {e}") from None
