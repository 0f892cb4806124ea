"""Runs one host's part of a program (`ir.plan.HostPlan`) on that host's dispatch thread.

Every computation an executor runs goes through here: a single call is a one-node program.

Contract:
- One run message carries a range of the host's plan steps (all of them under parallel
  dispatch, one under sequential dispatch). A mailbox per `(run, tag)` is opened by
  whichever comes first, the peer's delivery or the message (when its plan is already
  here), so a peer's data can land while earlier work is still running. A finished run
  leaves no mailbox, and deliveries that come after it are dropped.
- Steps run in plan order on the host's dispatch thread, the only thread that issues
  computations to XLA. A computation on this host's devices is issued without waiting for
  it (XLA's asynchronous dispatch: its outputs are futures that later steps consume), and
  `executors.issued` bounds those left unfinished (`in_flight` of them, not counting those
  a later one read from). A computation spanning hosts (an island's JAX group) runs alone:
  every issued computation finishes first, and it finishes before the next step. Values
  of a run live in a per-run environment; only the program's results enter the store.
- `Send` hands the value (host memory, numpy) straight to every host of the receiving
  slice through the injected `deliver`, never through the server: `Whole` from a slice on
  one host, this host's distinct `Shards` from a slice spanning hosts. Deliveries are
  tagged `<tag>@<sending host>`, so a `Recv` from a slice spanning hosts waits for each of
  them, assembles the whole value and places its part (a value for this process's devices
  alone stays in host memory, a `HostArray`, until a computation takes it as its argument:
  JAX places it as it calls). A failed value is sent as its
  `Failed` cause, so the peer's dependents fail with the same cause.
- Loops and branches (`ir.plan`'s Switch / Merge / Enter / Exit / NextIteration) run as
  the per-host state machine of `executors.control`: a `NextIteration` may send the step
  index back to its loop's `Merge`, a run's `Frames` tag every send and receive inside a
  frame with the frame and iteration, a step under a dead guard (or reading a dead value)
  defines dead values without running, and a `Send` of a dead value delivers `Dead`, so a
  host whose branch was not taken finishes. The predicate comes from its host as a value
  like any other, so no iteration involves the server. A loop whose `Enter` allows more
  than one iteration at once runs whole in `executors.iterations` (its iterations'
  steps interleaved on this thread), the rest of the plan around it as above.
- A failure never hangs: a `Recv` or an executable that does not arrive within the run's
  timeout fails the value it defines, and every dependent with it; an error XLA reports
  while a computation runs reaches every array computed from it. A peer whose executor the
  server found gone (`peers_lost`) fails at once what the runs taken so far wait for from it.
- A run's loops end, failed, at their next test once the run is cancelled (`cancel`: its
  client closed) or has run past its message's `limit` on this host: a loop of 2**31
  iterations does not hold the host for everyone else.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Collection, MutableMapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from executors import control
from executors.compile import HostArray, host_copy, on_devices, place, sharding_of
from executors.control import DEAD, Frames, Layout, aborted, blocked
from executors.issued import Issued
from executors.iterations import run_frame
from executors.liveness import dead_after
from executors.memory import working_bytes
from executors.messages import Abort, Dead, Failed, Payload, Shards, Whole
from executors.shards import distinct_shards, whole
from executors.store import BufferStore, Failure
from ir import Compute, HostPlan, Recv, Reshard, Send
from ir.plan import Enter, Exit, Merge, NextIteration, Switch, defines

log = logging.getLogger("isthmus.executors")
FINISHED_RUNS = 4096  # finished run ids remembered, so late deliveries to them are dropped
IN_FLIGHT = 8  # computations issued and not known finished, per host (see docs/architecture.md)
FITTING_KEPT = 1024  # pairs of shardings known to fit each other, or not
Deliver = Callable[[str, str, str, Payload], None]  # (to host, run id, tag, payload)


@dataclass
class RunMessage:
    """One run message: which steps of which plan, and the run's buffer bindings."""

    run_id: str
    plan_key: str
    lo: int
    hi: int
    args: Sequence[tuple[str, str]]  # (value, buffer id)
    results: Sequence[tuple[str, str]]  # (value, buffer id)
    final: bool
    timeout: float
    limit: float = math.inf  # the most seconds the run may loop on this host (from its first message)


@dataclass(frozen=True)
class _Executable:
    in_shardings: tuple[Any, ...]
    spans_hosts: bool  # its shardings name devices of other processes (an island's JAX group)
    temp: int  # bytes of temporaries it allocates on this host while it runs (`executors.memory`)


