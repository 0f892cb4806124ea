"""The resource manager: islands, hosts and devices; virtual slices placed on them.

Pure: imports the standard library and `ir` only (pyyaml lazily, for YAML cluster files);
no Ray, no JAX. It takes plain names and ids and returns plain values, so it is tested
without either. Other packages import only from this module.

- `cluster`: `ClusterSpec` (islands → hosts → device counts), `default_cluster`,
  `load_cluster`.
- `discovery`: `cluster_from_nodes`, islands and hosts from a Ray cluster's node labels;
  `joined_hosts`, the hosts of nodes labelled since.
- `inventory`: `Device` (global id, island, host, host-local index), `DeviceReport`.
- `slices`: `Slice`, a virtual mesh mapped one-to-one onto physical device ids.
- `placement`: `place`, the pure placement heuristic.
- `manager`: `ResourceManager`, the thread-safe state (inventory, slices, loads).
"""

from resource_manager.cluster import (
    ClusterSpec,
    HostSpec,
    IslandSpec,
    default_cluster,
    load_cluster,
)
from resource_manager.discovery import cluster_from_nodes, joined_hosts
from resource_manager.inventory import Device, DeviceReport
from resource_manager.manager import ResourceManager
from resource_manager.placement import Choice, place
from resource_manager.slices import Slice

__all__ = [
    "Choice",
    "ClusterSpec",
    "Device",
    "DeviceReport",
    "HostSpec",
    "IslandSpec",
    "ResourceManager",
    "Slice",
    "cluster_from_nodes",
    "default_cluster",
    "joined_hosts",
    "load_cluster",
    "place",
]
