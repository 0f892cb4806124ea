"""The resource manager: the inventory of devices, the live virtual slices and their loads.

Contract: built from a `ClusterSpec` and what each host's executor reports about its local
devices; the two must agree (every host reported, with the spec's device count and
platform) or construction raises `InvalidArgument`. Device ids are global and follow
cluster order. `load(id)` is always the number of live slices mapped onto that device:
`create_slice` and `restore_slice` add one per device of the slice, `release` removes it.
Placement is `placement.place`; this class only adds state and a lock. Every public
method is thread-safe (one `threading.Lock`). Unknown ids or names raise `NotFound`.
Taking a host down keeps the slices on it (remapping them is the caller's decision); new
slices avoid it. `add_host` grows the cluster by a host (of an island, or of a new one): its
devices take the next ids, so ids follow the order hosts came in. A host added `solo` holds
slices on it alone (it is outside its island's JAX group) until `join_groups` says the
island's group now includes it.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from ir.errors import Conflict, InvalidArgument, NotFound
from ir.types import MeshAxes
from resource_manager.cluster import ClusterSpec, HostSpec
from resource_manager.inventory import Device, DeviceReport
from resource_manager.placement import place
from resource_manager.slices import Slice

HostStatus = Literal["up", "down"]
HOST_STATUSES: tuple[HostStatus, ...] = ("up", "down")


class ResourceManager:
    """Islands, hosts and devices; virtual slices and the virtual→physical mapping."""

    def __init__(
        self,
        spec: ClusterSpec,
        reports: Mapping[str, Sequence[DeviceReport]],
        *,
        max_hosts_per_slice: int = 1,
    ) -> None:
        if (
            isinstance(max_hosts_per_slice, bool)
            or not isinstance(max_hosts_per_slice, int)
            or max_hosts_per_slice < 1
        ):
            raise InvalidArgument(
                f"max_hosts_per_slice: expected int >= 1, got {max_hosts_per_slice!r}"
            )
        known = {h.name for _, h in spec.hosts()}
        extra = sorted(h for h in reports if h not in known)
        if extra:
            raise InvalidArgument(
                f"device reports name hosts not in the cluster spec: {extra}; "
                f"expected some of {sorted(known)}"
            )
        devices: list[Device] = []
        for island, host in spec.hosts():
            devices.extend(_host_devices(island, host, reports, len(devices)))
        self._spec = spec
        self._max_hosts = max_hosts_per_slice
        self._devices = devices
        self._host_specs = {h.name: (i, h) for i, h in spec.hosts()}
        self._status: dict[str, HostStatus] = dict.fromkeys(self._host_specs, "up")
        self._solo: set[str] = set()  # hosts outside their island's group: slices on them alone
        self._load = dict.fromkeys(range(len(devices)), 0)
        self._slices: dict[str, Slice] = {}
        self._lock = threading.Lock()

    @property
    def spec(self) -> ClusterSpec:
        return self._spec

    @property
    def max_hosts_per_slice(self) -> int:
        return self._max_hosts

    # -- inventory -------------------------------------------------------------------------

    def devices(self) -> list[Device]:
        return list(self._devices)

    def device(self, device_id: int) -> Device:
        if not isinstance(device_id, int) or not 0 <= device_id < len(self._devices):
            raise NotFound(
                f"device {device_id!r} does not exist; ids are 0..{len(self._devices) - 1}"
            )
        return self._devices[device_id]

    def host_memory(self, host: str) -> int | None:
        """The memory the host's devices offer buffers together, as its executor reported
        it (None where a device did not say)."""
        self._host(host)
        memory = [d.memory_bytes for d in self._devices if d.host == host]
        return None if None in memory else sum(m for m in memory if m is not None)

    def islands(self) -> list[str]:
        return [i.name for i in self._spec.islands]

    def hosts(self, island: str | None = None) -> list[str]:
        if island is None:
            return list(self._host_specs)
        for i in self._spec.islands:
            if i.name == island:
                return [h.name for h in i.hosts]
        raise NotFound(f"island {island!r} does not exist; islands are {self.islands()}")

    def host_island(self, host: str) -> str:
        return self._host(host)[0]

    def host_spec(self, host: str) -> HostSpec:
        return self._host(host)[1]

    def _host(self, host: str) -> tuple[str, HostSpec]:
        if host not in self._host_specs:
            raise NotFound(f"host {host!r} does not exist; hosts are {list(self._host_specs)}")
        return self._host_specs[host]

    def load(self, device_id: int) -> int:
        self.device(device_id)
        with self._lock:
            return self._load[device_id]

    def host_status(self, host: str) -> HostStatus:
        self._host(host)
        with self._lock:
            return self._status[host]

    def mark_host(self, host: str, status: str) -> None:
        self._host(host)
        if status not in HOST_STATUSES:
            raise InvalidArgument(
                f"host {host!r}: status: expected one of {list(HOST_STATUSES)}, got {status!r}"
            )
        with self._lock:
            self._status[host] = "up" if status == "up" else "down"

    def add_host(self, island: str, host: HostSpec, report: Sequence[DeviceReport],
                 *, solo: bool = False) -> list[Device]:
        """Add a host (and its island, if new) with the devices its executor reports; returns
        them. Raises `Conflict` for a host name already taken, `InvalidArgument` for a
        report that disagrees with `host` or a platform other than its island's."""
        with self._lock:
            if host.name in self._host_specs:
                raise Conflict(f"host {host.name!r} already exists "
                               f"(island {self._host_specs[host.name][0]!r})")
            spec = self._spec.with_host(island, host)
            added = _host_devices(island, host, {host.name: report}, len(self._devices))
            self._spec = spec
            self._devices.extend(added)
            self._host_specs[host.name] = (island, host)
            self._status[host.name] = "up"
            self._load.update(dict.fromkeys((d.id for d in added), 0))
            if solo:
                self._solo.add(host.name)
            return added

    def join_groups(self, hosts: Sequence[str], max_hosts_per_slice: int | None = None) -> None:
        """These hosts are now in their island's JAX group: slices may span them (up to
        `max_hosts_per_slice` hosts, if given: the largest group's size)."""
        with self._lock:
            self._solo.difference_update(hosts)
            if max_hosts_per_slice is not None:
                self._max_hosts = max(1, max_hosts_per_slice)

    def solo_hosts(self) -> list[str]:
        with self._lock:
            return sorted(self._solo)

    # -- slices ----------------------------------------------------------------------------

    def create_slice(
        self,
        mesh: MeshAxes,
        owner: str,
        *,
        island: str | None = None,
        device_kind: str | None = None,
    ) -> Slice:
        """Place a new slice of `mesh` for `owner` and count it on its devices."""
        if not isinstance(mesh, MeshAxes):
            raise InvalidArgument(f"mesh: expected MeshAxes, got {mesh!r}")
        with self._lock:
            up = {h for h, s in self._status.items() if s == "up"}
            chosen, hosts, ids = place(
                mesh,
                self._devices,
                self._load,
                up,
                island=island,
                device_kind=device_kind,
                max_hosts=self._max_hosts,
                solo=self._solo,
            )
            slice_id = self._new_id()
            s = Slice(slice_id, owner, mesh, chosen, hosts, ids)
            self._add(s)
            return s

    def _new_id(self) -> str:
        while True:
            slice_id = "s-" + secrets.token_hex(6)
            if slice_id not in self._slices:
                return slice_id

    def _add(self, s: Slice) -> None:
        self._slices[s.id] = s
        for i in s.device_ids:
            self._load[i] += 1

    def get_slice(self, slice_id: str) -> Slice:
        with self._lock:
            if slice_id not in self._slices:
                raise NotFound(f"slice {slice_id!r} does not exist")
            return self._slices[slice_id]

    def slices(self, owner: str | None = None) -> list[Slice]:
        with self._lock:
            return [s for s in self._slices.values() if owner is None or s.owner == owner]

    def release(self, slice_id: str) -> None:
        with self._lock:
            self._release(slice_id)

    def _release(self, slice_id: str) -> None:
        s = self._slices.pop(slice_id, None)
        if s is None:
            raise NotFound(f"slice {slice_id!r} does not exist")
        for i in s.device_ids:
            self._load[i] -= 1

    def release_owner(self, owner: str) -> list[str]:
        """Release every slice of `owner`; return their ids (empty if there were none)."""
        with self._lock:
            ids = [s.id for s in self._slices.values() if s.owner == owner]
            for slice_id in ids:
                self._release(slice_id)
            return ids

    def restore_slice(self, s: Slice) -> None:
        """Re-register a persisted slice: its devices must exist and agree with it."""
        if not isinstance(s, Slice):
            raise InvalidArgument(f"restore_slice: expected Slice, got {s!r}")
        n = len(self._devices)
        for i in s.device_ids:
            if i >= n:
                raise NotFound(
                    f"slice {s.id!r}: device {i} does not exist; ids are 0..{n - 1}"
                )
            d = self._devices[i]
            if d.island != s.island or d.host not in s.hosts:
                raise InvalidArgument(
                    f"slice {s.id!r}: device {i} is on island {d.island!r}, host {d.host!r}; "
                    f"expected island {s.island!r}, one of hosts {list(s.hosts)}"
                )
        with self._lock:
            if s.id in self._slices:
                raise Conflict(f"slice {s.id!r} already exists")
            self._add(s)

    # -- summaries -------------------------------------------------------------------------

    def island_summary(self) -> list[dict[str, Any]]:
        """Per island: name, host names, device count, live slices on it, mean device load."""
        with self._lock:
            out = []
            for isl in self._spec.islands:
                ids = [d.id for d in self._devices if d.island == isl.name]
                out.append(
                    {
                        "name": isl.name,
                        "hosts": [h.name for h in isl.hosts],
                        "devices": len(ids),
                        "slices": sum(s.island == isl.name for s in self._slices.values()),
                        "load": sum(self._load[i] for i in ids) / len(ids),
                    }
                )
            return out


def _host_devices(
    island: str, host: HostSpec, reports: Mapping[str, Sequence[DeviceReport]], first_id: int
) -> list[Device]:
    """The `Device`s of one host, checking its report against the spec."""
    if host.name not in reports:
        raise InvalidArgument(
            f"host {host.name!r} (island {island!r}): expected a device report, found none"
        )
    reported = list(reports[host.name])
    if len(reported) != host.num_devices:
        raise InvalidArgument(
            f"host {host.name!r} (island {island!r}): the cluster spec says "
            f"{host.num_devices} devices, the executor reports {len(reported)}"
        )
    out = []
    for index, r in enumerate(reported):
        if not isinstance(r, DeviceReport):
            raise InvalidArgument(
                f"host {host.name!r}: device {index}: expected DeviceReport, got {r!r}"
            )
        if r.platform != host.platform:
            raise InvalidArgument(
                f"host {host.name!r}: device {index}: the cluster spec says platform "
                f"{host.platform!r}, the executor reports {r.platform!r}"
            )
        out.append(
            Device(first_id + index, island, host.name, index, r.platform, r.kind, r.memory_bytes)
        )
    return out
