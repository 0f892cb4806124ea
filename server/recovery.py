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
from typing import TYPE_CHECKING

from executors.messages import Adopted, State
from ir import IsthmusError
from server.registry import Loaded

if TYPE_CHECKING:
    from server.service import Service

log = logging.getLogger("isthmus.server")

GONE = "the server restarted, and the executors holding its value did not survive it"
UNFINISHED = ("the server restarted before the computation producing it had finished "
              "(it was in flight or queued); run it again")


def restore(service: Service, loaded: Loaded, adopted: Mapping[str, Adopted]) -> None:
    """Bring the registry's records back into the dispatcher (see the module docstring)."""
    registry, rm = service.registry, service.rm
    for rec in service.clients.values():
        service.credentials.restore(rec.key, rec.id)
        service.gangs.set_weight(rec.id, rec.weight)
    gone_slices = set()
    for s in loaded.slices:
        try:
            rm.restore_slice(s)
        except IsthmusError as e:
            log.error("slice %s of client %s is dropped: %s", s.id, s.owner, e)
            gone_slices.add(s.id)
    registry.remove_slices(gone_slices)
    for comp in list(service.computations.values()):
        try:
            if comp.slice_id in gone_slices:
                raise IsthmusError(f"its slice {comp.slice_id} is gone")
            service.programs.add_computation(comp)
        except IsthmusError as e:
            log.error("computation %s of client %s is dropped: %s", comp.id, comp.owner, e)
            registry.remove_computation(service.clients[comp.owner], comp.id)
    for program_id, owner, name, fuse, doc in loaded.programs:
        try:
            service.programs.restore(service.clients[owner], program_id, name, fuse, doc)
        except IsthmusError as e:
            log.error("program %s of client %s is dropped: %s", program_id, owner, e)
            registry.remove_programs(service.clients[owner], [program_id])
    _buffers(service, adopted, gone_slices)


def _buffers(service: Service, adopted: Mapping[str, Adopted], gone_slices: set[str]) -> None:
    gone, unfinished = [], []
    for b, rec in service.buffers.items():
        try:  # its bytes on its hosts, lost or not (`server.host_memory`)
            s = service.rm.get_slice(rec.slice_id)
            service.memory.charge(b, service.memory.footprint(s, rec.aval, rec.spec), rec.owner)
        except IsthmusError:  # its slice is gone: it holds nothing
            gone_slices.add(rec.slice_id)
        if b in service.lost:
            continue
        if rec.slice_id in gone_slices or not all(h in adopted for h in rec.hosts):
            gone.append(b)
            continue
        states = [adopted[h].states.get(b, State.MISSING) for h in rec.hosts]
        if State.FAILED not in states and any(s is not State.READY for s in states):
            unfinished.append(b)
    service.registry.lose(gone, GONE)
    service.registry.lose(unfinished, UNFINISHED)
    for host, held in adopted.items():
        free = [b for b in held.states if b not in service.buffers or b in service.lost]
        service.pool.delete(host, free)
    if not (service.clients or adopted):  # a first start: nothing to carry on with
        return
    log.warning("restarted: %d clients, %d buffers (%d lost now: %d with their executors, %d unfinished), "
                "%d computations, %d programs; %d hosts taken over", len(service.clients),
                len(service.buffers), len(gone) + len(unfinished), len(gone), len(unfinished),
                len(service.computations), len(service.programs.records), len(adopted))
