"""Runs: one run of a program (or call program) queued on its island and dispatched at admission.

Contract:
- A run is queued only if its results and the most its hosts hold of its intermediate
  values at once (`HostPlan.held`) fit the client's buffer quota beside what it holds
  (`holds`); its outputs are returned at once as buffer futures, with their lineage.
- Under parallel dispatch a run sends one message per host involved, all numbered in one
  atomic step at admission; under sequential dispatch, one message per node in the global
  schedule, each sent once the previous one is accepted. Programs with loops or branches
  always travel whole (one message per host), tracked while they loop (`server.loops`).
- A run whose input was lost while it waited sends nothing (`Buffers.unless_lost`).
- `settled` is what the gang scheduler awaits until a run's hosts have run their part: the
  outputs every host holds computed are noted ready (`server.settling`), and a host that
  reports a failed collective is reported (`on_broken(host, cause)`); a run whose hosts
  did not all report its results computed is told to the run log as failed.
- Every run that starts is timed and recorded in the run log when it ends (`server.run_log`);
  a traced run's hosts record what they do, and the server its scheduling (`server.tracing`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any, Literal

from executors import ExecutorPool, RunMessage
from executors.messages import Settlement
from ir import HostPlan, InvalidArgument
from scheduler import Submission
from server.buffers import Buffers
from server.gang import Gangs
from server.lineage import Lineage, Origin
from server.loops import Loops
from server.lowerings import Lowerings
from server.program_record import ProgramRecord, record_key, runnable
from server.records import BufferRecord, ClientRecord
from server.run_log import RunInfo, RunLog
from server.settings import Settings
from server.settling import Settling
from server.slices import Slices
from server.tracing import RunTraces

log = logging.getLogger("isthmus.server")
Dispatch = Literal["parallel", "sequential"]
Messages = list[tuple[HostPlan, RunMessage]]


class Runs:
    def __init__(self, settings: Settings, pool: ExecutorPool, gangs: Gangs, slices: Slices, buffers: Buffers,
                 lineage: Lineage, lowerings: Lowerings, loops: Loops, settling: Settling,
                 on_broken: Callable[[str, str], None], log: RunLog, traces: RunTraces) -> None:
        self._settings = settings
        self._pool = pool
        self._gangs = gangs
        self._slices = slices
        self._buffers = buffers
        self._lineage = lineage
        self._lowerings = lowerings
        self._loops = loops
        self._settling = settling
        self._on_broken = on_broken
        self._run_log = log
        self._traces = traces
        self._run_numbers = itertools.count()
        # Run ids are unique across restarts too: executors a new server takes over remember
        # the runs they finished by id.
        self._incarnation = secrets.token_hex(3)

    def submit(self, owner: ClientRecord, rec: ProgramRecord, inputs: Sequence[str],
               dispatch: Dispatch | None = None, ids: Sequence[str] | None = None,
               trace: bool = False) -> list[BufferRecord]:
        """Submit a run of `rec` on inputs the caller has checked against its argument types
        (traced, if `trace`); its outputs, named `ids` (the client's choice) or by the server."""
        runnable("program", rec.id, rec.status)
        _, plans = self._lowerings.of(owner, rec)
        holds(rec, plans, self._buffers.quota_bytes)
        slices = [self._slices.get(owner, t.slice) for t in rec.result_types]
        footprints = self._buffers.check_room(
            owner, [(s, t.aval, t.spec) for s, t in zip(slices, rec.result_types, strict=True)], submits=1,
            held={host: plan.held for host, plan in plans.items() if plan.held})
        new = self._buffers.output_ids(owner, ids, len(rec.result_types), "ids")
        outs = [BufferRecord(b, owner.id, t.slice, s.hosts, t.aval, t.spec)
                for b, s, t in zip(new, slices, rec.result_types, strict=True)]
        run_id = self.dispatch(owner, rec, inputs, new, dispatch, plans, trace)
        self._buffers.add(owner, outs, footprints)
        self._lineage.ran(Origin(rec, owner.id, tuple(inputs), tuple(new), run=run_id))
        return outs

    def dispatch(self, owner: ClientRecord, rec: ProgramRecord, inputs: Sequence[str],
                 outputs: Sequence[str], dispatch: Dispatch | None,
                 plans: dict[str, HostPlan] | None = None, trace: bool = False) -> str:
        """Queue one run on its island's gang scheduler (`plans`: its lowering, if in hand;
        traced if `trace` or the server traces every run); returns the run's id."""
        if plans is None:
            _, plans = self._lowerings.of(owner, rec)
        run_id = f"{rec.id}/{self._incarnation}.{next(self._run_numbers)}"  # a computation has several
        rec.runs += 1
        timeout, limit = self._settings.step_timeout_s, self._settings.max_run_s
        trace = trace or self._settings.trace
        messages = [
            (plan, RunMessage(run_id, plan.key, 0, len(plan.steps),
                              [(v, inputs[k]) for k, v in plan.args],
                              [(v, outputs[k]) for k, v in plan.results], True, timeout, limit, trace))
            for plan in plans.values()
        ]
        island = self._slices.get(owner, rec.program.slices[0].name).island
        kind = rec.computation.id if rec.computation is not None else rec.id
        sub = Submission(run_id, owner.id, tuple(sorted(plans)), rec.cost, self._gangs.expected(kind))
        # A loop's steps run many times on their host: programs with loops or branches always
        # travel whole (one message per host), whatever the dispatch asked for.
        looping = any(plan.loops for plan in plans.values())
        sequential = (dispatch or self._settings.dispatch) == "sequential" and not looping
        start: Callable[[], Awaitable[None]] = (
            (lambda: self._sequential(messages)) if sequential else (lambda: self._parallel(messages)))
        if looping:
            start = self._loops.track(run_id, owner.id, tuple(sorted(plans)), start,
                                      frozenset(d.name for d in rec.program.slices))
        info = RunInfo(run_id, owner.id, owner.name, kind, rec.name,
                       "program" if rec.computation is None else "call", island, sub.hosts, trace)
        if trace:
            start = self._traces.track(info, start)
        start = self._run_log.track(info, start)
        start = self._buffers.unless_lost(inputs, list(outputs), start)
        # Sequential dispatch writes the results with its closing messages: they wait until then.
        outs = list(outputs)
        # Held until it has run: its record's executables and plans stay on the hosts until then.
        record = record_key(kind)
        self._gangs.submit(island, sub, start, [*inputs, *([] if sequential else outs)],
                           [*(outs if sequential else []), record], outputs=outs, reads=inputs, kind=kind,
                           what="program" if rec.computation is None else "call")
        return run_id

    def _parallel(self, messages: Messages) -> Awaitable[None]:
        """At admission: one message per host, numbered at once; then wait until all have run."""
        refs = self._pool.run([(plan.host, m, plan) for plan, m in messages], notify=True)
        return self.settled(refs, [plan.host for plan, _ in messages], _results(messages), _run_id(messages))

    def _sequential(self, messages: Messages) -> Awaitable[None]:
        """At admission, every host binds the run's arguments, all in one atomic step (so a
        release numbered later cannot take them away); then one message per node, in the
        global schedule, each sent once the previous one is accepted (a node on a slice
        spanning hosts goes to all of them in one atomic step: the island order); last, every
        host closes the run (its results appear) and answers once it has run it all. If
        dispatch breaks off, every host is told to close the run (its results fail)."""
        self._pool.run([(plan.host, replace(m, lo=0, hi=0, final=not plan.steps), plan)
                        for plan, m in messages])
        return self._steps(messages)

    async def _steps(self, messages: Messages) -> None:
        pool, timeout = self._pool, self._settings.rpc_timeout_s
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
        await self.settled(pool.run(ends, notify=True), [host for host, _, _ in ends],
                           _results([(plan, m) for _, m, plan in ends]), _run_id(messages))

    def settled(self, refs: Sequence[Any], hosts: Sequence[str], outputs: Sequence[str] = (),
                run_id: str = "") -> asyncio.Future[None]:
        """What to await until the hosts have run their part (called at admission, so that
        a wait for `outputs` finds them settling): report any host with a failed
        collective; note the outputs every host holds computed; tell the run log if `run_id`
        did not compute them all. A future, not a task: the gang scheduler waits for one per
        run."""
        done = self._settling.start(outputs)

        def then(settlement: Settlement | None) -> None:
            ready: set[str] = set()
            failed = settlement is None or bool(settlement.broken)
            try:
                if settlement is not None:
                    for host, cause in settlement.broken.items():
                        self._on_broken(host, cause)
                    records, lost = self._buffers.records, self._buffers.lost
                    ready = {b for b in outputs if (rec := records.get(b)) is not None
                             and settlement.ready[b] == len(rec.hosts) and b not in lost}
                    # (an output the client released already counts as made: its run is repeatable)
                    self._lineage.settled(ready | {b for b in outputs if b not in records})
                    # For the run log: failed if an output is not ready, or, released already,
                    # no host reported it computed (its run was ended on purpose, say).
                    failed = failed or any(b not in ready if b in records else not settlement.ready[b]
                                           for b in outputs)
            except Exception:
                failed = True
                log.exception("settling the run of %s failed", list(outputs)[:4])
            finally:
                if failed and run_id:
                    self._run_log.failed(run_id)
                self._settling.finish(done, outputs, ready)

        self._pool.when_settled(refs, hosts, self._settings.fetch_timeout_s, then)
        return done


def _results(messages: Sequence[tuple[HostPlan, RunMessage]]) -> list[str]:
    """The buffers a run's messages close (each once, however many hosts hold it)."""
    return list(dict.fromkeys(b for _, m in messages for _, b in m.results))


def _run_id(messages: Messages) -> str:
    return messages[0][1].run_id if messages else ""


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
