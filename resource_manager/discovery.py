"""Islands and hosts from a Ray cluster's nodes, by their labels (pure: the node table in).

A node labelled `isthmus.dev/island: <name>` is one host of that island; a node without the
label (a head, say) hosts no executor. A node with GPUs (Ray's `GPU` resource) has them as
its devices; any other node has `isthmus.dev/devices` simulated CPU devices (one if
absent). Hosts are named `<island><k>`, numbered in the order of their nodes' addresses, and
each records its node, where its executor is pinned (docs/kubernetes.md, "Labels").
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


def cluster_from_nodes(nodes: Sequence[Mapping[str, Any]]) -> ClusterSpec | None:
    """The cluster the live labelled nodes make, or None if no live node is labelled."""
    by_island: dict[str, list[tuple[str, str, int, str]]] = {}
    for node in nodes:
        labels = node.get("Labels") or {}
        island = labels.get(ISLAND_LABEL)
        if not node.get("Alive") or island is None:
            continue
        node_id = str(node.get("NodeID", ""))
        check_name(f"Ray node {node_id[:12]}: label {ISLAND_LABEL}", island)
        devices, platform = _devices(node_id, labels, node.get("Resources") or {})
        by_island.setdefault(str(island), []).append(
            (str(node.get("NodeManagerAddress", "")), node_id, devices, platform))
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
