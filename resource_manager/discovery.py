"""Islands and hosts from a Ray cluster's nodes, by their labels (pure: the node table in).

A node labelled `isthmus.dev/island: <name>` is one host of that island; a node without the
label (a head, say) hosts no executor. A node with GPUs (Ray's `GPU` resource) has them as
its devices; any other node has `isthmus.dev/devices` simulated CPU devices (one if
absent). Hosts are named `<island><k>`, numbered in the order of their nodes' addresses, and
each records its node, where its executor is pinned (docs/kubernetes.md, "Labels").

`joined_hosts` names the hosts of nodes labelled after the cluster was made: each takes the
first free `<island><k>` of its island (a new island if the label names one), in the order
of the nodes' addresses; a node whose labels are wrong, or whose platform differs from its
island's, is refused with the reason, and the rest still join.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ir import InvalidArgument
from resource_manager.cluster import ClusterSpec, HostSpec, IslandSpec
from resource_manager.cluster import _check_name as check_name

ISLAND_LABEL = "isthmus.dev/island"
DEVICES_LABEL = "isthmus.dev/devices"
MAX_DEVICES = 4096  # per host: a label asking for more is a typo, not a machine


Member = tuple[str, str, int, str]  # a labelled node: (address, node id, devices, platform)


def cluster_from_nodes(nodes: Sequence[Mapping[str, Any]]) -> ClusterSpec | None:
    """The cluster the live labelled nodes make, or None if no live node is labelled."""
    by_island: dict[str, list[Member]] = {}
    for node in nodes:
        found = _member(node)
        if found is not None:
            by_island.setdefault(found[0], []).append(found[1])
    if not by_island:
        return None
    islands = []
    for name in sorted(by_island):
        members = sorted(by_island[name])
        platforms = {platform for *_, platform in members}
        if len(platforms) > 1:
            raise InvalidArgument(f"island {name!r}: its nodes mix platforms {sorted(platforms)}; "
                                  "an island's hosts share one")
        islands.append(IslandSpec(name, tuple(
            HostSpec(f"{name}{k}", devices, platform, node=node_id)
            for k, (_, node_id, devices, platform) in enumerate(members))))
    return ClusterSpec(tuple(islands))


def joined_hosts(spec: ClusterSpec, nodes: Sequence[Mapping[str, Any]]
                 ) -> tuple[list[tuple[str, HostSpec]], dict[str, str]]:
    """The (island, host) pairs for live labelled nodes no host of `spec` runs on, and the
    nodes refused (node id -> why)."""
    known = {h.node for _, h in spec.hosts()}
    names = {h.name for _, h in spec.hosts()}
    platform = {i.name: i.hosts[0].platform for i in spec.islands}
    new: list[tuple[str, Member]] = []
    refused: dict[str, str] = {}
    for node in nodes:
        node_id = str(node.get("NodeID", ""))
        if node_id in known:
            continue
        try:
            found = _member(node)
        except InvalidArgument as e:
            refused[node_id] = str(e)
            continue
        if found is None:
            continue
        island, member = found
        if platform.setdefault(island, member[3]) != member[3]:
            refused[node_id] = (f"Ray node {node_id[:12]}: its platform {member[3]!r} is not island "
                                f"{island!r}'s ({platform[island]!r}); an island's hosts share one")
            continue
        new.append(found)
    joined = []
    for island, (_, node_id, devices, plat) in sorted(new):
        name = next(f"{island}{k}" for k in range(len(names) + 1) if f"{island}{k}" not in names)
        names.add(name)
        joined.append((island, HostSpec(name, devices, plat, node=node_id)))
    return joined, refused


def _member(node: Mapping[str, Any]) -> tuple[str, Member] | None:
    """A live labelled node's island and what it brings; None for any other node."""
    labels = node.get("Labels") or {}
    island = labels.get(ISLAND_LABEL)
    if not node.get("Alive") or island is None:
        return None
    node_id = str(node.get("NodeID", ""))
    check_name(f"Ray node {node_id[:12]}: label {ISLAND_LABEL}", island)
    devices, platform = _devices(node_id, labels, node.get("Resources") or {})
    return str(island), (str(node.get("NodeManagerAddress", "")), node_id, devices, platform)


def _devices(node_id: str, labels: Mapping[str, Any], resources: Mapping[str, Any]) -> tuple[int, str]:
    gpus = int(resources.get("GPU", 0) or 0)
    if gpus > 0:
        return gpus, "gpu"
    raw = labels.get(DEVICES_LABEL, "1")
    try:
        count = int(str(raw))
    except ValueError:
        count = 0
    if not 1 <= count <= MAX_DEVICES:
        raise InvalidArgument(f"Ray node {node_id[:12]}: label {DEVICES_LABEL}: expected a whole "
                              f"number from 1 to {MAX_DEVICES}, got {raw!r}")
    return count, "cpu"
