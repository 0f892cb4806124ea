"""Hosts that join after start: Ray nodes labelled for an island become hosts of it.

Contract: `watch_nodes(pool, rm, gangs, poll_s)` runs for as long as the server does,
where its islands came from the Ray nodes' labels (`ExecutorPool.discovered`; a cluster
file fixes the islands). Every `poll_s` (`node_poll_s`) seconds it asks the pool for live
labelled nodes that no host runs on (`ExecutorPool.joined`) and, for each, starts an
executor pinned to the node (`ExecutorPool.add_host`) and adds the host to the resource
manager, where `GET /v1/devices` shows it and new slices may use it. On an island that is
one JAX group the host is `solo`: slices on it hold it alone until the island next
restarts, when the group forms again with it (a group's size is fixed when it forms;
re-forming it at once would drop every value on the island). A node with a label for a new
island makes that island, with a gang scheduler of its own. A node refused (bad labels,
another platform than its island's) is logged once; a host that fails to start is logged
and tried again at the next poll. A node that leaves is a host failure, handled as any
other (`server.healing`).
"""

from __future__ import annotations

import asyncio
import logging

from executors import ExecutorPool
from resource_manager import ResourceManager
from server.gang import Gangs

log = logging.getLogger("isthmus.server")


async def watch_nodes(pool: ExecutorPool, rm: ResourceManager, gangs: Gangs, poll_s: float) -> None:
    refused: set[str] = set()
    while True:
        await asyncio.sleep(poll_s)
        try:
            await join_nodes(pool, rm, gangs, refused)
        except Exception:  # never let one bad poll stop the watch
            log.exception("looking for Ray nodes that joined failed")


async def join_nodes(pool: ExecutorPool, rm: ResourceManager, gangs: Gangs, refused: set[str]) -> list[str]:
    """Make hosts of the labelled nodes that joined since the last look; their names."""
    joined, why = await asyncio.to_thread(pool.joined)
    for node, reason in why.items():
        if node not in refused:
            refused.add(node)
            log.warning("Ray node %s is not taken as a host: %s", node, reason)
    added = []
    for island, host in joined:
        try:
            report = await pool.add_host(island, host)
        except Exception as e:
            log.warning("host %s (Ray node %s, island %s) did not start: %s", host.name, host.node, island, e)
            continue
        new_island = island not in rm.islands()
        rm.add_host(island, host, report, solo=island in pool.groups)
        if new_island:
            gangs.add_island(island)
        added.append(host.name)
        log.warning("host %s (Ray node %s) joined island %s%s", host.name, host.node, island,
                    " (new)" if new_island else "")
    return added
