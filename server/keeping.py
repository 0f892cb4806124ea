"""Values read off hosts before their executors are replaced, so that they are not lost.

Contract:
- `keep_values(buffers, lineage, pool, timeout_s, hosts)` asks each of these hosts
  (`Host.keep`, which takes no turn: a host whose dispatch is held by a computation that
  does not end still answers) for the buffers the server knows there, computed and not lost,
  and keeps each value that every host holding it gave as an upload's bytes in lineage
  (`Lineage.keep`). Once the executors are replaced and the values lost, reading one puts it
  again (`server.remake`), as for an upload: a buffer survives its host's replacement even
  where nothing else of its lineage is kept (after a server restart, say). A buffer kept as
  an upload already is not asked for.
- The values kept are bounded by the lineage's bytes (`lineage_mb`) in all, the hosts asked
  one at a time; what is past the bound, still computing, or on a host that does not answer
  within `timeout_s` (`health_timeout_s`) is lost as before. Returns how many values were
  kept, and of how many asked for.
- Used where a host is replaced while it still answers: a run that would not stop, a broken
  collective group (`server.healing`). A lost host cannot answer; an operator's restart
  drops the values on purpose.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Sequence

from executors import ExecutorPool
from executors.shards import Index, assemble
from ir import IsthmusError, parse_dtype
from server.buffers import Buffers
from server.lineage import Lineage, Upload

log = logging.getLogger("isthmus.server")


async def keep_values(buffers: Buffers, lineage: Lineage, pool: ExecutorPool, timeout_s: float,
                      hosts: Sequence[str]) -> tuple[int, int]:
    budget = lineage.max_bytes
    shards: defaultdict[str, list[tuple[Index, bytes]]] = defaultdict(list)
    gave: defaultdict[str, set[str]] = defaultdict(set)  # buffer id -> the hosts that gave it
    records, lost = buffers.records, buffers.lost
    asked = {b: rec for b, rec in records.items()
             if b not in lost and b not in lineage.uploads and set(rec.hosts) & set(hosts)}
    for h in hosts:
        wanted = [b for b, rec in asked.items() if h in rec.hosts]
        if not wanted or budget <= 0:
            continue
        try:
            got = await pool.keep(h, wanted, budget, timeout_s)
        except IsthmusError as e:
            log.warning("host %s: its values could not be read before its executor is replaced: %s", h, e)
            continue
        for b, parts in got.items():
            shards[b] += parts
            gave[b].add(h)
            budget -= sum(len(data) for _, data in parts)
    kept = 0
    for b, parts in shards.items():
        rec = asked[b]
        if records.get(b) is not rec or b in lost or not gave[b].issuperset(rec.hosts):
            continue  # released meanwhile (its id taken again, perhaps), or not given by every host
        shape = rec.aval.shape
        if len(parts) == 1 and [tuple(i) for i in parts[0][0]] == [(0, n) for n in shape]:
            data = parts[0][1]  # one shard, the whole value (not copied again)
        else:
            data = assemble(shape, parse_dtype(rec.aval.dtype), parts).tobytes()
        lineage.keep(b, Upload(data, rec.slice_id, rec.aval, rec.spec), rec.owner)
        kept += 1
    return kept, len(asked)
