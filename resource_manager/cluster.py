"""The shape of a cluster: islands of hosts, each host owning a number of devices.

Contract: a `ClusterSpec` is frozen and valid by construction (at least one island, every
island at least one host, island names unique, host names unique across the cluster).
`ClusterSpec.from_json` and `load_cluster` turn user input into a spec or raise
`InvalidArgument` naming the key path and saying what was expected and what was found.
YAML is read only for `.yaml`/`.yml` files, and pyyaml is imported only then.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ir.errors import InvalidArgument

PLATFORMS = ("cpu", "gpu")
_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_ISLAND_KEYS = ("name", "hosts", "devices_per_host", "platform")
_HOST_KEYS = ("name", "devices", "platform")


def _check_name(what: str, name: object) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidArgument(
            f"{what}: expected a non-empty name of letters, digits, '-' or '_', got {name!r}"
        )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _repeats(names: list[str]) -> list[str]:
    return sorted({n for n in names if names.count(n) > 1})


@dataclass(frozen=True)
class HostSpec:
    """One host (one executor process) and how many local devices it must own."""

    name: str
    num_devices: int
    platform: str = "cpu"
    node: str | None = None  # the Ray node its executor is pinned to (islands from node labels)

    def __post_init__(self) -> None:
        _check_name("host name", self.name)
        if not _is_int(self.num_devices) or self.num_devices < 1:
            raise InvalidArgument(
                f"host {self.name!r}: num_devices: expected int >= 1, got {self.num_devices!r}"
            )
        if self.platform not in PLATFORMS:
            raise InvalidArgument(
                f"host {self.name!r}: platform: expected one of {list(PLATFORMS)}, "
                f"got {self.platform!r}"
            )


@dataclass(frozen=True)
class IslandSpec:
    """Hosts whose devices can run one SPMD computation together."""

    name: str
    hosts: tuple[HostSpec, ...]

    def __post_init__(self) -> None:
        _check_name("island name", self.name)
        if not isinstance(self.hosts, tuple) or not self.hosts:
            raise InvalidArgument(
                f"island {self.name!r}: hosts: expected a non-empty tuple of HostSpec, "
                f"got {self.hosts!r}"
            )
        for h in self.hosts:
            if not isinstance(h, HostSpec):
                raise InvalidArgument(f"island {self.name!r}: expected HostSpec, got {h!r}")
        dup = _repeats([h.name for h in self.hosts])
        if dup:
            raise InvalidArgument(f"island {self.name!r}: host names repeat: {dup}")

    @property
    def num_devices(self) -> int:
        return sum(h.num_devices for h in self.hosts)


@dataclass(frozen=True)
class ClusterSpec:
    """The whole cluster: islands in order, each with its hosts in order."""

    islands: tuple[IslandSpec, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.islands, tuple) or not self.islands:
            raise InvalidArgument(
                f"cluster: islands: expected a non-empty tuple of IslandSpec, got {self.islands!r}"
            )
        for i in self.islands:
            if not isinstance(i, IslandSpec):
                raise InvalidArgument(f"cluster: expected IslandSpec, got {i!r}")
        dup = _repeats([i.name for i in self.islands])
        if dup:
            raise InvalidArgument(f"cluster: island names repeat: {dup}")
        dup = _repeats([h.name for _, h in self.hosts()])
        if dup:
            raise InvalidArgument(f"cluster: host names repeat across islands: {dup}")

    def hosts(self) -> list[tuple[str, HostSpec]]:
        """Every (island name, host) pair, islands in order, hosts in order."""
        return [(i.name, h) for i in self.islands for h in i.hosts]

    @property
    def num_devices(self) -> int:
        return sum(i.num_devices for i in self.islands)

    def groups(self) -> dict[str, tuple[str, ...]]:
        """The islands that can be one JAX distributed group (several hosts of one platform),
        with their hosts in process order."""
        return {i.name: tuple(h.name for h in i.hosts) for i in self.islands
                if len(i.hosts) > 1 and len({h.platform for h in i.hosts}) == 1}

    def with_host(self, island: str, host: HostSpec) -> ClusterSpec:
        """This cluster with `host` added last to `island` (a new island, last, if none is
        named so). Raises `InvalidArgument` for a platform other than the island's."""
        islands = list(self.islands)
        for k, i in enumerate(islands):
            if i.name == island:
                if i.hosts[0].platform != host.platform:
                    raise InvalidArgument(f"host {host.name!r}: platform {host.platform!r} is not "
                                          f"island {island!r}'s ({i.hosts[0].platform!r})")
                islands[k] = IslandSpec(island, (*i.hosts, host))
                return ClusterSpec(tuple(islands))
        return ClusterSpec((*islands, IslandSpec(island, (host,))))

    def to_json(self) -> dict[str, Any]:
        return {
            "islands": [
                {
                    "name": i.name,
                    "hosts": [
                        {"name": h.name, "devices": h.num_devices, "platform": h.platform}
                        for h in i.hosts
                    ],
                }
                for i in self.islands
            ]
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, source: str = "cluster") -> ClusterSpec:
        """Parse the full form or the per-island shorthand; `source` prefixes errors."""
        if not isinstance(d, Mapping):
            raise InvalidArgument(f"{source}: expected an object with 'islands', got {d!r}")
        _no_unknown_keys(source, d, ("islands",))
        islands = d.get("islands")
        if not isinstance(islands, list) or not islands:
            raise InvalidArgument(
                f"{source}: islands: expected a non-empty list, got {islands!r}"
            )
        parsed = tuple(
            _parse_island(f"{source}: islands[{k}]", raw) for k, raw in enumerate(islands)
        )
        try:
            return cls(parsed)
        except InvalidArgument as e:
            raise InvalidArgument(f"{source}: {str(e).removeprefix('cluster: ')}") from None


