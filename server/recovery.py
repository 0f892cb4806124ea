"""A restarted server carries on from its records and the executors it took over.

Contract:
- Clients keep their ids and secrets, slices their devices, computations and programs their
  ids; computations and programs are lowered again and compiled on their hosts (a host
  taken over still holds the executables: compiling one again costs nothing).
- A buffer reads back unchanged where every host holding it was taken over and holds it
  computed. Else it is lost, and reading it says why: its executors did not survive the
  restart, or the computation producing it had not finished (it was in flight, or queued
  on the server, when the old server stopped). A buffer that had failed keeps its cause.
- Values the executors hold that no record names (a request the old server had not
  answered) are freed, as are those of buffers lost here.
- Every buffer whose slice is restored counts on its hosts' memory again, lost or not.
- A record that can no longer be restored (a slice whose devices the cluster no longer
  has, say) is dropped with a log line; its buffers read as lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from executors import ExecutorPool
from executors.messages import Adopted, State
from ir import IsthmusError
from resource_manager import ResourceManager
from server.clients import Clients
from server.host_memory import HostMemory
from server.programs import Programs
from server.registry import Loaded, Registry

log = logging.getLogger("isthmus.server")

GONE = "the server restarted, and the executors holding its value did not survive it"
UNFINISHED = ("the server restarted before the computation producing it had finished "
              "(it was in flight or queued); run it again")


def restore(loaded: Loaded, adopted: Mapping[str, Adopted], *, registry: Registry, rm: ResourceManager,
            clients: Clients, programs: Programs, memory: HostMemory, pool: ExecutorPool) -> None:
    """Bring the registry's records back into the dispatcher (see the module docstring)."""
    clients.restore()
    gone_slices = set()
    for s in loaded.slices:
        try:
            rm.restore_slice(s)
        except IsthmusError as e:
            log.error("slice %s of client %s is dropped: %s", s.id, s.owner, e)
            gone_slices.add(s.id)
    registry.remove_slices(gone_slices)
    for comp in list(registry.computations.values()):
        owner = registry.clients[comp.owner]
        try:
            if comp.slice_id in gone_slices:
                raise IsthmusError(f"its slice {comp.slice_id} is gone")
            programs.add_computation(comp, owner)
        except IsthmusError as e:
            log.error("computation %s of client %s is dropped: %s", comp.id, comp.owner, e)
            registry.remove_computation(owner, comp.id)
    for program_id, owner_id, name, fuse, doc in loaded.programs:
        try:
            programs.restore(registry.clients[owner_id], program_id, name, fuse, doc)
        except IsthmusError as e:
            log.error("program %s of client %s is dropped: %s", program_id, owner_id, e)
            registry.remove_programs(registry.clients[owner_id], [program_id])
    gone, unfinished = _buffers(registry, rm, memory, pool, adopted, gone_slices)
    if not (registry.clients or adopted):  # a first start: nothing to carry on with
        return
    log.warning("restarted: %d clients, %d buffers (%d lost now: %d with their executors, %d unfinished), "
                "%d computations, %d programs; %d hosts taken over", len(registry.clients),
                len(registry.buffers), gone + unfinished, gone, unfinished,
                len(registry.computations), len(programs.records), len(adopted))


def _buffers(registry: Registry, rm: ResourceManager, memory: HostMemory, pool: ExecutorPool,
             adopted: Mapping[str, Adopted], gone_slices: set[str]) -> tuple[int, int]:
    """Lose the buffers whose values did not survive; how many (with their executors, unfinished)."""
    gone, unfinished = [], []
    for b, rec in registry.buffers.items():
        try:  # its bytes on its hosts, lost or not (`server.host_memory`)
            s = rm.get_slice(rec.slice_id)
            memory.charge(b, memory.footprint(s, rec.aval, rec.spec), rec.owner)
        except IsthmusError:  # its slice is gone: it holds nothing
            gone_slices.add(rec.slice_id)
        if b in registry.lost:
            continue
        if rec.slice_id in gone_slices or not all(h in adopted for h in rec.hosts):
            gone.append(b)
            continue
        states = [adopted[h].states.get(b, State.MISSING) for h in rec.hosts]
        if State.FAILED not in states and any(s is not State.READY for s in states):
            unfinished.append(b)
    registry.lose(gone, GONE)
    registry.lose(unfinished, UNFINISHED)
    for host, held in adopted.items():
        free = [b for b in held.states if b not in registry.buffers or b in registry.lost]
        pool.delete(host, free)
    return len(gone), len(unfinished)
