"""Programs: register an IR program once, lower it, compile it on its hosts, run it.

Contract:
- Registration checks everything a run could trip on, and answers 4xx naming it: the wire
  form, the verifier, each slice (the caller's, with the declared mesh and island), each
  computation's artifact against its declared avals, and the lowering itself.
- A program is lowered (`ir.passes`) for the current placement of its slices, and again
  only when the resource manager maps one of them elsewhere; fusing adjacent computations
  on one slice is the program's choice (default: the server's `fuse` setting).
- A run is queued only if its results and the most its hosts hold of its intermediate
  values at once (`HostPlan.held`) fit the client's buffer quota beside what it holds; a
  program that could not fit even alone is refused when registered (`holds`).
- A run under parallel dispatch sends one message per host involved, all numbered in one
  atomic step; under sequential dispatch, one message per node in the global schedule,
  each sent once the previous one is accepted. Either way the outputs are returned at once
  as buffer futures.
- A call of a registered computation is a run of its one-node program (`server.calls`),
  one per computation and input types (slices and specs), kept here beside the programs
  but not counted as the client's: registering the computation lowers and compiles the one
  whose inputs are where the computation declares them, and its compile status is the
  computation's.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import secrets
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

from executors import RunMessage
from ir import (
    HostPlan,
    InvalidArgument,
    NotFound,
    Op,
    Program,
    Type,
    Unavailable,
    from_wire,
    graph_signature,
    verify,
)
from ir.passes import host_plans, lower
from resource_manager import Slice
from scheduler import Submission
from server.artifacts import ArtifactInfo
from server.caches import of_plans
from server.calls import InputType, call_program
from server.lineage import Origin
from server.program_record import Placements, ProgramRecord, compiled, record_key, refusal
from server.records import BufferRecord, ClientRecord, ComputationRecord, new_id
from server.remake import unless_lost, usable
from server.tasks import Tasks

if TYPE_CHECKING:
    from server.service import Service

log = logging.getLogger("isthmus.server")
Dispatch = Literal["parallel", "sequential"]
LOWERINGS_KEPT = 4  # per program: placements it was lowered for (newest kept)
CALL_PROGRAMS_KEPT = 8  # per computation: input types it was called with (newest kept)


class Programs:
    def __init__(self, service: Service) -> None:
        self.service = service
        self.records: dict[str, ProgramRecord] = {}
        # computation id -> input types -> its call program (`server.calls`)
        self.calls: dict[str, dict[tuple[InputType, ...], ProgramRecord]] = {}
        self._run_numbers = itertools.count()
        # Run ids are unique across restarts too: executors a new server takes over remember
        # the runs they finished by id.
        self._incarnation = secrets.token_hex(3)
        self._tasks = Tasks()
        # run with loops in flight -> (owner, hosts, slices)
        self._looping: dict[str, tuple[str, tuple[str, ...], frozenset[str]]] = {}
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
        if known is not None and known.owner == owner.id and known.status != "failed":
            self.service.registry.hold(owner, said, known.id)
            return known  # the same program registered again (traced anew in a loop, say)
        self.service.quotas.check("programs", len(owner.programs), 1)
        self.service.quotas.check("stored_bytes", owner.stored_bytes, len(wire), " bytes",
                                  " (the program, kept in the state dir)")
        self._check_slices(owner, program)
        targets = {d.name: self.service.slice(owner, d.name) for d in program.slices}
        executables = {(n.attrs.artifact, n.attrs.slice) for n in program.graph.walk() if n.op is Op.COMPUTE}
        limit = self.service.settings.max_program_computations
        if len(executables) > limit:  # each is compiled on its hosts, ahead of their other work
            raise InvalidArgument(f"program: {len(executables)} distinct computations (artifact and slice "
                                  f"pairs), more than max_program_computations ({limit})")
        infos = await self._read_artifacts(owner, program, targets)
        self._check_slices(owner, program)
        self.service.quotas.check("programs", len(owner.programs), 1)
        _check_artifacts(program, infos)
        self.service.quotas.check("stored_bytes", owner.stored_bytes, len(wire), " bytes",
                                  " (the program, kept in the state dir)")
        args, results = graph_signature(program.graph, program.slice_table,
                                        frozenset(program.artifact_table))
        rec = ProgramRecord(new_id("p"), owner.id, name, program, args, results, fuse)
        key = self._placements(owner, program)
        lowered = await asyncio.to_thread(self._lower, rec, key)
        holds(rec, lowered[1], self.service.quotas.buffer_bytes)
        self._check_slices(owner, program)
        if key == self._placements(owner, program):  # else it is lowered again at its first run
            self._keep(rec, key, lowered)
        self.service.registry.add_program(owner, rec, wire)
        self.records[rec.id] = rec
        self.service.registry.hold(owner, said, rec.id)
        await compiled(rec)
        return rec

    async def _read_artifacts(self, owner: ClientRecord, program: Program,
                              slices: dict[str, Slice]) -> dict[tuple[str, str], ArtifactInfo]:
        """Each computation's artifact read once per slice, in the owner's turns."""
        infos: dict[tuple[str, str], ArtifactInfo] = {}
        table = program.artifact_table
        for node in program.graph.walk():  # the computations of loops and branches too
            if node.op is Op.COMPUTE and (node.attrs.artifact, node.attrs.slice) not in infos:
                infos[node.attrs.artifact, node.attrs.slice] = await self.service.inspect(
                    owner, table[node.attrs.artifact].data, slices[node.attrs.slice])
        return infos

    def restore(self, owner: ClientRecord, program_id: str, name: str, fuse: bool, doc: Any) -> None:
        """A program registered before the server restarted (checked then): read, lowered
        and compiled again under its id (executors taken over still hold its executables)."""
        program, said, _ = _parse(doc, name, fuse)
        self._check_slices(owner, program)
        args, results = graph_signature(program.graph, program.slice_table, frozenset(program.artifact_table))
        rec = ProgramRecord(program_id, owner.id, name, program, args, results, fuse)
        key = self._placements(owner, program)
        self._keep(rec, key, self._lower(rec, key))
        self.records[rec.id] = rec
        owner.programs.add(rec.id)
        owner.registered[said] = rec.id

    def _check_slices(self, owner: ClientRecord, program: Program) -> None:
        for d in program.slices:
            s = self.service.slice(owner, d.name)  # NotFound names the id
            if d.mesh != s.mesh:
                raise InvalidArgument(
                    f"slice {d.name}: the program declares mesh {d.mesh.to_json()}, "
                    f"the slice has {s.mesh.to_json()}"
                )
            if d.island is not None and d.island != s.island:
                raise InvalidArgument(f"slice {d.name}: the program wants island {d.island}, "
                                      f"the slice is on {s.island}")

    def _placements(self, owner: ClientRecord, program: Program) -> Placements:
        return tuple((d.name, self.service.placement(self.service.slice(owner, d.name)))
                     for d in program.slices)

    def _lowered(self, owner: ClientRecord, rec: ProgramRecord) -> tuple[Program, dict[str, HostPlan]]:
        """The program lowered for its slices' current placement (cached per placement); a
        new placement is compiled on its hosts in the background."""
        key = self._placements(owner, rec.program)
        lowered = rec.lowered.get(key)
        if lowered is None:
            lowered = self._lower(rec, key)
            self._keep(rec, key, lowered)
        return lowered

    def _lower(self, rec: ProgramRecord, key: Placements) -> tuple[Program, dict[str, HostPlan]]:
        lowered = lower(rec.program, dict(key), fuse=rec.fuse)
        return lowered, host_plans(lowered, self.service.pool.ranks)

    def _keep(self, rec: ProgramRecord, key: Placements,
              lowered: tuple[Program, dict[str, HostPlan]]) -> None:
        """Keep a lowering (only the latest few placements: slices are rarely moved) and
        compile it on its hosts in the background."""
        while len(rec.lowered) >= LOWERINGS_KEPT:
            self._drop(rec.lowered.pop(next(iter(rec.lowered))))
        rec.lowered[key] = lowered
        self.service.caches.hold(*of_plans(lowered[1]))
        rec.compiling = self._tasks.spawn(self._compile(rec, *lowered))

    async def _compile(self, rec: ProgramRecord, lowered: Program, plans: dict[str, HostPlan]) -> None:
        """Compile a lowering on its hosts; the status is the newest compile's (one started
        on hosts restarted meanwhile is: an older one may fail late, with the host it
        asked gone)."""
        table = lowered.artifact_table  # fusing adds artifacts
        jobs = [(host, job) for host, plan in plans.items() for job in plan.compiles]
        timeout = self.service.settings.rpc_timeout_s
        comp = rec.computation  # (the status of each of its call programs is its status)
        rec.compiles += 1
        mine, its = rec.compiles, comp.compiles + 1 if comp is not None else 0
        if comp is not None:
            comp.compiles = its

        async def one(host: str, job: Any) -> tuple[str | None, bool]:
            """The compiler's message, if it failed; and whether the host was down."""
            try:
                return await self.service.pool.compile(
                    host, job.key, table[job.artifact].data, job.mesh,
                    [s.to_json() for s in job.in_specs], [s.to_json() for s in job.out_specs], timeout,
                ), False
            except Exception as e:
                return f"{type(e).__name__}: {e}", isinstance(e, Unavailable)

        answers = await asyncio.gather(*(one(h, j) for h, j in jobs))
        failed = [(f"{j.key} on {h}: {m}", down)
                  for (h, j), (m, down) in zip(jobs, answers, strict=True) if m]
        status, message = ("failed", "; ".join(m for m, _ in failed)) if failed else ("ready", None)
        down = bool(failed) and all(d for _, d in failed)
        if rec.compiles == mine:  # else a newer compile's answer is the status
            rec.status, rec.message, rec.down = status, message, down
        if comp is not None and comp.compiles == its:  # every call program compiles the same executable
            comp.status, comp.message, comp.down = status, message, down

    def close(self) -> None:
        self._tasks.cancel()

    # -- lookup ------------------------------------------------------------------------------

    def get(self, owner: ClientRecord, program_id: str) -> ProgramRecord:
        rec = self.records.get(program_id)
        if rec is None or rec.owner != owner.id:
            raise NotFound(f"program {program_id!r} does not exist")
        return rec

    def lowered(self, owner: ClientRecord, program_id: str) -> tuple[Program, dict[str, HostPlan]]:
        return self._lowered(owner, self.get(owner, program_id))

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
        self.delete(owner, self.service.registry.let_go(owner, program_ids))

    def _remove(self, owner: ClientRecord, program_ids: Sequence[str]) -> None:
        """Gone at once for new runs; its hosts forget its plans and executables once the
        runs queued before have run (`record_key`)."""
        self.service.registry.remove_programs(owner, program_ids)
        self.service.registry.unregister(owner, program_ids)
        for pid in program_ids:
            rec = self.records.pop(pid, None)
            if rec is not None:
                self.service.gangs.later([record_key(pid)], lambda rec=rec: self._remove_lowerings(rec))

    def _drop(self, lowered: tuple[Program, dict[str, HostPlan]]) -> None:
        """A lowering no longer kept: its hosts forget what no other record uses."""
        self.service.caches.drop(*of_plans(lowered[1]))

    def compile_again(self, hosts: set[str]) -> None:
        """Restarted hosts have none of the programs' executables: compile again, on them,
        whatever was lowered onto them (plans travel again with the next run messages).
        Only on them: the other hosts of a program across islands keep theirs, and one of
        another island restarting meanwhile would fail the compile, and the program with
        it, until that island's own compile came."""
        calls = [rec for by_types in self.calls.values() for rec in by_types.values()]
        for rec in [*self.records.values(), *calls, *self._retired.values()]:
            for lowered, plans in rec.lowered.values():
                if hosts & set(plans):
                    restarted = {h: plan for h, plan in plans.items() if h in hosts}
                    self._tasks.spawn(self._compile(rec, lowered, restarted))

    # -- runs --------------------------------------------------------------------------------

    async def run(self, owner: ClientRecord, program_id: str, inputs: Sequence[str],
                  dispatch: Dispatch | None = None, ids: Sequence[str] | None = None) -> list[BufferRecord]:
        """Submit one run; its outputs come back at once as futures, named `ids` (the
        client's choice) or by the server."""
        rec = self._runnable(self.get(owner, program_id))
        self._check_inputs(owner, rec, inputs)
        return self.submit(owner, rec, inputs, dispatch, ids)

    def submit(self, owner: ClientRecord, rec: ProgramRecord, inputs: Sequence[str],
               dispatch: Dispatch | None = None, ids: Sequence[str] | None = None) -> list[BufferRecord]:
        """Submit a run of `rec` on inputs the caller has checked against its argument types
        (`run` checks them; `call` chose the program by the inputs' types)."""
        self._runnable(rec)
        _, plans = self._lowered(owner, rec)
        holds(rec, plans, self.service.quotas.buffer_bytes)
        slices = [self.service.slice(owner, t.slice) for t in rec.result_types]
        footprints = self.service.check_room(
            owner, [(s, t.aval, t.spec) for s, t in zip(slices, rec.result_types, strict=True)], submits=1,
            held={host: plan.held for host, plan in plans.items() if plan.held})
        new = self.service.output_ids(owner, ids, len(rec.result_types), "ids")
        outs = [BufferRecord(b, owner.id, t.slice, s.hosts, t.aval, t.spec)
                for b, s, t in zip(new, slices, rec.result_types, strict=True)]
        run_id = self._dispatch(owner, rec, inputs, new, dispatch, plans)
        self.service.add_buffers(owner, outs, footprints)
        self.service.lineage.ran(Origin(rec, owner.id, tuple(inputs), tuple(new), run=run_id))
        return outs

    def repeat(self, owner: ClientRecord, rec: ProgramRecord, inputs: Sequence[str],
               outputs: Sequence[str]) -> str:
        """Run `rec` again into these outputs (lineage recovery, `server.remake`): no new
        records, no new lineage; returns the run's id. A record forgotten since (its client let go of it, or a
        computation's call program for input types no longer kept) is lowered and compiled
        again for this, and what that holds on its hosts goes once the run has run."""
        run_id = self._dispatch(owner, self._runnable(rec), inputs, outputs, None)
        if not self._live(rec) and id(rec) not in self._retired:
            self._retired[id(rec)] = rec

            def forget() -> None:
                self._retired.pop(id(rec), None)
                self._remove_lowerings(rec)

            self.service.gangs.later([record_key(rec.id)], forget)
        return run_id

    def _live(self, rec: ProgramRecord) -> bool:
        """Whether `rec` is a registered program, or the call program of a registered
        computation for input types kept."""
        if rec.computation is None:
            return self.records.get(rec.id) is rec
        return any(r is rec for r in self.calls.get(rec.id, {}).values())

    def _dispatch(self, owner: ClientRecord, rec: ProgramRecord, inputs: Sequence[str],
                  outputs: Sequence[str], dispatch: Dispatch | None,
                  plans: dict[str, HostPlan] | None = None) -> str:
        """Queue one run on its island's gang scheduler (`plans`: its lowering, if in hand);
        returns the run's id."""
        if plans is None:
            _, plans = self._lowered(owner, rec)
        run_id = f"{rec.id}/{self._incarnation}.{next(self._run_numbers)}"  # a computation has several
        rec.runs += 1
        timeout, limit = self.service.settings.step_timeout_s, self.service.settings.max_run_s
        messages = [
            (plan, RunMessage(run_id, plan.key, 0, len(plan.steps),
                              [(v, inputs[k]) for k, v in plan.args],
                              [(v, outputs[k]) for k, v in plan.results], True, timeout, limit))
            for plan in plans.values()
        ]
        island = self.service.slice(owner, rec.program.slices[0].name).island
        kind = rec.computation.id if rec.computation is not None else rec.id
        sub = Submission(run_id, owner.id, tuple(sorted(plans)), rec.cost, self.service.gangs.expected(kind))
        # A loop's steps run many times on their host: programs with loops or branches always
        # travel whole (one message per host), whatever the dispatch asked for.
        looping = any(plan.loops for plan in plans.values())
        sequential = (dispatch or self.service.settings.dispatch) == "sequential" and not looping
        start = (lambda: self._sequential(messages)) if sequential else (lambda: self._parallel(messages))
        if looping:
            start = self._tracked(run_id, owner.id, tuple(sorted(plans)), start,
                                  frozenset(d.name for d in rec.program.slices))
        start = unless_lost(self.service, inputs, list(outputs), start)
        # Sequential dispatch writes the results with its closing messages: they wait until then.
        outputs = list(outputs)
        # Held until it has run: its record's executables and plans stay on the hosts until then.
        record = record_key(rec.computation.id if rec.computation is not None else rec.id)
        self.service.gangs.submit(island, sub, start, [*inputs, *([] if sequential else outputs)],
                                  [*(outputs if sequential else []), record], outputs=outputs, reads=inputs,
                                  kind=kind)
        return run_id

    def _tracked(self, run_id: str, owner_id: str, hosts: tuple[str, ...],
                 start: Callable[[], Awaitable[None]], slices: frozenset[str]
                 ) -> Callable[[], Awaitable[None]]:
        """`start`, the run known as looping while its hosts run it (`cancel_runs`)."""
        def started() -> Awaitable[None]:
            running = asyncio.ensure_future(start())
            self._looping[run_id] = (owner_id, hosts, slices)
            running.add_done_callback(lambda _: self._looping.pop(run_id, None))
            return running

        return started

    def cancel_runs(self, owner_id: str, cause: str, slice_id: str | None = None) -> int:
        """Stop the client's runs with loops that its hosts run now (those using `slice_id`,
        if given): each loop ends, failed, at its next test (`executors.runner`). Returns
        how many."""
        return self._cancel({r: hosts for r, (o, hosts, slices) in self._looping.items()
                             if o == owner_id and (slice_id is None or slice_id in slices)}, cause)

    def cancel_run(self, run_id: str, cause: str) -> bool:
        """Stop that run's loops, if its hosts run it now (each ends, failed, at its next
        test); whether it loops."""
        looping = self._looping.get(run_id)
        if looping is None:
            return False
        self._cancel({run_id: looping[1]}, cause)
        return True

    def cancel_on(self, lost: Collection[str], cause: str) -> int:
        """Stop every run with loops on any of these hosts (lost, or about to be replaced),
        whoever's, on its other hosts: they would loop on without them, sending each
        iteration to executors that never took the run. Returns how many."""
        gone = set(lost)
        return self._cancel({r: hosts for r, (_, hosts, _) in self._looping.items()
                             if gone.intersection(hosts)}, cause, gone)

    def _cancel(self, runs: dict[str, tuple[str, ...]], cause: str, besides: Collection[str] = ()) -> int:
        """Tell the runs' hosts (but `besides`) to end these runs' loops; how many runs.
        Ended on purpose, they are not repeated to make their outputs again (`Lineage.stopped`)."""
        for run_id in runs:
            self.service.lineage.stopped(run_id, cause)
        hosts = sorted({h for hs in runs.values() for h in hs}.difference(besides))
        if hosts:
            self.service.pool.cancel(hosts, list(runs), cause)
        return len(runs)

    # -- calls -------------------------------------------------------------------------------

    def add_computation(self, comp: ComputationRecord) -> ProgramRecord:
        """Lower and compile the computation's call program with its inputs where it declares
        them (the usual case); other input types get theirs at their first call. Returns
        that call program (`compiled` waits for it)."""
        rec = self._call_program(comp, tuple((comp.slice_id, spec) for spec in comp.in_specs))
        self._lowered(self.service.client(comp.owner), rec)
        return rec

    def call(self, owner: ClientRecord, comp: ComputationRecord, inputs: Sequence[str],
             ids: Sequence[str] | None = None) -> list[BufferRecord]:
        """Submit one call: a run of the computation's one-node program for these inputs."""
        if comp.status == "failed":
            raise refusal("computation", comp.id, comp.message, comp.down)
        if len(inputs) != len(comp.in_avals):
            raise InvalidArgument(
                f"computation {comp.id} takes {len(comp.in_avals)} inputs; got {len(inputs)}")
        types = []
        for i, (b, want) in enumerate(zip(inputs, comp.in_avals, strict=True)):
            buf = usable(self.service, self.service.buffer(owner, b), f"input {i}: ")
            if buf.aval != want:
                raise InvalidArgument(f"input {i} (buffer {b}): expected {want}, got {buf.aval}")
            types.append((buf.slice_id, buf.spec))
        return self.submit(owner, self._call_program(comp, tuple(types)), inputs, None, ids)

    def _call_program(self, comp: ComputationRecord, types: tuple[InputType, ...]) -> ProgramRecord:
        by_types = self.calls.setdefault(comp.id, {})
        rec = by_types.get(types)
        if rec is None:
            owner = self.service.client(comp.owner)
            slices = {comp.slice_id, *(slice_id for slice_id, _ in types)}
            meshes = {sid: self.service.slice(owner, sid).mesh for sid in slices}
            program = call_program(comp, types, meshes)
            args, results = graph_signature(program.graph, program.slice_table,
                                            frozenset(program.artifact_table))
            rec = ProgramRecord(comp.id, owner.id, comp.name, program, args, results, False,
                                status=comp.status, message=comp.message, computation=comp)
            while len(by_types) >= CALL_PROGRAMS_KEPT:
                self._remove_lowerings(by_types.pop(next(iter(by_types))))
            by_types[types] = rec
        return rec

    def forget_calls(self, computation_id: str) -> None:
        """A deleted computation: its call programs go, and what only they used on the hosts
        once the calls queued before have run (`record_key`)."""
        calls = self.calls.pop(computation_id, {})

        def forget() -> None:
            for rec in calls.values():
                self._remove_lowerings(rec)

        self.service.gangs.later([record_key(computation_id)], forget)

    def _remove_lowerings(self, rec: ProgramRecord) -> None:
        for lowered in rec.lowered.values():
            self._drop(lowered)
        rec.lowered.clear()

    def _parallel(self, messages: list[tuple[HostPlan, RunMessage]]) -> Awaitable[None]:
        """At admission: one message per host, numbered at once; then wait until all have run."""
        refs = self.service.pool.run([(plan.host, m, plan) for plan, m in messages], notify=True)
        return self.service.settled(refs, [plan.host for plan, _ in messages], _results(messages))

    @staticmethod
    def _runnable(rec: ProgramRecord) -> ProgramRecord:
        if rec.status == "failed":
            raise refusal("program", rec.id, rec.message, rec.down)
        return rec

    def _check_inputs(self, owner: ClientRecord, rec: ProgramRecord, inputs: Sequence[str]) -> None:
        if len(inputs) != len(rec.arg_types):
            raise InvalidArgument(f"program {rec.id} takes {len(rec.arg_types)} inputs; got {len(inputs)}")
        for i, (b, want) in enumerate(zip(inputs, rec.arg_types, strict=True)):
            buf = usable(self.service, self.service.buffer(owner, b), f"input {i}: ")
            found = Type(buf.aval, buf.spec, buf.slice_id)
            if found != want:
                raise InvalidArgument(f"input {i} (buffer {b}): expected {want}, got {found}")

    def _sequential(self, messages: list[tuple[HostPlan, RunMessage]]) -> Awaitable[None]:
        """At admission, every host binds the run's arguments, all in one atomic step (so a
        release numbered later cannot take them away); then one message per node, in the
        global schedule, each sent once the previous one is accepted (a node on a slice
        spanning hosts goes to all of them in one atomic step: the island order); last, every
        host closes the run (its results appear) and answers once it has run it all. If
        dispatch breaks off, every host is told to close the run (its results fail)."""
        pool = self.service.pool
        pool.run([(plan.host, replace(m, lo=0, hi=0, final=not plan.steps), plan) for plan, m in messages])
        return self._steps(messages)

    async def _steps(self, messages: list[tuple[HostPlan, RunMessage]]) -> None:
        pool, timeout = self.service.pool, self.service.settings.rpc_timeout_s
        by_host = {plan.host: (plan, m) for plan, m in messages}
        schedule = sorted((o, plan.host, i) for plan, _ in messages for i, o in enumerate(plan.order))
        ends = [(plan.host, replace(m, lo=len(plan.steps), hi=len(plan.steps), final=True), plan)
                for plan, m in messages if plan.steps]
        try:
            for _, group in itertools.groupby(schedule, key=lambda entry: entry[0]):
                node = [(host, replace(by_host[host][1], lo=i, hi=i + 1, final=False), by_host[host][0])
                        for _, host, i in group]
                await pool.settle(pool.run(node), [host for host, _, _ in node], timeout)  # accepted
        except BaseException:
            pool.run(ends)
            raise
        await self.service.settled(pool.run(ends, notify=True), [host for host, _, _ in ends],
                                   _results([(plan, m) for _, m, plan in ends]))


def _results(messages: Sequence[tuple[HostPlan, RunMessage]]) -> list[str]:
    """The buffers a run's messages close (each once, however many hosts hold it)."""
    return list(dict.fromkeys(b for _, m in messages for _, b in m.results))


def holds(rec: ProgramRecord, plans: dict[str, HostPlan], limit: int) -> int:
    """What a run of `rec` holds of its own values at once, at most, summed over its hosts
    (`HostPlan.held`). A program whose run could not fit `limit` bytes with its results,
    for a client holding nothing else, is refused, naming its largest host."""
    held = sum(plan.held for plan in plans.values())
    results = sum(t.aval.nbytes for t in rec.result_types)
    if held and held + results > limit:
        top = max(plans.values(), key=lambda plan: plan.held)
        raise InvalidArgument(
            f"program {rec.id}: a run holds up to {held} bytes of intermediate values at once "
            f"({top.held} on host {top.host}); with its results ({results} bytes) that passes the "
            f"client's buffer quota of {limit} bytes (max_buffer_mb) even with nothing else held")
    return held


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
        if node.op is not Op.COMPUTE:
            continue
        a = node.attrs
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