def _no_unknown_keys(path: str, d: Mapping[str, Any], known: tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in d if k not in known)
    if unknown:
        raise InvalidArgument(f"{path}: unknown keys {unknown}; expected some of {list(known)}")


def _field(path: str, d: Mapping[str, Any], key: str) -> Any:
    if key not in d:
        raise InvalidArgument(f"{path}: missing key {key!r}")
    return d[key]


def _positive(path: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidArgument(f"{path}: expected int >= 1, got {value!r}")
    return value


def _platform(path: str, value: object) -> str:
    if not isinstance(value, str) or value not in PLATFORMS:
        raise InvalidArgument(f"{path}: expected one of {list(PLATFORMS)}, got {value!r}")
    return value


def _parse_island(path: str, raw: object) -> IslandSpec:
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"{path}: expected an object with 'name' and 'hosts', got {raw!r}")
    _no_unknown_keys(path, raw, _ISLAND_KEYS)
    name = _field(path, raw, "name")
    _check_name(f"{path}.name", name)
    platform = _platform(f"{path}.platform", raw.get("platform", "cpu"))
    hosts = _field(path, raw, "hosts")
    if _is_int(hosts):
        # Shorthand: N identical hosts named <island>0, <island>1, ...
        count = _positive(f"{path}.hosts", hosts)
        per_host = _positive(f"{path}.devices_per_host", _field(path, raw, "devices_per_host"))
        specs = tuple(HostSpec(f"{name}{k}", per_host, platform) for k in range(count))
    elif isinstance(hosts, list) and hosts:
        if "devices_per_host" in raw:
            raise InvalidArgument(
                f"{path}.devices_per_host: only allowed when 'hosts' is a count; "
                f"here 'hosts' is a list, so give each host its 'devices'"
            )
        specs = tuple(
            _parse_host(f"{path}.hosts[{k}]", h, platform) for k, h in enumerate(hosts)
        )
    else:
        raise InvalidArgument(
            f"{path}.hosts: expected a non-empty list of hosts or an int >= 1, got {hosts!r}"
        )
    try:
        return IslandSpec(name, specs)
    except InvalidArgument as e:
        raise InvalidArgument(f"{path}: {e}") from None


def _parse_host(path: str, raw: object, platform: str) -> HostSpec:
    if not isinstance(raw, Mapping):
        raise InvalidArgument(f"{path}: expected an object with 'name' and 'devices', got {raw!r}")
    _no_unknown_keys(path, raw, _HOST_KEYS)
    name = _field(path, raw, "name")
    _check_name(f"{path}.name", name)
    devices = _positive(f"{path}.devices", _field(path, raw, "devices"))
    return HostSpec(name, devices, _platform(f"{path}.platform", raw.get("platform", platform)))


def default_cluster() -> ClusterSpec:
    """The embedded default: islands 'a' and 'b', 2 hosts each, 4 CPU devices per host."""
    return ClusterSpec(
        tuple(
            IslandSpec(i, tuple(HostSpec(f"{i}{k}", 4, "cpu") for k in range(2)))
            for i in ("a", "b")
        )
    )


def load_cluster(path: str | os.PathLike[str]) -> ClusterSpec:
    """Read a cluster file: YAML for `.yaml`/`.yml`, JSON otherwise."""
    p = Path(path)
    where = f"cluster file {str(p)!r}"
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidArgument(f"{where}: expected an existing file, found none") from None
    except OSError as e:
        raise InvalidArgument(f"{where}: cannot be read: {e}") from None
    if p.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise InvalidArgument(f"{where}: reading YAML needs pyyaml installed") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise InvalidArgument(f"{where}: expected YAML, cannot parse it: {e}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InvalidArgument(f"{where}: expected JSON, cannot parse it: {e}") from None
    return ClusterSpec.from_json(data, source=where)
