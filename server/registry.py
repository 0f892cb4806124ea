"""The server's records, kept in memory for reading and written through to a `Store`.

Contract:
- The registry is what survives a server restart: clients (their names, weights and secret
  digests), slices, buffers (where they live, what they hold), which buffers are lost and
  why, computations with their artifacts, programs in their wire form, how many
  registrations hold each (and what they said, so that the same registered again after
  a restart finds it), and the server's own notes (`meta`: the executors' actor names,
  the cluster they were started for).
- Every change goes through one method here, which queues it for the store; `flush`
  commits what is queued (the server calls it before answering any request, `server.guard`,
  and it runs by itself just after the event loop's turn for changes no request made, a
  host lost say, once what the turn queued for the executors has left). A commit the store
  refuses (`Unwritable`: a full disk) keeps its changes queued for the next; `unwritten`
  says why meanwhile. Readers use the dicts directly. Nothing here dispatches, places or
  talks to a host: that is the dispatcher's (`server.service`, `server.programs`).
- `load` reads everything back, oldest first, as records whose sets (a client's buffers,
  computations, programs) are rebuilt from the owners stored with each.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from ir import Aval, IsthmusError, Spec
from resource_manager import Slice
from server.records import BufferRecord, ClientRecord, ComputationRecord
from server.store import Row, Store, Unwritable

if TYPE_CHECKING:
    from server.program_record import ProgramRecord

log = logging.getLogger("isthmus.server")
T = TypeVar("T")

CLIENT, SLICE, BUFFER, LOST, COMPUTATION, PROGRAM, HOLDS, META = (
    "client", "slice", "buffer", "lost", "computation", "program", "holds", "meta")


class Registry:
    def __init__(self, store: Store) -> None:
        self._store = store
        self.clients: dict[str, ClientRecord] = {}
        self.total_weight = 0.0  # the open clients' weights together
        self.buffers: dict[str, BufferRecord] = {}
        self.computations: dict[str, ComputationRecord] = {}
        self.lost: dict[str, str] = {}  # buffer id -> why its value is gone
        self._flush_soon = False
        self.unwritten: str | None = None  # why the last commit failed, if it did

    @property
    def store(self) -> Store:
        """The store, for a write: committed by `flush`, or at the end of this loop turn."""
        if not self._flush_soon:
            try:
                loop = asyncio.get_running_loop()
                # After what this turn scheduled, not before it: the run messages and deletes
                # it queued for the executors leave first, and the commit (tens to hundreds
                # of µs) overlaps their work instead of delaying it. Every request is still
                # answered after its changes are committed.
                loop.call_soon(loop.call_soon, self.flush)
                self._flush_soon = True
            except RuntimeError:  # no event loop (start-up, tests): `flush` is called later
                pass
        return self._store

    def flush(self) -> None:
        """Commit every queued change (before a request is answered). A commit that fails
        (the state dir's disk is full, say) keeps them queued for the next one: what the
        server holds is what it answered for, and it is written once the disk lets it."""
        self._flush_soon = False
        try:
            self._store.flush()
        except Unwritable as e:
            if self.unwritten is None:
                log.error("cannot write the state (kept in memory, written once it can): %s", e)
            self.unwritten = str(e)
        else:
            if self.unwritten is not None:
                log.warning("the state is written again (after: %s)", self.unwritten)
            self.unwritten = None

    def close(self) -> None:
        self._store.close()

    # -- clients -----------------------------------------------------------------------------

    def add_client(self, rec: ClientRecord) -> None:
        self.store.put([Row(CLIENT, rec.id, rec.id, {"name": rec.name, "weight": rec.weight,
                                                     "key": rec.key.hex()})])
        self.clients[rec.id] = rec
        self._weigh()

    def remove_client(self, rec: ClientRecord) -> None:
        """The client and every record it owned (the caller has freed them)."""
        self.store.delete_owner(rec.id)
        self.clients.pop(rec.id, None)
        self._weigh()

    def weight(self, client_id: str) -> float:
        """An open client's weight; 0 for one closed."""
        rec = self.clients.get(client_id)
        return 0.0 if rec is None else rec.weight

    def _weigh(self) -> None:
        self.total_weight = math.fsum(c.weight for c in self.clients.values())

    # -- slices ------------------------------------------------------------------------------

    def add_slice(self, s: Slice) -> None:
        self.store.put([Row(SLICE, s.id, s.owner, s.to_json())])

    def remove_slices(self, slice_ids: Iterable[str]) -> None:
        self.store.delete(SLICE, slice_ids)

    # -- buffers -----------------------------------------------------------------------------

    def add_buffers(self, owner: ClientRecord, recs: Sequence[BufferRecord]) -> None:
        self.store.put([Row(BUFFER, r.id, r.owner, _buffer_doc(r)) for r in recs])
        for r in recs:
            self.buffers[r.id] = r
            owner.buffers.add(r.id)
            owner.buffer_bytes += r.aval.nbytes

    def remove_buffers(self, owner: ClientRecord, buffer_ids: Sequence[str]) -> None:
        gone = [b for b in buffer_ids if b in owner.buffers]
        self.store.delete(BUFFER, gone)
        self.store.delete(LOST, [b for b in gone if b in self.lost])
        for b in gone:
            owner.buffers.discard(b)
            owner.buffer_bytes -= self.buffers.pop(b).aval.nbytes
            self.lost.pop(b, None)

    def unlose(self, buffer_ids: Sequence[str]) -> None:
        """These buffers are being made again (`server.remake`)."""
        self.store.delete(LOST, buffer_ids)
        for b in buffer_ids:
            self.lost.pop(b, None)

    def lose(self, buffer_ids: Sequence[str], why: str) -> None:
        """These buffers' values are gone: reading one says why."""
        self.store.put([Row(LOST, b, self.buffers[b].owner, {"why": why}) for b in buffer_ids])
        self.lost.update(dict.fromkeys(buffer_ids, why))

    # -- computations and programs -----------------------------------------------------------

    def add_computation(self, owner: ClientRecord, rec: ComputationRecord) -> None:
        self.store.put([Row(COMPUTATION, rec.id, rec.owner, _computation_doc(rec), rec.artifact)])
        self.computations[rec.id] = rec
        owner.computations.add(rec.id)
        owner.stored[rec.id] = len(rec.artifact)

    def remove_computation(self, owner: ClientRecord, computation_id: str) -> bool:
        self.store.delete(COMPUTATION, [computation_id])
        owner.computations.discard(computation_id)
        owner.stored.pop(computation_id, None)
        return self.computations.pop(computation_id, None) is not None

    def hold(self, owner: ClientRecord, said: bytes, record_id: str) -> None:
        """A registration answered with `record_id` (`ClientRecord.hold`)."""
        owner.hold(said, record_id)
        self._holds(owner, [record_id])

    def let_go(self, owner: ClientRecord, record_ids: Sequence[str]) -> list[str]:
        """Registrations forgotten (`ClientRecord.forgotten`): the ids none holds any more,
        for the caller to remove (`unregister`)."""
        gone = owner.forgotten(record_ids)
        self._holds(owner, [r for r in dict.fromkeys(record_ids) if r in owner.holds])
        return gone

    def unregister(self, owner: ClientRecord, record_ids: Sequence[str]) -> None:
        self.store.delete(HOLDS, record_ids)
        owner.unregister(record_ids)

    def _holds(self, owner: ClientRecord, record_ids: Sequence[str]) -> None:
        """Store the counts of these (held) records, each with what its registration said."""
        wanted = set(record_ids)
        said = {r: k for k, r in owner.registered.items() if r in wanted} if wanted else {}
        self.store.put([Row(HOLDS, r, owner.id, {"n": owner.holds[r], "said": said[r].hex()})
                        for r in record_ids if r in said])

    def add_program(self, owner: ClientRecord, rec: ProgramRecord, wire: bytes) -> None:
        """`wire`: the program's wire form as JSON, serialized off the event loop (a program
        may be tens of MB)."""
        self.store.put([Row(PROGRAM, rec.id, rec.owner, {"name": rec.name, "fuse": rec.fuse}, wire)])
        owner.stored[rec.id] = len(wire)
        owner.programs.add(rec.id)

    def remove_programs(self, owner: ClientRecord, program_ids: Sequence[str]) -> None:
        self.store.delete(PROGRAM, program_ids)
        owner.programs.difference_update(program_ids)
        for p in program_ids:
            owner.stored.pop(p, None)

    # -- the server's own notes --------------------------------------------------------------

    def meta(self, name: str) -> dict[str, Any] | None:
        return next((r.doc for r in self._store.load(META) if r.id == name), None)

    def set_meta(self, name: str, doc: dict[str, Any]) -> None:
        self.store.put([Row(META, name, "", doc)])

    # -- reading back ------------------------------------------------------------------------

    def load(self) -> Loaded:
        """Everything stored, as records (the dicts filled); slices and programs are the
        dispatcher's to restore."""
        for row, (name, weight, key) in self._readable(CLIENT, _client):
            self.clients[row.id] = ClientRecord(row.id, name, weight, key)
        self._weigh()
        for row, rec in self._readable(BUFFER, _buffer):
            if (owner := self.clients.get(row.owner)) is not None:
                self.buffers[rec.id] = rec
                owner.buffers.add(rec.id)
                owner.buffer_bytes += rec.aval.nbytes
        self.lost.update({r.id: why for r, why in self._readable(LOST, lambda r: str(r.doc["why"]))
                          if r.id in self.buffers})
        for row, comp in self._readable(COMPUTATION, _computation):
            if (owner := self.clients.get(row.owner)) is not None:
                self.computations[row.id] = comp
                owner.computations.add(row.id)
                owner.stored[row.id] = len(row.data)
        for row, (n, said) in self._readable(HOLDS, _holds):
            if (owner := self.clients.get(row.owner)) is not None:
                owner.holds[row.id] = n
                owner.registered[said] = row.id
        known = self.clients
        slices = [s for r, s in self._readable(SLICE, lambda r: Slice.from_json(r.doc)) if r.owner in known]
        programs = []
        for r, p in self._readable(PROGRAM, _program):
            if r.owner in known:  # (one that is not restored is removed, and uncounted)
                programs.append((r.id, r.owner, *p))
                known[r.owner].stored[r.id] = len(r.data) or len(json.dumps(r.doc))
        return Loaded(slices, programs)

    def _readable(self, kind: str, parse: Callable[[Row], T]) -> Iterator[tuple[Row, T]]:
        """Each stored row of `kind` that reads back, parsed. One that does not (written by
        another version of Isthmus, or damaged) is logged and skipped, left in the store: it
        must not keep the server from starting with everything else."""
        for row in self._store.load(kind):
            try:
                parsed = parse(row)
            except (KeyError, TypeError, ValueError, IsthmusError) as e:
                log.error("stored %s %s cannot be read, skipped: %s: %s", kind, row.id, type(e).__name__, e)
                continue
            yield row, parsed


class Loaded:
    """What `Registry.load` leaves to the dispatcher: slices to place again, and programs
    (id, owner, name, fuse, wire form) to lower again."""

    def __init__(self, slices: list[Slice], programs: list[tuple[str, str, str, bool, Any]]) -> None:
        self.slices = slices
        self.programs = programs


def _buffer_doc(r: BufferRecord) -> dict[str, Any]:
    return {"slice": r.slice_id, "hosts": list(r.hosts), "aval": r.aval.to_json(), "spec": r.spec.to_json()}


def _client(row: Row) -> tuple[str, float, bytes]:
    d = row.doc
    return str(d["name"]), float(d["weight"]), bytes.fromhex(d["key"])


def _holds(row: Row) -> tuple[int, bytes]:
    return int(row.doc["n"]), bytes.fromhex(row.doc["said"])


def _program(row: Row) -> tuple[str, bool, Any]:
    wire = row.doc["program"] if "program" in row.doc else json.loads(row.data)  # (older rows: in the doc)
    return str(row.doc["name"]), bool(row.doc["fuse"]), wire


def _buffer(row: Row) -> BufferRecord:
    d = row.doc
    return BufferRecord(row.id, row.owner, d["slice"], tuple(d["hosts"]), Aval.from_json(d["aval"]),
                        Spec.from_json(d["spec"]))


def _computation_doc(r: ComputationRecord) -> dict[str, Any]:
    return {"slice": r.slice_id, "name": r.name,
            "in_avals": [a.to_json() for a in r.in_avals], "out_avals": [a.to_json() for a in r.out_avals],
            "in_specs": [s.to_json() for s in r.in_specs], "out_specs": [s.to_json() for s in r.out_specs]}


def _computation(row: Row) -> ComputationRecord:
    d = row.doc
    return ComputationRecord(
        row.id, row.owner, d["slice"], d["name"],
        tuple(Aval.from_json(a) for a in d["in_avals"]), tuple(Aval.from_json(a) for a in d["out_avals"]),
        tuple(Spec.from_json(s) for s in d["in_specs"]), tuple(Spec.from_json(s) for s in d["out_specs"]),
        artifact=row.data)

