"""What a pool starts with (`ExecutorPool.start`): Ray joined, the islands known, and one
executor per host, taken over from a previous server or new.

Contract:
- A Ray this process has already joined is used as it is (whoever joined it chose how);
  otherwise `ray_start.connect` joins or starts one, and the pool undoes that at shutdown.
- With no cluster spec, the islands are those the Ray nodes' labels name
  (`cluster_from_nodes`, each executor pinned to its node; the pool may grow); with none
  labelled, the default shape, placed wherever Ray likes.
- Executors a previous server left are taken over (`RayOptions.adopt`, `executors.adoption`)
  or killed; new ones get a generation above every one found (their names are reused).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import ray

from executors import adoption, ray_start
from executors.links import new_executor
from executors.messages import Adopted
from executors.options import RayOptions
from resource_manager import ClusterSpec, HostSpec, cluster_from_nodes, default_cluster
from resource_manager.discovery import ISLAND_LABEL

log = logging.getLogger("isthmus.executors")
TAKEN_OVER_CAUSE = "the server that sent this run stopped before it finished"


@dataclass(frozen=True)
class Start:
    joined: ray_start.Connection | None  # how this process joined Ray (None: it had already)
    spec: ClusterSpec
    discovered: bool  # the islands came from the Ray nodes' labels
    specs: dict[str, HostSpec]  # host -> its spec
    groups: dict[str, tuple[str, ...]]  # island -> its hosts, for islands that are one JAX group
    generation: int  # of the executors started now
    handles: dict[str, Any]  # host -> its executor's actor
    adopted: dict[str, Adopted]  # hosts whose executors were taken over, with what they hold


async def begin(spec: ClusterSpec | None, options: RayOptions) -> Start:
    """Join Ray, know the islands, and have one executor per host (see the module)."""
    joined = None if ray.is_initialized() else ray_start.connect(
        options.address, namespace=options.namespace, num_cpus=options.num_cpus,
        object_store_bytes=options.object_store_bytes, token_file=options.token_file,
        insecure=options.insecure, daemon_dir=options.daemon_dir,
        orphan_timeout_s=options.orphan_timeout_s)
    discovered = spec is None
    if spec is None:
        spec = cluster_from_nodes(ray.nodes())
        discovered = spec is not None
        if spec is None:
            log.warning("no Ray node is labelled %s: the default islands, placed wherever Ray "
                        "likes (docs/kubernetes.md, \"Labels\")", ISLAND_LABEL)
            spec = default_cluster()
    specs = {h.name: h for _, h in spec.hosts()}
    groups = spec.groups() if options.groups else {}
    newest, names = adoption.found(options.namespace)
    generation = 1 + max((g for g, _ in newest.values()), default=-1)
    taken = await adoption.take_over(
        {h: name for h, (_, name) in newest.items() if h in specs}, options.namespace, groups,
        TAKEN_OVER_CAUSE, options.group_timeout_s) if options.adopt else {}
    adoption.kill((n for n in names if n not in {newest[h][1] for h in taken}), options.namespace)
    handles = {name: taken[name][0] if name in taken else
               new_executor(host, specs.values(), options, generation) for name, host in specs.items()}
    return Start(joined, spec, discovered, specs, dict(groups), generation, handles,
                 {h: adopted for h, (_, adopted) in taken.items()})
