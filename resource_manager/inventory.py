"""Physical devices as the resource manager knows them.

Contract: a `Device` names one accelerator by a global `id` (0..N-1 in cluster order:
islands in order, hosts in order, devices in host-local index order), the island and host
that own it, and its host-local `index` (its position in that host process's
`jax.devices()`). A `DeviceReport` is what a host's executor says about one of its local
devices; the manager joins reports with the cluster spec to build `Device`s. Both are
frozen and validate themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.errors import InvalidArgument


def _check_memory(what: str, memory_bytes: int | None) -> None:
    if memory_bytes is None:
        return
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes < 0:
        raise InvalidArgument(
            f"{what}: memory_bytes: expected None or int >= 0, got {memory_bytes!r}"
        )


def _check_text(what: str, field: str, value: object) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{what}: {field}: expected a non-empty string, got {value!r}")


def _check_index(what: str, field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"{what}: {field}: expected int >= 0, got {value!r}")


@dataclass(frozen=True)
class DeviceReport:
    """One local device as its host's executor reports it (platform, kind, memory)."""

    platform: str
    kind: str
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_text("device report", "platform", self.platform)
        _check_text("device report", "kind", self.kind)
        _check_memory("device report", self.memory_bytes)


@dataclass(frozen=True)
class Device:
    """One physical device: global id, owner island and host, host-local index."""

    id: int
    island: str
    host: str
    index: int
    platform: str
    kind: str
    memory_bytes: int | None = None

    def __post_init__(self) -> None:
        _check_index("device", "id", self.id)
        what = f"device {self.id}"
        _check_text(what, "island", self.island)
        _check_text(what, "host", self.host)
        _check_index(what, "index", self.index)
        _check_text(what, "platform", self.platform)
        _check_text(what, "kind", self.kind)
        _check_memory(what, self.memory_bytes)

    def matches_kind(self, kind: str) -> bool:
        """Whether `kind` names this device: its kind or its platform, any case."""
        k = kind.casefold()
        return k in (self.kind.casefold(), self.platform.casefold())

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "island": self.island,
            "host": self.host,
            "index": self.index,
            "platform": self.platform,
            "kind": self.kind,
            "memory_bytes": self.memory_bytes,
        }
