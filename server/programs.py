"""Programs: register an IR program once, keep it and its computations' call programs, run them.

Contract:
- Registration checks everything a run could trip on, and answers 4xx naming it: the wire
  form, the verifier, each slice (the caller's, with the declared mesh and island), each
  computation's artifact against its declared avals, and the lowering itself. A program
  that could not fit the client's buffer quota even alone is refused (`server.runs.holds`).
  Fusing adjacent computations on one slice is the program's choice (default: the
  server's `fuse` setting). Lowering and compiling are `server.lowerings`'.
- A call of a registered computation is a run of its one-node program (`server.calls`),
  one per computation and input types (slices and specs), kept here beside the programs
  but not counted as the client's: registering the computation lowers and compiles the one
  whose inputs are where the computation declares them, and its compile status is the
  computation's.
- Runs and calls are queued by `server.runs`; an input that was lost is made again first
  (`usable`, `server.remake`). `repeat` runs a record again for lineage recovery, even one
  forgotten since.
- Forgetting a program (or a computation's call programs) is at once for new runs; its
  hosts forget its plans and executables once the runs queued before have run.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Callable, Sequence
from typing import Any

from ir import ComputeAttrs, InvalidArgument, NotFound, Program, Type, from_wire, graph_signature, verify
from resource_manager import Slice
from server.artifacts import ArtifactInfo
from server.buffers import Buffers
from server.calls import InputType, call_program
from server.gang import Gangs
from server.lowerings import Lowered, Lowerings
from server.program_record import ProgramRecord, compiled, record_key, runnable
from server.quotas import Quotas
from server.readers import Readers
from server.records import BufferRecord, ClientRecord, ComputationRecord, new_id
from server.registry import Registry
from server.remake import Remaker
from server.runs import Dispatch, Runs, holds
from server.slices import Slices
from server.states import Failed

CALL_PROGRAMS_KEPT = 8  # per computation: input types it was called with (newest kept)


class Programs:
    def __init__(self, registry: Registry, quotas: Quotas, max_computations: int, slices: Slices,
                 buffers: Buffers, readers: Readers, lowerings: Lowerings, runs: Runs, remaker: Remaker,
                 gangs: Gangs) -> None:
        self._registry = registry
        self._quotas = quotas
        self._max_computations = max_computations  # distinct ones in one program
        self._slices = slices
        self._buffers = buffers
        self._readers = readers
        self._lowerings = lowerings
        self._runs = runs
        self._remaker = remaker
        self._gangs = gangs
        self.records: dict[str, ProgramRecord] = {}
        # computation id -> input types -> its call program (`server.calls`)
        self.calls: dict[str, dict[tuple[InputType, ...], ProgramRecord]] = {}
        # records forgotten, run again for lineage (`repeat`) and not yet run: by identity
        self._retired: dict[int, ProgramRecord] = {}

    # -- registration ------------------------------------------------------------------------

    async def register(self, owner: ClientRecord, doc: Any, name: str, fuse: bool = False) -> ProgramRecord:
        """Check, lower and register a program. Reading the document, its artifacts and
        lowering it take time in proportion to its size: they run off the event loop, and
        what they depend on (the caller's slices, its quota) is checked again after."""
        name = name or "program"
        program, said, wire = await asyncio.to_thread(_parse, doc, name, fuse)
        known = self.records.get(owner.registered.get(said, ""))
        if known is not None and known.owner == owner.id and not isinstance(known.status, Failed):
            self._registry.hold(owner, said, known.id)
            return known  # the same program registered again (traced anew in a loop, say)
        self._check_room(owner, wire)
        self._check_slices(owner, program)
        targets = {d.name: self._slices.get(owner, d.name) for d in program.slices}
        executables = {(a.artifact, a.slice) for a in _computes(program)}
        # each is compiled on its hosts, ahead of their other work
        if len(executables) > self._max_computations:
            raise InvalidArgument(f"program: {len(executables)} distinct computations (artifact and slice "
                                  f"pairs), more than max_program_computations ({self._max_computations})")
        infos = await self._read_artifacts(owner, program, targets)
        self._check_slices(owner, program)
        self._quotas.check("programs", len(owner.programs), 1)
        _check_artifacts(program, infos)
        self._check_room(owner, wire)
        args, results = graph_signature(program.graph, program.slice_table,
                                        frozenset(program.artifact_table))
        rec = ProgramRecord(new_id("p"), owner.id, name, program, args, results, fuse)
        key = self._lowerings.placements(owner, program)
        lowered = await asyncio.to_thread(self._lowerings.lower, rec, key)
        holds(rec, lowered[1], self._quotas.buffer_bytes)
        self._check_slices(owner, program)
        if key == self._lowerings.placements(owner, program):  # else it is lowered again at its first run
            self._lowerings.keep(rec, key, lowered)
        self._registry.add_program(owner, rec, wire)
        self.records[rec.id] = rec
        self._registry.hold(owner, said, rec.id)
        await compiled(rec)
        return rec

    def _check_room(self, owner: ClientRecord, wire: bytes) -> None:
        self._quotas.check("programs", len(owner.programs), 1)
        self._quotas.check("stored_bytes", owner.stored_bytes, len(wire), " bytes",
                           " (the program, kept in the state dir)")

    async def _read_artifacts(self, owner: ClientRecord, program: Program,
                              slices: dict[str, Slice]) -> dict[tuple[str, str], ArtifactInfo]:
        """Each computation's artifact read once per slice, in the owner's turns."""
        infos: dict[tuple[str, str], ArtifactInfo] = {}
        table = program.artifact_table
        for a in _computes(program):  # the computations of loops and branches too
            if (a.artifact, a.slice) not in infos:
                s = slices[a.slice]
                infos[a.artifact, a.slice] = await self._readers.read(
                    owner.id, table[a.artifact].data, s.mesh, self._slices.platform(s))
        return infos

    def restore(self, owner: ClientRecord, program_id: str, name: str, fuse: bool, doc: Any) -> None:
        """A program registered before the server restarted (checked then): read, lowered
        and compiled again under its id (executors taken over still hold its executables)."""
        program, said, _ = _parse(doc, name, fuse)
        self._check_slices(owner, program)
        args, results = graph_signature(program.graph, program.slice_table, frozenset(program.artifact_table))
        rec = ProgramRecord(program_id, owner.id, name, program, args, results, fuse)
        key = self._lowerings.placements(owner, program)
        self._lowerings.keep(rec, key, self._lowerings.lower(rec, key))
        self.records[rec.id] = rec
        owner.programs.add(rec.id)
        owner.registered[said] = rec.id

    def _check_slices(self, owner: ClientRecord, program: Program) -> None:
        for d in program.slices:
            s = self._slices.get(owner, d.name)  # NotFound names the id
            if d.mesh != s.mesh:
                raise InvalidArgument(
                    f"slice {d.name}: the program declares mesh {d.mesh.to_json()}, "
                    f"the slice has {s.mesh.to_json()}"
                )
            if d.island is not None and d.island != s.island:
                raise InvalidArgument(f"slice {d.name}: the program wants island {d.island}, "
                                      f"the slice is on {s.island}")

    # -- lookup and forgetting ---------------------------------------------------------------

    def get(self, owner: ClientRecord, program_id: str) -> ProgramRecord:
        rec = self.records.get(program_id)
        if rec is None or rec.owner != owner.id:
            raise NotFound(f"program {program_id!r} does not exist")
        return rec

    def lowered(self, owner: ClientRecord, program_id: str) -> Lowered:
        return self._lowerings.of(owner, self.get(owner, program_id))

    def forget(self, owner: ClientRecord) -> None:
        self._remove(owner, list(owner.programs))

    def forget_slice(self, owner: ClientRecord, slice_id: str) -> None:
        """A deleted slice takes the programs that use it with it."""
        self._remove(owner, self.using(owner, slice_id))

    def using(self, owner: ClientRecord, slice_id: str) -> list[str]:
        """The client's programs that use the slice."""
        return [p for p in owner.programs if slice_id in self.records[p].program.slice_table]

    def delete(self, owner: ClientRecord, program_ids: Sequence[str]) -> None:
        """Forget programs the client no longer runs; an id not among its programs is
        skipped (deleting is idempotent). Runs already queued still run."""
        self._remove(owner, [p for p in program_ids if p in owner.programs])

    def let_go(self, owner: ClientRecord, program_ids: Sequence[str]) -> None:
        """Registrations the client let go of (an id once for each): a program goes once
        none holds it (`delete`)."""
        self.delete(owner, self._registry.let_go(owner, program_ids))

    def _remove(self, owner: ClientRecord, program_ids: Sequence[str]) -> None:
        """Gone at once for new runs; its hosts forget its plans and executables once the
        runs queued before have run (`record_key`)."""
        self._registry.remove_programs(owner, program_ids)
        self._registry.unregister(owner, program_ids)
        for pid in program_ids:
            rec = self.records.pop(pid, None)
            if rec is not None:
                self._gangs.later([record_key(pid)], self._remover(rec))

    def _remover(self, rec: ProgramRecord) -> Callable[[], None]:
        return lambda: self._lowerings.remove(rec)

    # -- runs --------------------------------------------------------------------------------

    async def run(self, owner: ClientRecord, program_id: str, inputs: Sequence[str],
                  dispatch: Dispatch | None = None, ids: Sequence[str] | None = None,
                  trace: bool = False) -> list[BufferRecord]:
        """Submit one run (traced, if `trace`); its outputs come back at once as futures,
        named `ids` (the client's choice) or by the server."""
        rec = self.get(owner, program_id)
        runnable("program", rec.id, rec.status)
        if len(inputs) != len(rec.arg_types):
            raise InvalidArgument(f"program {rec.id} takes {len(rec.arg_types)} inputs; got {len(inputs)}")
        for i, (b, want) in enumerate(zip(inputs, rec.arg_types, strict=True)):
            buf = self.usable(self._buffers.get(owner, b), f"input {i}: ")
            found = Type(buf.aval, buf.spec, buf.slice_id)
            if found != want:
                raise InvalidArgument(f"input {i} (buffer {b}): expected {want}, got {found}")
        return self._runs.submit(owner, rec, inputs, dispatch, ids, trace)

    def usable(self, rec: BufferRecord, what: str = "") -> BufferRecord:
        """The buffer, made again first if it was lost (`server.remake`)."""
        return self._remaker.usable(rec, self.repeat, what)

    def repeat(self, owner: ClientRecord, rec: ProgramRecord, inputs: Sequence[str],
               outputs: Sequence[str]) -> str:
        """Run `rec` again into these outputs (lineage recovery, `server.remake`): no new
        records, no new lineage; returns the run's id. A record forgotten since (its client
        let go of it, or a computation's call program for input types no longer kept) is
        lowered and compiled again for this, and what that holds on its hosts goes once the
        run has run."""
        runnable("program", rec.id, rec.status)
        run_id = self._runs.dispatch(owner, rec, inputs, outputs, None)
        if not self._live(rec) and id(rec) not in self._retired:
            self._retired[id(rec)] = rec

            def forget() -> None:
                self._retired.pop(id(rec), None)
                self._lowerings.remove(rec)

            self._gangs.later([record_key(rec.id)], forget)
        return run_id

    def _live(self, rec: ProgramRecord) -> bool:
        """Whether `rec` is a registered program, or the call program of a registered
        computation for input types kept."""
        if rec.computation is None:
            return self.records.get(rec.id) is rec
        return any(r is rec for r in self.calls.get(rec.id, {}).values())

    # -- calls -------------------------------------------------------------------------------

    def add_computation(self, comp: ComputationRecord, owner: ClientRecord) -> ProgramRecord:
        """Lower and compile the computation's call program with its inputs where it declares
        them (the usual case); other input types get theirs at their first call. Returns
        that call program (`compiled` waits for it)."""
        rec = self._call_program(comp, owner, tuple((comp.slice_id, spec) for spec in comp.in_specs))
        self._lowerings.of(owner, rec)
        return rec

    def call(self, owner: ClientRecord, comp: ComputationRecord, inputs: Sequence[str],
             ids: Sequence[str] | None = None) -> list[BufferRecord]:
        """Submit one call: a run of the computation's one-node program for these inputs."""
        runnable("computation", comp.id, comp.status)
        if len(inputs) != len(comp.in_avals):
            raise InvalidArgument(
                f"computation {comp.id} takes {len(comp.in_avals)} inputs; got {len(inputs)}")
        types = []
        for i, (b, want) in enumerate(zip(inputs, comp.in_avals, strict=True)):
            buf = self.usable(self._buffers.get(owner, b), f"input {i}: ")
            if buf.aval != want:
                raise InvalidArgument(f"input {i} (buffer {b}): expected {want}, got {buf.aval}")
            types.append((buf.slice_id, buf.spec))
        return self._runs.submit(owner, self._call_program(comp, owner, tuple(types)), inputs, None, ids)

    def _call_program(self, comp: ComputationRecord, owner: ClientRecord,
                      types: tuple[InputType, ...]) -> ProgramRecord:
        by_types = self.calls.setdefault(comp.id, {})
        rec = by_types.get(types)
        if rec is None:
            slices = {comp.slice_id, *(slice_id for slice_id, _ in types)}
            meshes = {sid: self._slices.get(owner, sid).mesh for sid in slices}
            program = call_program(comp, types, meshes)
            args, results = graph_signature(program.graph, program.slice_table,
                                            frozenset(program.artifact_table))
            rec = ProgramRecord(comp.id, owner.id, comp.name, program, args, results, False,
                                status=comp.status, computation=comp)
            while len(by_types) >= CALL_PROGRAMS_KEPT:
                self._lowerings.remove(by_types.pop(next(iter(by_types))))
            by_types[types] = rec
        return rec

    def forget_calls(self, computation_id: str) -> None:
        """A deleted computation: its call programs go, and what only they used on the hosts
        once the calls queued before have run (`record_key`)."""
        calls = self.calls.pop(computation_id, {})

        def forget() -> None:
            for rec in calls.values():
                self._lowerings.remove(rec)

        self._gangs.later([record_key(computation_id)], forget)


def _computes(program: Program) -> list[ComputeAttrs]:
    """The attributes of every computation of the program, those of loops and branches too."""
    return [n.attrs for n in program.graph.walk() if isinstance(n.attrs, ComputeAttrs)]


def _parse(doc: Any, name: str, fuse: bool) -> tuple[Program, bytes, bytes]:
    """The program, a digest of what its registration says, and the document as JSON (what
    the registry keeps): serialized once, the digest's text built around it (as
    `json.dumps(["program", doc, name, fuse], sort_keys=True)` writes it)."""
    program = from_wire(doc)
    verify(program)
    text = json.dumps(doc, sort_keys=True)
    said = hashlib.sha256(f'["program", {text}, {json.dumps(name)}, {json.dumps(fuse)}]'.encode()).digest()
    return program, said, text.encode()


def _check_artifacts(program: Program, infos: dict[tuple[str, str], ArtifactInfo]) -> None:
    for i, node in enumerate(program.graph.walk()):
        a = node.attrs
        if not isinstance(a, ComputeAttrs):
            continue
        info = infos[a.artifact, a.slice]
        declared = (tuple(x.aval for x in a.ins), tuple(x.aval for x in a.outs))
        if declared != (info.in_avals, info.out_avals):
            raise InvalidArgument(
                f"node {i} (compute {a.name}): declares {_show(declared[0])} -> {_show(declared[1])}; "
                f"its artifact computes {_show(info.in_avals)} -> {_show(info.out_avals)}"
            )
        info.check_specs([x.spec for x in a.ins], [x.spec for x in a.outs], f"node {i} (compute {a.name}): ")


def _show(avals: Sequence[Any]) -> str:
    return "(" + ", ".join(map(str, avals)) + ")"