@dataclass
class _Run:
    env: dict[str, Any] = field(default_factory=dict)  # value -> jax.Array, Failure, DEAD or LIVE
    frames: Frames = field(default_factory=Frames)  # the open loop frames and their iterations
    failure: Failure | None = None  # an executable of its plan that did not compile: every result fails


class Runner:
    def __init__(self, host: str, store: BufferStore, executable: Callable[[str], Future[Any]],
                 deliver: Deliver, failed: Callable[[str], None] = lambda cause: None,
                 in_flight: int = IN_FLIGHT, temp_budget: int | None = None) -> None:
        """`temp_budget`: bytes of XLA temporaries the computations in flight may take
        together (`executors.memory`); None, not bounded."""
        self.host = host
        self.store = store
        self._executable = executable
        self._deliver = deliver
        self._failed = failed  # told every step failure's cause (the host watches for collectives)
        self._plans: dict[str, HostPlan] = {}
        self._runs: dict[str, _Run] = {}
        self._mail: dict[tuple[str, str], Future[Payload]] = {}
        self._finished: deque[str] = deque(maxlen=FINISHED_RUNS)
        self._finished_set: set[str] = set()
        self._taken: set[str] = set()  # runs with a message taken here, not yet finished
        self._stops: dict[str, str] = {}  # run -> why its loops end now (`cancel`)
        self._deadlines: dict[str, float] = {}  # run -> when its loops end (monotonic, `limit`)
        self._lock = threading.Lock()
        self.issued = Issued(in_flight, failed, temp_budget)  # computations issued, not known finished
        self._dead: dict[str, tuple[tuple[str, ...], ...]] = {}  # plan key -> values dead after each step
        self._layouts: dict[str, Layout] = {}  # plan key -> its frames (loop heads)
        self._aborts: dict[str, list[Abort]] = {}  # run -> peers that left a loop early
        self._executables: dict[str, _Executable] = {}  # by key: what each step needs of it
        self._ready: dict[str, tuple[Any, _Executable]] = {}  # by key: the compiled executable
        self._fitting: dict[tuple[int, int, int], tuple[Any, Any, bool]] = {}  # `_fits`, known

    # -- on arrival (actor thread) ---------------------------------------------------------

    def accept(self, message: RunMessage, plan: HostPlan | None) -> Callable[[], list[Any]]:
        """Cache the plan, open the mailboxes of the message's receives; return the op to
        sequence, which returns the outputs of the computations it issued and left unfinished.

        Messages can arrive out of order; a plan travels with the first message of its key,
        which has the lower sequence number, so by the op's turn the plan is here.
        """
        if plan is not None:
            self._plans[message.plan_key] = plan
        with self._lock:
            if message.run_id not in self._finished_set:
                self._taken.add(message.run_id)
        known = plan or self._plans.get(message.plan_key)
        if known is not None:
            layout = self._layout(known)
            for i in range(message.lo, message.hi):
                step = known.steps[i]
                if isinstance(step, Recv) and layout.inside(i) is None:  # in a loop: keyed per iteration
                    for source in step.sources:
                        self._mailbox(message.run_id, _tag(step.tag, source))
        return lambda: self._execute(message, plan)

    def deliver(self, run_id: str, tag: str, payload: Payload) -> None:
        """A peer's `Send` arrived (dropped if its run has finished here: nobody will read it)."""
        with self._lock:
            if run_id in self._finished_set:
                return
            if isinstance(payload, Abort):  # what that host would still send fails now
                self._aborts.setdefault(run_id, []).append(payload)
                for (run, key), fut in self._mail.items():
                    if run == run_id and aborted(key, payload) and not fut.done():
                        fut.set_result(Failed(payload.cause))
                return
        fut = self._mailbox(run_id, tag)
        if not fut.done():
            fut.set_result(payload)

    def abort_open(self, cause: str) -> int:
        """Fail every receive still waiting (its sender will not send: the server that ran
        it is gone, `Host.adopt`); returns how many."""
        with self._lock:
            waiting = [fut for fut in self._mail.values() if not fut.done()]
        for fut in waiting:
            if not fut.done():
                fut.set_result(Failed(cause))
        return len(waiting)

    def peers_lost(self, hosts: Collection[str], cause: str) -> int:
        """These hosts' executors are gone: every run taken here so far fails what it still
        waits for from them (now, or when it gets there), rather than waiting out its
        timeout on this host's dispatch thread. Runs taken after this are the new executors'
        peers' and wait as usual. Returns how many runs it told."""
        with self._lock:
            runs = self._taken | {run for run, _ in self._mail}
        for run in runs:
            for host in hosts:
                self.deliver(run, "abort", Abort(host, "", cause))
        return len(runs)

    def taken(self) -> list[str]:
        """The runs with a message taken here and not finished yet."""
        with self._lock:
            return list(self._taken)

    def cancel(self, run_ids: Collection[str], cause: str) -> int:
        """Stop these runs, of those taken here: each loop of theirs ends at its next test
        (its predicate fails with `cause`, and the peers are told as for any failed
        predicate), and what they wait for from peers fails now. A computation already
        issued runs to its end (`server.healing` stops a host busy with one for good).
        Returns how many runs it stopped."""
        with self._lock:
            stopped = [r for r in run_ids if r in self._taken]
            for r in stopped:
                self._stops[r] = cause
            waiting = [fut for (run, _), fut in self._mail.items() if run in self._stops and not fut.done()]
        for fut in waiting:
            if not fut.done():
                fut.set_result(Failed(cause))
        return len(stopped)

    def _mailbox(self, run_id: str, tag: str) -> Future[Payload]:
        with self._lock:
            fut = self._mail.get((run_id, tag))
            if fut is None:
                fut = self._mail[run_id, tag] = Future()
                abort = next((a for a in self._aborts.get(run_id, ()) if aborted(tag, a)), None)
                if abort is not None:
                    fut.set_result(Failed(abort.cause))
                elif run_id in self._stops:
                    fut.set_result(Failed(self._stops[run_id]))
            return fut

    def _stopped(self, message: RunMessage) -> str | None:
        """Why the run's loops must end now (cancelled, or past its limit), if they must."""
        cause = self._stops.get(message.run_id)
        if cause is None and time.monotonic() > self._deadlines.get(message.run_id, math.inf):
            cause = f"run {message.run_id} looped past its limit of {message.limit:g}s on host {self.host}"
        return cause

    # -- in turn (dispatch thread) ---------------------------------------------------------

    def forget(self, plan_keys: Sequence[str], executables: Sequence[str] = ()) -> None:
        """Drop cached plans no program uses any more (the server sends a plan again with
        the next run that needs it), and what is known of forgotten executables."""
        for key in plan_keys:
            self._plans.pop(key, None)
            self._dead.pop(key, None)
            self._layouts.pop(key, None)
        for key in executables:
            self._executables.pop(key, None)
            self._ready.pop(key, None)

    @property
    def plans(self) -> int:
        return len(self._plans)

    def open_state(self) -> dict[str, int]:
        """Runs, loop frames and mailboxes held now (a finished run holds none of them)."""
        with self._lock:
            return {"runs": len(self._runs), "frames": sum(len(r.frames) for r in list(self._runs.values())),
                    "mailboxes": len(self._mail)}

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
                run = self._runs[message.run_id] = _Run()
                if message.limit < math.inf:
                    self._deadlines[message.run_id] = time.monotonic() + message.limit
        if message.lo == 0:
            run.failure = self._uncompiled(plan, message.timeout)
        for value, buffer_id in message.args:
            if value not in run.env:
                run.env[value] = run.failure or self._argument(buffer_id, message.timeout)
        dead = self._dead_after(plan)
        i = message.lo
        while i < message.hi:  # a loop's NextIteration jumps back to its head
            here, step = i, plan.steps[i]
            if isinstance(step, Enter) and step.parallel > 1:  # the whole loop, iterations overlapping
                i = self._parallel(message, plan, i, run)
                ran: Sequence[int] = range(here, i)  # its steps, its Exit included
            else:
                i = self._step(message, plan, i, run.env, run.frames)
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

    def _uncompiled(self, plan: HostPlan, timeout: float) -> Failure | None:
        """Why an executable of the plan is not there (waited for up to `timeout`), or None.
        A run fails whole when one of its computations does not compile, taken or not, as a
        `jax.jit` of the program would: whether it ran would otherwise depend on when the
        compiler's answer came (its values then fail from the start, so its peers hear why)."""
        for job in plan.compiles:
            if job.key in self._ready:
                continue
            try:
                exe = self._executable(job.key).result(timeout)
            except FutureTimeout:
                return Failure(f"executable {job.key} not compiled within {timeout:g}s")
            except Failure as f:
                return Failure(f"a computation of the program ({job.key}) did not compile: {f.cause}")
            self._ready[job.key] = (exe, self._known(job.key, exe))
        return None

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
        """Forget the run: its environment, its mailboxes, and any delivery still to come."""
        with self._lock:
            self._runs.pop(run_id, None)
            self._taken.discard(run_id)
            self._stops.pop(run_id, None)
            self._deadlines.pop(run_id, None)
            self._aborts.pop(run_id, None)
            for key in [k for k in self._mail if k[0] == run_id]:
                del self._mail[key]
            if len(self._finished) == self._finished.maxlen:
                self._finished_set.discard(self._finished[0])
            self._finished.append(run_id)
            self._finished_set.add(run_id)

    def _fail_results(self, message: RunMessage, failure: Failure) -> None:
        for _, buffer_id in message.results:
            self.store.fail(buffer_id, failure)

    def _parallel(self, message: RunMessage, plan: HostPlan, i: int, run: _Run) -> int:
        """The loop entered at step i, up to its `parallel` iterations at once; the index
        after its Exit."""
        def step(j: int, env: MutableMapping[str, Any], frames: Frames, deadline: float | None) -> int:
            return self._step(message, plan, j, env, frames, deadline)

        def mailboxes(recv: Recv, frames: Frames) -> list[Future[Payload]]:
            return [self._mailbox(message.run_id, frames.tag(_tag(recv.tag, source)))
                    for source in recv.sources]

        return run_frame(plan, i, self._layout(plan), run.env, run.frames, step, mailboxes, message.timeout)

    def _step(self, message: RunMessage, plan: HostPlan, i: int, env: MutableMapping[str, Any],
              frames: Frames, deadline: float | None = None) -> int:
        """Run step i in `env` at `frames` (a receive waits until `deadline`, monotonic, if
        given); the index of the next step (a loop's last step may jump back)."""
        step = plan.steps[i]
        guard = plan.guard(i)
        guarded = None if guard is None else blocked([env.get(guard, DEAD)])
        try:
            if guarded is None and isinstance(step, Compute):  # the common step, tested first
                self._compute(step, env, message, frames)
                return i + 1
            if isinstance(step, Enter | Merge | Switch | NextIteration | Exit):
                layout = self._layout(plan)
                if isinstance(step, Switch) and i in layout.loops and blocked([env[step.pred]]) is None:
                    stop = self._stopped(message)
                    if stop is not None:  # the loop ends here, failed, on every host
                        env[step.pred] = Failure(stop)
                after = control.step(step, i, env, frames, layout, guarded)
                if i in layout.loops and isinstance(env[step.pred], Failure):  # leaving the loop
                    self._abort(message.run_id, frames, layout.peers[layout.loops[i]], env[step.pred])
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
        except Exception:
            where = f" in {frames.where()}" if len(frames) else ""
            failure = Failure(f"{type(step).__name__.lower()} on host {self.host}{where} failed:\n"
                              f"{traceback.format_exc(limit=8)}")
            for value in defines(step):
                env[value] = failure
            self._failed(failure.cause)
            if isinstance(step, Send):  # the peers wait for this tag: they get the cause
                tag = frames.tag(_tag(step.tag, self.host))
                for to in step.to:
                    try:
                        self._deliver(to, message.run_id, tag, Failed(failure.cause))
                    except Exception:  # the peer is gone: its own waits are bounded
                        log.exception("host %s: cannot tell host %s why tag %s failed", self.host, to,
                                      step.tag)
        return i + 1

    def _abort(self, run_id: str, frames: Frames, peers: frozenset[str], failure: Failure) -> None:
        """Tell the loop's peers this host has left it, so none waits for what it would send."""
        abort = Abort(self.host, frames.prefix(), f"host {self.host} left loop {frames.where()} "
                                                  f"early: {failure.cause}")
        for peer in sorted(peers):
            try:
                self._deliver(peer, run_id, "abort", abort)
            except Exception:  # the peer is gone: its own waits are bounded
                log.exception("host %s: cannot tell host %s it left a loop", self.host, peer)

    def _compute(self, step: Compute, env: MutableMapping[str, Any], message: RunMessage,
                 frames: Frames) -> None:
        args = [env[v] for v in step.inputs]
        failure = blocked(args)
        ready = self._ready.get(step.key)
        if failure is None and ready is None:
            try:
                exe = self._executable(step.key).result(message.timeout)
                ready = self._ready[step.key] = (exe, self._known(step.key, exe))
            except FutureTimeout:
                where = f" (in {frames.where()})" if len(frames) else ""
                failure = Failure(f"{step.label}{where}: executable {step.key} not compiled "
                                  f"within {message.timeout:g}s")
            except Failure as f:  # it failed to compile: where in the loops it was wanted, if in one
                failure = Failure(f"{step.label} (in {frames.where()}): {f.cause}") if len(frames) else f
        if failure is not None or ready is None:
            for value in step.outputs:
                env[value] = failure
            return
        exe, known = ready
        if known.spans_hosts:
            args = [on_devices(a) for a in args]
        args = [self._laid_out(a, s) for a, s in zip(args, known.in_shardings, strict=True)]
        if known.spans_hosts:
            import jax

            self.issued.drain()  # alone: nothing else of this host in flight while its collectives run
            results = jax.block_until_ready(exe(*args))
        else:
            self.issued.make_room(args, known.temp)
            results = exe(*args)
            self.issued.issue(step.label, args, results, known.temp, message.run_id)
        env.update(zip(step.outputs, results, strict=True))

    def _laid_out(self, value: Any, sharding: Any) -> Any:
        """The argument as the executable takes it: a received array as it is (JAX places it
        as it calls), an array laid out otherwise resharded."""
        if isinstance(value, HostArray):
            return value.array
        if self._fits(value, sharding):
            return value
        import jax

        return jax.device_put(value, sharding)

    def _fits(self, array: Any, sharding: Any) -> bool:
        """Whether the array is laid out as the executable takes it. Asked once per pair of
        sharding objects (a chain's outputs share one object, its inputs another), as the
        comparison costs more than issuing a small computation's share of it."""
        if array.sharding is sharding:
            return True
        pair = (id(array.sharding), id(sharding), array.ndim)
        known = self._fitting.get(pair)
        if known is not None and known[0] is array.sharding and known[1] is sharding:
            return known[2]
        if len(self._fitting) >= FITTING_KEPT:
            self._fitting.clear()
        fits = array.sharding.is_equivalent_to(sharding, array.ndim)
        self._fitting[pair] = (array.sharding, sharding, fits)  # (kept alive: ids stay theirs)
        return fits

    def _known(self, key: str, exe: Any) -> _Executable:
        """What a step needs of an executable each time, worked out once per key."""
        known = self._executables.get(key)
        if known is None:
            import jax

            shardings = exe.input_shardings[0]
            every = jax.tree_util.tree_leaves((exe.input_shardings, exe.output_shardings))
            known = self._executables[key] = _Executable(
                tuple(shardings), not all(s.is_fully_addressable for s in every), working_bytes(exe)[0])
        return known

    def _send(self, run_id: str, step: Send, value: Any, frames: Frames) -> None:
        payload: Payload
        if value is DEAD:  # the dead signal crosses hosts, so the peer's branch finishes too
            payload = Dead()
        elif isinstance(value, Failure):
            payload = Failed(value.cause)
        elif isinstance(value, HostArray):  # received here, sent on as it came
            payload = Whole(value.array)
        elif value.is_fully_addressable:
            payload = Whole(host_copy(value))
        else:
            payload = Shards(distinct_shards(value, host_copy))
        for to in step.to:
            self._deliver(to, run_id, frames.tag(_tag(step.tag, self.host)), payload)

    def _receive(self, message: RunMessage, step: Recv, frames: Frames, deadline: float | None = None) -> Any:
        """Every source host's part, within the run's timeout (or until `deadline`); the
        whole value, placed."""
        if deadline is None:
            deadline = time.monotonic() + message.timeout
        parts: list[Payload] = []
        tags = [frames.tag(_tag(step.tag, source)) for source in step.sources]
        try:
            for source, tag in zip(step.sources, tags, strict=True):
                fut = self._mailbox(message.run_id, tag)
                try:
                    parts.append(fut.result(max(0.0, deadline - time.monotonic())))
                except FutureTimeout:
                    return Failure(f"no data from host {source} for {step.output} (tag {step.tag}) "
                                   f"within {message.timeout:g}s")
        finally:
            with self._lock:
                for tag in tags:
                    self._mail.pop((message.run_id, tag), None)
        failed = next((p for p in parts if isinstance(p, Failed)), None)
        if failed is not None:
            return Failure(failed.cause)
        if any(isinstance(p, Dead) for p in parts):
            return DEAD
        if len(parts) == 1 and isinstance(parts[0], Whole):
            value = parts[0].array
        else:
            value = whole([shard for p in parts
                           for shard in (p.shards if isinstance(p, Shards) else [(_full(p.array), p.array)])])
        if step.on_host:
            return value
        sharding = sharding_of(step.mesh, step.spec)
        if sharding.is_fully_addressable:  # placed by the computation that takes it
            return HostArray(value, sharding)
        return place(value, step.mesh, step.spec)


def _tag(tag: str, source: str) -> str:
    """The mailbox of one source host's part of a transfer."""
    return f"{tag}@{source}"


def _full(array: np.ndarray) -> list[tuple[int, int]]:
    return [(0, n) for n in array.shape]
