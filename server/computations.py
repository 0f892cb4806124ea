"""Computations: a client's `jax.export` artifact registered for one of its slices, and calls.

Contract:
- `register` reads the artifact (`server.readers`, in the client's turn), checks the
  declared specs against it and the slice, and answers once its call program is compiled
  on its hosts (`server.programs`, `server.program_record.compiled`). The same artifact,
  slice, specs and name registered again by the client is the computation it has already,
  unless that one failed to compile (nothing is read or compiled again, and the quota
  counts it once).
- `get` finds one of the caller's computations; another client's reads exactly like a
  missing one. `call` queues a run of its one-node program (`Programs.call`).
- `delete` forgets computations (ids not the client's are skipped: idempotent); `forget`
  counts registrations let go of, and deletes those none holds any more. Calls already
  queued still run; hosts forget executables nothing else uses once they have.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ir import NotFound
from server.artifacts import declared_specs, decode_artifact, registration_digest
from server.program_record import compiled
from server.programs import Programs
from server.quotas import Quotas
from server.readers import Readers
from server.records import BufferRecord, ClientRecord, ComputationRecord, new_id
from server.registry import Registry
from server.slices import Slices
from server.states import Failed


class Computations:
    def __init__(self, registry: Registry, quotas: Quotas, slices: Slices, readers: Readers,
                 programs: Programs) -> None:
        self._registry = registry
        self._quotas = quotas
        self._slices = slices
        self._readers = readers
        self._programs = programs
        self.records = registry.computations

    async def register(self, owner: ClientRecord, slice_id: str, artifact_b64: str,
                       in_specs: list[Any], out_specs: list[Any], name: str) -> ComputationRecord:
        s = self._slices.get(owner, slice_id)
        # In proportion to the artifact's size (tens of MB at most): off the event loop too.
        said = await asyncio.to_thread(registration_digest, artifact_b64,
                                       [slice_id, in_specs, out_specs, name])
        known = self.records.get(owner.registered.get(said, ""))
        if known is not None and not isinstance(known.status, Failed):
            self._registry.hold(owner, said, known.id)
            return known  # (one that failed to compile, on a host since lost perhaps, is tried anew)
        self._quotas.check("computations", len(owner.computations), 1)
        # Decoding and reading the artifact take time in proportion to its size: off the
        # event loop, which meanwhile serves every other request.
        artifact = await asyncio.to_thread(decode_artifact, artifact_b64)
        info = await self._readers.read(owner.id, artifact, s.mesh, self._slices.platform(s))
        s = self._slices.get(owner, slice_id)  # still there, and still the caller's, after the wait
        self._quotas.check("computations", len(owner.computations), 1)
        self._quotas.check("stored_bytes", owner.stored_bytes, len(artifact), " bytes",
                           " (the artifact, kept in the state dir)")
        ins = declared_specs(in_specs, info.in_avals, s, "in_specs")
        outs = declared_specs(out_specs, info.out_avals, s, "out_specs")
        info.check_specs(ins, outs, "")
        self._slices.mesh(s)  # its devices can be named (a slice spanning hosts needs their JAX group)
        rec = ComputationRecord(new_id("c"), owner.id, s.id, name or "computation",
                                info.in_avals, info.out_avals, ins, outs, artifact=artifact)
        call = self._programs.add_computation(rec, owner)  # lowered, held on its hosts and compiled there
        self._registry.add_computation(owner, rec)
        self._registry.hold(owner, said, rec.id)
        await compiled(call)  # (answered once compiled: see `server.program_record.compiled`)
        return rec

    def get(self, owner: ClientRecord, computation_id: str) -> ComputationRecord:
        rec = self.records.get(computation_id)
        if rec is None or rec.owner != owner.id:
            raise NotFound(f"computation {computation_id!r} does not exist")
        return rec

    def call(self, owner: ClientRecord, computation_id: str, inputs: Sequence[str],
             ids: Sequence[str] | None = None) -> list[BufferRecord]:
        return self._programs.call(owner, self.get(owner, computation_id), inputs, ids)

    def on_slice(self, owner: ClientRecord, slice_id: str) -> list[str]:
        """The client's computations on the slice."""
        return [c for c in owner.computations if self.records[c].slice_id == slice_id]

    def delete(self, owner: ClientRecord, computation_ids: Sequence[str]) -> None:
        """Forget computations the client no longer calls; an id not among its computations
        is skipped (deleting is idempotent). Calls already queued still run."""
        self.drop(owner, [c for c in computation_ids if c in owner.computations])

    def forget(self, owner: ClientRecord, computation_ids: Sequence[str]) -> None:
        """Registrations the client let go of (an id once for each): a computation goes once
        none holds it (`delete`)."""
        self.delete(owner, self._registry.let_go(owner, computation_ids))

    def drop(self, owner: ClientRecord, computation_ids: Sequence[str]) -> None:
        """Forget these computations; hosts forget executables nothing else uses, once the
        calls queued before have run."""
        for cid in computation_ids:
            if self._registry.remove_computation(owner, cid):
                self._programs.forget_calls(cid)
        self._registry.unregister(owner, computation_ids)
