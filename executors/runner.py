"""Runs one host's part of a program (`ir.plan.HostPlan`) on that host's dispatch thread.

Every computation an executor runs goes through here: a single call is a one-node program.

Contract:
- One run message carries a range of the host's plan steps (all of them under parallel
  dispatch, one under sequential dispatch). A mailbox per `(run, tag)` is opened by
  whichever comes first, the peer's delivery or the message (when its plan is already
  here), so a peer's data can land while earlier work is still running. A finished run
  leaves no mailbox, and deliveries that come after it are dropped (`executors.mail`).
- Steps run in plan order on the host's dispatch thread, the only thread that issues
  computations to XLA (`executors.computing`). A computation on this host's devices is
  issued without waiting for it (XLA's asynchronous dispatch: its outputs are futures that
  later steps consume), and `executors.issued` bounds those left unfinished (`in_flight`
  of them, not counting those a later one read from). A computation spanning hosts (an
  island's JAX group) runs alone: every issued computation finishes first, and it
  finishes before the next step. Values of a run live in a per-run environment; only the
  program's results enter the store.
- `Send` hands the value (host memory, numpy) straight to every host of the receiving
  slice through the injected `deliver`, never through the server: `Whole` from a slice on
  one host, this host's distinct `Shards` from a slice spanning hosts. Deliveries are
  tagged `<tag>@<sending host>`, so a `Recv` from a slice spanning hosts waits for each of
  them, assembles the whole value and places its part (a value for this process's devices
  alone stays in host memory, a `HostArray`, until a computation takes it as its argument:
  JAX places it as it calls). A failed value is sent as its `Failed` cause, so the peer's
  dependents fail with the same cause (`executors.payloads`).
- Loops and branches (`ir.plan`'s Switch / Merge / Enter / Exit / NextIteration) run as
  the per-host state machine of `executors.control`: a `NextIteration` may send the step
  index back to its loop's `Merge`, a run's `Frames` tag every send and receive inside a
  frame with the frame and iteration, a step under a dead guard (or reading a dead value)
  defines dead values without running, and a `Send` of a dead value delivers `Dead`, so a
  host whose branch was not taken finishes. The predicate comes from its host as a value
  like any other (a counted loop's trip count, once, each host then counting its
  iterations: `Count`), so no iteration involves the server. A loop whose `Enter` allows more
  than one iteration at once runs whole in `executors.iterations` (its iterations'
  steps interleaved on this thread), the rest of the plan around it as above.
- A failure never hangs: a `Recv` or an executable that does not arrive within the run's
  timeout fails the value it defines, and every dependent with it; an error XLA reports
  while a computation runs reaches every array computed from it. A peer whose executor the
  server found gone (`peers_lost`) fails at once what the runs taken so far wait for from it.
- A run's loops end, failed, at their next test once the run is cancelled (`cancel`: its
  client closed) or has run past its message's `limit` on this host: a loop of 2**31
  iterations does not hold the host for everyone else.
- `held()` counts what the runner holds for runs in progress (`executors.stats.Held`):
  nothing once they have finished.
- A traced run (`RunMessage.trace`) records its wait for its turn, for executables and for
  arguments, and each step as a span (`executors.tracing`), each computation waited for as
  it runs; an untraced one tests the flag once per message and once per step.
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
from collections.abc import Callable, Collection, MutableMapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from executors import control
from executors.compile import HostArray, on_devices, place
from executors.computing import Computations
from executors.control import DEAD, Frames, Layout, blocked
from executors.issued import Issued
from executors.iterations import run_frame
from executors.liveness import dead_after
from executors.mail import Mail
from executors.messages import Abort, Failed, Payload, RunMessage
from executors.payloads import part_tag, payload_of, received
from executors.stacks import StackMemory, Stacks
from executors.stats import Held
from executors.store import BufferStore, Failure
from executors.tracing import Recorder, Traces, event_of, finished
from ir import Compute, HostPlan, Pop, Push, Recv, Reshard, Send
from ir.plan import Count, Enter, Exit, Merge, NextIteration, Switch, defines

log = logging.getLogger("isthmus.executors")
IN_FLIGHT = 8  # computations issued and not known finished, per host (see docs/architecture.md)
Deliver = Callable[[str, str, str, Payload], None]  # (to host, run id, tag, payload)


@dataclass
class _Run:
    env: dict[str, Any] = field(default_factory=dict)  # value -> jax.Array, Failure, DEAD or LIVE
    frames: Frames = field(default_factory=Frames)  # the open loop frames and their iterations
    failure: Failure | None = None  # an executable of its plan that did not compile: every result fails
    stacks: Stacks = field(default_factory=Stacks)  # its loops' saved values (reverse mode)


class Runner:
    def __init__(self, host: str, store: BufferStore, executable: Callable[[str], Future[Any]],
                 deliver: Deliver, failed: Callable[[str], None] = lambda cause: None,
                 in_flight: int = IN_FLIGHT, temp_budget: int | None = None,
                 stack_budget: int | None = None, swap_budget: int | None = 0) -> None:
        """`temp_budget`: bytes of XLA temporaries the computations in flight may take
        together (`executors.memory`); `stack_budget`: bytes the runs' loop stacks may hold
        together on the devices, and `swap_budget` swapped to host memory
        (`executors.stacks`); None, not bounded."""
        self.host = host
        self.stack_memory = StackMemory(stack_budget, swap_budget)
        self.store = store
        self._deliver = deliver
        self._failed = failed  # told every step failure's cause (the host watches for collectives)
        self._plans: dict[str, HostPlan] = {}
        self._runs: dict[str, _Run] = {}
        self._lock = threading.Lock()  # `_runs`, read by `held` on other threads
        self.mail = Mail(host)
        self.issued = Issued(in_flight, failed, temp_budget)  # computations issued, not known finished
        self.computations = Computations(executable, self.issued)
        self._dead: dict[str, tuple[tuple[str, ...], ...]] = {}  # plan key -> values dead after each step
        self._layouts: dict[str, Layout] = {}  # plan key -> its frames (loop heads)
        self.traces = Traces(host)  # what traced runs did here

    # -- on arrival (actor thread) ---------------------------------------------------------

    def accept(self, message: RunMessage, plan: HostPlan | None) -> Callable[[], list[Any]]:
        """Cache the plan, open the mailboxes of the message's receives; return the op to
        sequence, which returns the outputs of the computations it issued and left unfinished.

        Messages can arrive out of order; a plan travels with the first message of its key,
        which has the lower sequence number, so by the op's turn the plan is here.
        """
        if plan is not None:
            self._plans[message.plan_key] = plan
        self.mail.take(message.run_id)
        if message.trace:
            self.traces.arrived(message.run_id, message.lo)
        known = plan or self._plans.get(message.plan_key)
        if known is not None:
            layout = self._layout(known)
            for i in range(message.lo, message.hi):
                step = known.steps[i]
                if isinstance(step, Recv) and layout.inside(i) is None:  # in a loop: keyed per iteration
                    for source in step.sources:
                        self.mail.box(message.run_id, part_tag(step.tag, source))
        return lambda: self._execute(message, plan)

    def deliver(self, run_id: str, tag: str, payload: Payload) -> None:
        """A peer's `Send` arrived (dropped if its run has finished here: nobody will read it)."""
        self.mail.deliver(run_id, tag, payload)

    def abort_open(self, cause: str) -> int:
        """Fail every receive still waiting (its sender will not send: the server that ran
        it is gone, `Host.adopt`); returns how many."""
        return self.mail.fail_open(cause)

    def peers_lost(self, hosts: Collection[str], cause: str) -> int:
        """These hosts' executors are gone: every run taken here so far fails what it still
        waits for from them (now, or when it gets there), rather than waiting out its
        timeout on this host's dispatch thread. Runs taken after this are the new executors'
        peers' and wait as usual. Returns how many runs it told."""
        return self.mail.peers_lost(hosts, cause)

    def taken(self) -> list[str]:
        """The runs with a message taken here and not finished yet."""
        return self.mail.taken()

    def cancel(self, run_ids: Collection[str], cause: str) -> int:
        """Stop these runs, of those taken here: each loop of theirs ends at its next test
        (its predicate fails with `cause`, and the peers are told as for any failed
        predicate), and what they wait for from peers fails now. A computation already
        issued runs to its end (`server.healing` stops a host busy with one for good).
        Returns how many runs it stopped."""
        return self.mail.cancel(run_ids, cause)

    # -- in turn (dispatch thread) ---------------------------------------------------------

    def forget(self, plan_keys: Sequence[str], executables: Sequence[str] = ()) -> None:
        """Drop cached plans no program uses any more (the server sends a plan again with
        the next run that needs it), and what is known of forgotten executables."""
        for key in plan_keys:
            self._plans.pop(key, None)
            self._dead.pop(key, None)
            self._layouts.pop(key, None)
        self.computations.forget(executables)

    @property
    def plans(self) -> int:
        return len(self._plans)

    def held(self) -> Held:
        """What is held for runs in progress (a finished run holds none of it)."""
        with self._lock:
            runs = list(self._runs.values())
        mailboxes, taken, stopping, limited, aborted = self.mail.held()
        stacked = [r.stacks.held() for r in runs]
        return Held(len(runs), sum(len(r.frames) for r in runs), mailboxes, taken, stopping, limited, aborted,
                    *(sum(column) for column in zip(*stacked, strict=True)) if stacked else (0, 0, 0))

    def _layout(self, plan: HostPlan) -> Layout:
        layout = self._layouts.get(plan.key)
        if layout is None:
            layout = self._layouts[plan.key] = Layout.of(plan)
        return layout

    def _execute(self, message: RunMessage, carried: HostPlan | None = None) -> list[Any]:
        # A plan the message carried is used as is: a `forget` numbered before this message
        # may have dropped it from the cache after the message arrived.
        if carried is not None:
            self._plans[message.plan_key] = carried
        plan = carried or self._plans.get(message.plan_key)
        if plan is None:
            cause = f"host {self.host} has no plan {message.plan_key} (the server must send it first)"
            self._fail_results(message, Failure(cause))
            if message.final:
                self._finish(message.run_id)
            return self.issued.outputs()
        with self._lock:
            run = self._runs.get(message.run_id)
            if run is None:
                run = self._runs[message.run_id] = _Run(stacks=Stacks(self.stack_memory))
                self.mail.limit(message.run_id, message.limit)
        rec = self._recorder(message) if message.trace else None
        started = 0 if rec is None else time.time_ns()
        if message.lo == 0:
            run.failure = self.computations.uncompiled(plan, message.timeout)
            if rec is not None:
                rec.span("executables", "wait", started, {"compiles": len(plan.compiles)})
                started = time.time_ns()
        for value, buffer_id in message.args:
            if value not in run.env:
                run.env[value] = run.failure or self._argument(buffer_id, message.timeout)
        if rec is not None and message.args:
            rec.span("arguments", "wait", started, {"buffers": len(message.args)})
        dead = self._dead_after(plan)
        i = message.lo
        while i < message.hi:  # a loop's NextIteration jumps back to its head
            here, step = i, plan.steps[i]
            if isinstance(step, Enter) and step.parallel > 1:  # the whole loop, iterations overlapping
                i = self._parallel(message, plan, i, run, rec)
                ran: Sequence[int] = range(here, i)  # its steps, its Exit included
            else:
                i = (self._step(message, plan, i, run.env, run.frames) if rec is None
                     else self._traced(rec, message, plan, i, run.env, run.frames))
                ran = (here,)
            for j in ran:
                for value in dead[j]:  # no later step reads it, and it is no result: free it now
                    run.env.pop(value, None)
        if message.final:
            for value, buffer_id in message.results:
                outcome = run.failure or run.env.get(value, DEAD)
                if outcome is DEAD:
                    outcome = Failure(f"run {message.run_id}: {value} was never produced")
                if isinstance(outcome, Failure):
                    self.store.fail(buffer_id, outcome)
                else:
                    self.store.set(buffer_id, on_devices(outcome))
            self._finish(message.run_id)
        return self.issued.outputs()

    def _dead_after(self, plan: HostPlan) -> tuple[tuple[str, ...], ...]:
        """Per step, the values to free after it (`executors.liveness`), once per plan."""
        dead = self._dead.get(plan.key)
        if dead is None:
            dead = self._dead[plan.key] = dead_after(plan, self._layout(plan))
        return dead

    def _argument(self, buffer_id: str, timeout: float) -> Any:
        try:
            return self.store.future(buffer_id).result(timeout)
        except Failure as f:
            return f
        except FutureTimeout:
            return Failure(f"argument {buffer_id} was not ready within {timeout:g}s")

    def _finish(self, run_id: str) -> None:
        """Forget the run: its environment, its stacks, its mailboxes, and any delivery still
        to come."""
        with self._lock:
            run = self._runs.pop(run_id, None)
        if run is not None:
            run.stacks.drop()
        self.mail.finish(run_id)

    def _fail_results(self, message: RunMessage, failure: Failure) -> None:
        for _, buffer_id in message.results:
            self.store.fail(buffer_id, failure)

    def _parallel(self, message: RunMessage, plan: HostPlan, i: int, run: _Run, rec: Recorder | None) -> int:
        """The loop entered at step i, up to its `parallel` iterations at once; the index
        after its Exit."""
        def step(j: int, env: MutableMapping[str, Any], frames: Frames, deadline: float | None) -> int:
            if rec is not None:
                return self._traced(rec, message, plan, j, env, frames, deadline)
            return self._step(message, plan, j, env, frames, deadline)

        def mailboxes(recv: Recv, frames: Frames) -> list[Future[Payload]]:
            return [self.mail.box(message.run_id, frames.tag(part_tag(recv.tag, source)))
                    for source in recv.sources]

        return run_frame(plan, i, self._layout(plan), run.env, run.frames, step, mailboxes, message.timeout)

    def _recorder(self, message: RunMessage) -> Recorder:
        """The traced run's recorder, its message's wait for its turn recorded."""
        rec = self.traces.open(message.run_id)
        arrived = rec.arrived_ns.pop(message.lo, None)
        if arrived is not None:
            rec.span("its turn", "queue", arrived, {"steps": f"{message.lo}..{message.hi}"})
        return rec

    def _traced(self, rec: Recorder, message: RunMessage, plan: HostPlan, i: int,
                env: MutableMapping[str, Any], frames: Frames, deadline: float | None = None) -> int:
        """`_step`, recorded: a computation is waited for, so that its span is its run."""
        where = frames.where()
        start = time.time_ns()
        after = self._step(message, plan, i, env, frames, deadline)
        step = plan.steps[i]
        if isinstance(step, Compute):
            for value in step.outputs:
                finished(env.get(value))
        rec.add(event_of(step, i, self.host, self._layout(plan).loops.get(i), frames, where, start))
        return after

    def _step(self, message: RunMessage, plan: HostPlan, i: int, env: MutableMapping[str, Any],
              frames: Frames, deadline: float | None = None) -> int:
        """Run step i in `env` at `frames` (a receive waits until `deadline`, monotonic, if
        given); the index of the next step (a loop's last step may jump back)."""
        step = plan.steps[i]
        guard = plan.guard(i)
        guarded = None if guard is None else blocked([env.get(guard, DEAD)])
        try:
            if guarded is None and isinstance(step, Compute):  # the common step, tested first
                self.computations.compute(step, env, frames, message.run_id, message.timeout)
                return i + 1
            if isinstance(step, Enter | Merge | Switch | NextIteration | Exit | Count):
                layout = self._layout(plan)
                loop = layout.loops.get(i)
                if isinstance(step, Exit) and step.trips is not None:
                    return self._exit_counted(message.run_id, plan, i, step, env, frames, layout, guarded)
                if isinstance(step, Switch) and loop is not None and blocked([env[step.pred]]) is None:
                    stop = self.mail.stopped(message.run_id)
                    if stop is not None:  # the loop ends here, failed, on every host
                        env[step.pred] = Failure(stop)
                after = control.step(step, i, env, frames, layout, guarded)
                if isinstance(step, Switch) and loop is not None and isinstance(env[step.pred], Failure):
                    self._abort(message.run_id, frames, layout.peers[loop], env[step.pred])  # leaving it
                return after
            if guarded is not None and not isinstance(step, Recv):  # a dead or failed branch
                if isinstance(step, Send):
                    self._send(message.run_id, step, guarded, frames)
                for value in defines(step):
                    env[value] = guarded
            elif isinstance(step, Reshard):
                value = env[step.input]
                env[step.output] = blocked([value]) or place(
                    value.array if isinstance(value, HostArray) else value, step.mesh, step.spec)
            elif isinstance(step, Send):
                self._send(message.run_id, step, env[step.input], frames)
            elif isinstance(step, Recv):
                env[step.output] = self._receive(message, step, frames, deadline)
            elif isinstance(step, Push | Pop):
                self._stack(message.run_id, step, env, frames)
        except Exception:
            where = f" in {frames.where()}" if len(frames) else ""
            failure = Failure(f"{type(step).__name__.lower()} on host {self.host}{where} failed:\n"
                              f"{traceback.format_exc(limit=8)}")
            for value in defines(step):
                env[value] = failure
            self._failed(failure.cause)
            if isinstance(step, Send):  # the peers wait for this tag: they get the cause
                sent = frames.tag(part_tag(step.tag, self.host))
                for to in step.to:
                    try:
                        self._deliver(to, message.run_id, sent, Failed(failure.cause))
                    except Exception:  # the peer is gone: its own waits are bounded
                        log.exception("host %s: cannot tell host %s why tag %s failed", self.host, to,
                                      step.tag)
        return i + 1

    def _exit_counted(self, run_id: str, plan: HostPlan, i: int, step: Exit, env: MutableMapping[str, Any],
                      frames: Frames, layout: Layout, guarded: Any) -> int:
        """Leave a loop whose trip count its gradient's `REPEAT` takes back: save how many
        iterations it ran (its predicate's failure, if it failed; nothing if it never ran, in
        a branch not taken)."""
        test = next(plan.steps[j] for j, frame in layout.loops.items() if frame == step.frame)
        assert isinstance(test, Switch) and step.trips is not None
        pred, trips = env.get(test.pred, DEAD), np.int32(frames.stack[-1][1])
        after = control.step(step, i, env, frames, layout, guarded)
        if pred is not DEAD:
            name = f"%{step.frame}.trips"
            saved = {name: pred if isinstance(pred, Failure) else trips}
            self._stack(run_id, Push(name, step.trips, step.trips_depth, swap=False), saved, frames)
        return after

    def _stack(self, run_id: str, step: Push | Pop, env: MutableMapping[str, Any], frames: Frames) -> None:
        with self._lock:
            run = self._runs.get(run_id)
        if run is None:  # (finished meanwhile: cancelled)
            raise RuntimeError(f"run {run_id} has finished")
        if isinstance(step, Pop):
            env[step.output] = run.stacks.pop(step.stack, step.depth, frames)
            return
        failure = run.stacks.push(step.stack, step.depth, frames, env[step.input], step.swap)
        if failure is not None:  # no room for it on this host: the run stops, the host serves on
            self.cancel([run_id], f"run {run_id} on host {self.host}: {failure.cause}")

    def _abort(self, run_id: str, frames: Frames, peers: frozenset[str], failure: Failure) -> None:
        """Tell the loop's peers this host has left it, so none waits for what it would send."""
        abort = Abort(self.host, frames.prefix(), f"host {self.host} left loop {frames.where()} "
                                                  f"early: {failure.cause}")
        for peer in sorted(peers):
            try:
                self._deliver(peer, run_id, "abort", abort)
            except Exception:  # the peer is gone: its own waits are bounded
                log.exception("host %s: cannot tell host %s it left a loop", self.host, peer)

    def _send(self, run_id: str, step: Send, value: Any, frames: Frames) -> None:
        sent = payload_of(value)
        for to in step.to:
            self._deliver(to, run_id, frames.tag(part_tag(step.tag, self.host)), sent)

    def _receive(self, message: RunMessage, step: Recv, frames: Frames, deadline: float | None = None) -> Any:
        """Every source host's part, within the run's timeout (or until `deadline`); the
        whole value, placed."""
        if deadline is None:
            deadline = time.monotonic() + message.timeout
        parts: list[Payload] = []
        tags = [frames.tag(part_tag(step.tag, source)) for source in step.sources]
        try:
            for source, source_tag in zip(step.sources, tags, strict=True):
                fut = self.mail.box(message.run_id, source_tag)
                try:
                    parts.append(fut.result(max(0.0, deadline - time.monotonic())))
                except FutureTimeout:
                    return Failure(f"no data from host {source} for {step.output} (tag {step.tag}) "
                                   f"within {message.timeout:g}s")
        finally:
            self.mail.close(message.run_id, tags)
        return received(parts, step)
