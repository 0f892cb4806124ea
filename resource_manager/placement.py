"""Placement of a virtual slice onto physical devices: the Pathways heuristic, as a pure function.

Contract of `place`: given the mesh, every known device, the current load per device id
(live slices mapped onto it; missing ids count 0) and the set of hosts that are up, return
`(island, hosts, device_ids)` or raise:

- `NotFound` when the `island` constraint names no island;
- `Conflict` when no device matches `device_kind` (naming the kinds available), when the
  slice is larger than every island, or when it fits an island but not on `max_hosts` hosts.

A device is usable when its host is up and, if `device_kind` is given, its kind or
platform equals it (case-insensitively). A host in `solo` (one that joined its island
after the island's JAX group formed) holds slices on it alone, never part of one spanning
hosts. Among islands that can hold `mesh.size` usable devices on at most `max_hosts`
hosts, the one with the lowest mean usable-device load wins (ties: island order). Inside
it, the fewest hosts that can hold the slice are taken, least loaded (mean load) first,
each filled before the next is used; inside a host the least loaded devices are taken,
ties by local index. The ids come back sorted by (host order, index), all distinct. Order
is the order of `devices`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence, Set

from ir.errors import Conflict, InvalidArgument, NotFound
from ir.types import MeshAxes
from resource_manager.inventory import Device

Choice = tuple[str, tuple[str, ...], tuple[int, ...]]  # (island, hosts, device ids) for a slice
_Hosts = dict[str, list[Device]]  # host -> its usable devices, in index order


def place(
    mesh: MeshAxes,
    devices: Sequence[Device],
    load: Mapping[int, int],
    up_hosts: Set[str],
    *,
    island: str | None = None,
    device_kind: str | None = None,
    max_hosts: int = 1,
    solo: Set[str] = frozenset(),
) -> Choice:
    """Choose the island, hosts and devices for a slice of `mesh`; see the module contract."""
    if isinstance(max_hosts, bool) or not isinstance(max_hosts, int) or max_hosts < 1:
        raise InvalidArgument(f"max_hosts: expected int >= 1, got {max_hosts!r}")
    ids = [d.id for d in devices]
    if len(set(ids)) != len(ids):
        raise InvalidArgument(f"devices: ids must be distinct, got {sorted(ids)}")
    islands = list(dict.fromkeys(d.island for d in devices))
    host_rank = {h: k for k, h in enumerate(dict.fromkeys(d.host for d in devices))}
    if island is not None and island not in islands:
        raise NotFound(f"island {island!r} does not exist; islands are {islands}")
    candidates = [island] if island is not None else islands
    where = f"island {island!r}" if island is not None else "the cluster"
    pool = [d for d in devices if d.island in candidates]
    if device_kind is not None:
        kinds = sorted({d.kind for d in pool})
        platforms = sorted({d.platform for d in pool})
        pool = [d for d in pool if d.matches_kind(device_kind)]
        if not pool:
            raise Conflict(
                f"no device of kind {device_kind!r} in {where}; kinds available: {kinds} "
                f"(platforms {platforms})"
            )
    groups: dict[str, _Hosts] = {i: {} for i in candidates}
    for d in sorted(pool, key=lambda d: (host_rank[d.host], d.index)):
        if d.host in up_hosts:
            groups[d.island].setdefault(d.host, []).append(d)

    def mean_load(ds: Sequence[Device]) -> float:
        return sum(load.get(d.id, 0) for d in ds) / len(ds)

    n = mesh.size

    def usable(i: str) -> _Hosts:
        """The island's hosts this slice may use: any one that holds it alone, else only
        hosts that may span (not `solo`)."""
        if any(len(ds) >= n for ds in groups[i].values()):
            return groups[i]
        return {h: ds for h, ds in groups[i].items() if h not in solo}

    feasible = [i for i in candidates if _capacity(usable(i), max_hosts) >= n]
    if not feasible:
        raise _no_fit(mesh, pool, groups, up_hosts, where, device_kind, max_hosts, solo)
    chosen = min(
        feasible,
        key=lambda i: (mean_load([d for ds in groups[i].values() for d in ds]), islands.index(i)),
    )
    hosts = usable(chosen)
    ranked = sorted(hosts, key=lambda h: (mean_load(hosts[h]), host_rank[h]))
    picked: list[Device] = []
    for h in _pick_hosts(ranked, {h: len(ds) for h, ds in hosts.items()}, n):
        need = n - len(picked)
        by_load = sorted(hosts[h], key=lambda d: (load.get(d.id, 0), d.index))
        picked.extend(by_load[:need])
    picked.sort(key=lambda d: (host_rank[d.host], d.index))
    used_hosts = tuple(dict.fromkeys(d.host for d in picked))
    return chosen, used_hosts, tuple(d.id for d in picked)


def _capacity(hosts: _Hosts, max_hosts: int) -> int:
    """The most devices any `max_hosts` of these hosts can hold together."""
    return sum(sorted((len(ds) for ds in hosts.values()), reverse=True)[:max_hosts])


def _pick_hosts(ranked: list[str], cap: dict[str, int], n: int) -> list[str]:
    """The fewest hosts holding `n` devices, preferring hosts early in `ranked`.

    Greedy over `ranked`: a host is taken when the hosts after it can still complete the
    slice within the minimum host count, so the result always holds `n`.
    """
    sizes = sorted(cap.values(), reverse=True)
    k = next(j for j in range(1, len(sizes) + 1) if sum(sizes[:j]) >= n)
    chosen: list[str] = []
    need = n
    for pos, h in enumerate(ranked):
        slots = k - len(chosen) - 1
        rest = sorted((cap[r] for r in ranked[pos + 1 :]), reverse=True)[:slots]
        if cap[h] >= need or sum(rest) >= need - cap[h]:
            chosen.append(h)
            need -= cap[h]
            if need <= 0:
                return chosen
    raise AssertionError("unreachable: feasibility was checked before picking hosts")


def _no_fit(
    mesh: MeshAxes,
    pool: list[Device],
    groups: dict[str, _Hosts],
    up_hosts: Set[str],
    where: str,
    device_kind: str | None,
    max_hosts: int,
    solo: Set[str] = frozenset(),
) -> Conflict:
    """The most specific Conflict for a slice that fits nowhere."""
    n = mesh.size
    what = f"slice of {n} devices ({mesh.to_json()})"
    down = list(dict.fromkeys(d.host for d in pool if d.host not in up_hosts))
    qual = (f" of kind {device_kind!r}" if device_kind else "") + (
        f" on hosts that are up (down: {down})" if down else ""
    )
    sizes = {i: sum(len(ds) for ds in hosts.values()) for i, hosts in groups.items()}
    biggest = max(sizes, key=lambda i: sizes[i])  # first in order on ties
    if sizes[biggest] == 0:
        kind = f" of kind {device_kind!r}" if device_kind else ""
        return Conflict(
            f"{what} cannot be placed: every host of {where} with devices{kind} is down: {down}"
        )
    if n > sizes[biggest]:
        if len(groups) == 1:
            return Conflict(
                f"{what} is larger than {where}: it has {sizes[biggest]} devices{qual}"
            )
        return Conflict(
            f"{what} is larger than any island: the largest, {biggest!r}, "
            f"has {sizes[biggest]} devices{qual}"
        )
    best = max(groups, key=lambda i: _capacity(groups[i], max_hosts))
    hosts = groups[best]
    if max_hosts == 1:
        big = max(hosts, key=lambda h: len(hosts[h]))
        return Conflict(
            f"{what} fits island {best!r} ({sizes[best]} devices) but not on one host: "
            f"slices here span one host (multi-host slices are off: max_hosts_per_slice=1), "
            f"so they hold at most {len(hosts[big])} devices: the largest host, {big!r}, "
            f"has {len(hosts[big])}{qual}"
        )
    alone = [h for h in hosts if h in solo]
    if alone:
        spanning = {h: ds for h, ds in hosts.items() if h not in solo}
        return Conflict(
            f"{what} fits island {best!r} ({sizes[best]} devices) but not on hosts that can "
            f"span: {alone} joined after the island's JAX group formed and hold slices on "
            f"them alone until the island restarts; the others hold "
            f"{_capacity(spanning, max_hosts)} devices on {max_hosts} hosts{qual}"
        )
    return Conflict(
        f"{what} fits island {best!r} ({sizes[best]} devices) but not on {max_hosts} hosts "
        f"(max_hosts_per_slice={max_hosts}): its {max_hosts} largest hosts hold "
        f"{_capacity(hosts, max_hosts)} devices{qual}"
    )
