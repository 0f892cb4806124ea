"""One executor per host: the body of the Ray actor that owns a host's devices.

Contract:
- Every request that touches the buffer store carries a sequence number, given by the
  server per host, and the host takes requests strictly in that order on one dispatch
  thread, whatever order they arrive in (`executors.dispatch`). Because the server numbers
  requests in one global order, hosts never wait on each other in a cycle.
- Computations run only as program runs (`executors.runner`; a single call is a one-node
  program). The dispatch thread is the only thread that issues computations to XLA, and
  issues them without waiting for each (at most `in_flight` unfinished): with XLA's CPU
  thread pool sized for it (`executors.pool`), overlapped collectives cannot deadlock
  (docs/architecture.md, "Executors overlap").
- Buffers are futures twice over: a store entry exists from the moment its producer is
  taken, and holds a `jax.Array` that may still be computing. Readers wait off the event
  loop and answer `Ready` or `Failed` (`executors.messages`, `executors.reading`).
- Executables are compiled once per key, off the dispatch thread (`executors.executables`).
- `stats()` says what the host is doing and holds (`executors.stats.HostStats`).
- A failure never hangs: a failed computation fails its outputs with the remote traceback,
  and every computation reading a failed buffer fails with the same cause.

The class is plain Python (no Ray); `executors.pool` wraps it in a Ray actor.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from executors.compile import place
from executors.dispatch import Dispatch
from executors.executables import Executables
from executors.memory import MACHINE, Budget
from executors.messages import Abort, Adopted, Failed, Payload, Ran, Ready, Reply, State
from executors.reading import finished, kept, quick, raw, raw_shards, sound_among
from executors.runner import IN_FLIGHT, RunMessage, Runner
from executors.shards import Index
from executors.stats import HostStats
from executors.store import BufferStore, Failure
from executors.tracing import HostTrace
from ir import DeviceMesh, HostPlan, Spec, parse_dtype

log = logging.getLogger("isthmus.executors")


def _cause() -> str:
    return traceback.format_exc(limit=8)


class Host:
    def __init__(self, host: str, wait_timeout_s: float = 300.0, in_flight: int = IN_FLIGHT,
                 budget: Budget = MACHINE) -> None:
        self.host = host
        self.temp_budget = budget.temp_bytes()  # XLA temporaries its computations may take together
        self.buffer_budget = budget.buffer_bytes()  # buffers it may hold (the server counts them)
        self.wait_timeout_s = wait_timeout_s  # the longest a request waits for an executable
        self.store = BufferStore()
        self.executables = Executables(host, self.temp_budget)
        self.collective_error: str | None = None  # the first failed cross-host collective
        self._frozen = False  # start-up's objects frozen out of garbage collection (`info`)
        self.runner = Runner(host, self.store, self.executables.usable, self._deliver, self._failed,
                             in_flight, self.temp_budget, budget.stack_bytes(), budget.swap_bytes())
        self.dispatch = Dispatch(host, self.runner.issued)

    # -- the island's JAX distributed group ------------------------------------------------

    def join_group(self, coordinator: str, num_processes: int, process_id: int, timeout_s: int) -> None:
        """Join the island's JAX distributed group (before anything else touches JAX here).

        Every host of a multi-host island runs this at start-up, at once: from then on its
        JAX sees the island's devices, and a computation on a slice spanning hosts runs as
        one SPMD program, each host running its shards (CPU collectives over gloo).
        """
        import jax

        jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU islands; GPUs use NCCL
        # The coordinator (process 0) binds to the address it was given, the node's: JAX's
        # default is every interface, and its coordination service has no authentication.
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id, initialization_timeout=timeout_s,
                                   coordinator_bind_address=coordinator)
        # Creating the backend is itself a meeting of all the group's processes (they trade
        # topologies): do it now, while all join, not at whichever request first touches JAX.
        jax.devices()

    # -- inventory -------------------------------------------------------------------------

    def info(self) -> list[dict[str, Any]]:
        """The host's devices, with the memory each offers buffers: a GPU's own, a CPU
        device's share of the host's `buffer_budget` (`executors.memory`). The pool asks
        first once JAX's backend may exist (after the island's group formed): what exists
        then lives as long as the process, so it is frozen out of every later full garbage
        collection (a large cost per request)."""
        import jax

        devices = jax.local_devices()
        if not self._frozen:
            gc.freeze()
            self._frozen = True

        out = []
        for d in devices:
            stats = d.memory_stats() if hasattr(d, "memory_stats") else None
            memory = (stats or {}).get("bytes_limit")
            if d.platform == "cpu":
                memory = self.buffer_budget // len(devices)
            out.append({"platform": d.platform, "kind": d.device_kind, "memory_bytes": memory})
        return out

    def stats(self) -> HostStats:
        """What the host is doing; `waiting_for` names a sequence number that later requests
        wait behind (a request the server numbered that has not arrived yet)."""
        turn = self.dispatch.now()
        running, started, run = turn.running, turn.started, turn.run
        oldest = self.runner.issued.oldest_running()  # issued, and still running on the devices
        # The run this host has been busy with the longest: its op's, or one whose computation
        # still runs on the devices after its op went on (`server.healing` stops one that
        # outlives its client or its run's limit).
        busy = [(started, run)] if running is not None and run else []
        if oldest is not None:
            label, issued, of = oldest
            busy += [(issued, of)] if of else []
            if running is None:
                running, started = label, issued
        now = time.perf_counter()
        since, longest = min(busy, default=(now, None))
        return HostStats(
            host=self.host, pid=os.getpid(), queued=turn.queued, requests=turn.requests,
            completed=turn.completed, running=running,
            running_s=now - started if running is not None else None,
            longest_run=longest, longest_run_s=now - since if longest else None,
            waiting_for=turn.waiting_for, buffers=len(self.store), arrays=self._arrays(),
            executables=len(self.executables), plans=self.runner.plans, held=self.runner.held(),
            busy_s=turn.busy_s, unfinished=len(self.runner.issued), in_flight=self.runner.issued.bound,
            temp_budget_bytes=self.temp_budget, buffer_budget_bytes=self.buffer_budget,
            collective_error=self.collective_error)

    def _arrays(self) -> int:
        """Arrays alive in this process's JAX (device memory held), once JAX has started here
        (asking earlier would start it before the island's group forms)."""
        if not self._frozen:
            return 0
        import jax

        return len(jax.live_arrays())

    def _failed(self, cause: str) -> None:
        """A computation failed: remember the first failure of a cross-host collective, after
        which the island's group cannot run collectives again (gloo closes its connections)."""
        if self.collective_error is None and "Gloo" in cause:
            self.collective_error = cause.strip().splitlines()[-1][:500]
            log.error("host %s: a cross-host collective failed; the island's group is broken: %s",
                      self.host, self.collective_error)

    # -- the dispatch thread (`executors.dispatch`) -------------------------------------------

    def close(self) -> None:
        self.dispatch.close()

    def adopt(self, cause: str) -> Adopted:
        """A new server takes this host over (the one that numbered its requests is gone):
        requests queued behind one that will never come are dropped, receives still waiting
        fail with `cause`, the loops of runs taken so far end at their next test (`cancel`),
        and compile numbers start again. Executables, plans and buffers
        stay. Returns where the new server's numbering starts, and the buffers held."""
        dropped, base = self.dispatch.take_over()
        self.executables.restart()
        # What is held, as it stood when the old server stopped: a run stopped below fails
        # its results, which the new server reads as unfinished (lost) all the same.
        held = self.store.states()
        aborted = self.runner.abort_open(cause)
        # The new server knows none of the runs taken here (their results read as lost there,
        # unfinished): their loops end at their next test instead of holding this host.
        stopped = self.runner.cancel(self.runner.taken(), cause)
        log.warning("host %s: taken over by a new server (%d queued requests dropped, %d receives "
                    "failed, %d runs stopped); its requests start at %d", self.host, dropped, aborted,
                    stopped, base)
        return Adopted(base, held)

    def skip(self, seq: int) -> None:
        """Fill a sequence number whose request could not be sent."""
        self.dispatch.skip(seq)

    # -- compile (not sequenced: a call waits for its executable; `executors.executables`) ----

    def expect(self, key: str, number: int) -> bool:
        """A compile request numbered `number` for `key` is on its way (`Executables.expect`)."""
        return self.executables.expect(key, number)

    async def compile(
        self, key: str, artifact: bytes, mesh: DeviceMesh,
        in_specs: list[Any], out_specs: list[Any], number: int = 0,
    ) -> str | None:
        """Compile once per key; return None when ready, else the compiler's message.

        `number` counts the server's compile requests for the key on this host: one older
        than a `forget` of the key arrives late for a deleted computation and is refused."""
        return await self.executables.compile(key, artifact, mesh, in_specs, out_specs, number)

    # -- sequenced requests ------------------------------------------------------------------

    def put(self, seq: int, buffer_id: str, data: bytes, dtype: str, shape: Sequence[int],
            mesh: DeviceMesh, spec: Any) -> None:
        """Place an uploaded array; on a slice spanning hosts, this host's shards of it."""
        def op() -> None:
            try:
                array = np.frombuffer(data, dtype=parse_dtype(dtype)).reshape(shape)
                self.store.set(buffer_id, place(array, mesh, Spec.from_json(spec)))
            except Exception:
                self.store.fail(buffer_id, Failure(f"upload of {buffer_id} failed:\n{_cause()}"))

        self.dispatch.submit(seq, op, f"upload {buffer_id}")

    async def _settled(self, seq: int, buffer_id: str, read: Callable[[Any], Any]) -> Reply:
        """The buffer, once its turn has come and its value exists, passed through `read`
        (off the event loop; an error XLA reports while computing it surfaces here)."""
        taken: Future[Future[Any]] = Future()

        def op() -> None:
            try:
                taken.set_result(self.store.future(buffer_id))
            except Failure as f:
                taken.set_exception(f)

        self.dispatch.submit(seq, op, f"read {buffer_id}")
        try:
            stored: Future[Any] = await asyncio.wrap_future(taken)  # its turn has come
            value = await asyncio.wrap_future(stored)
            if quick(value):  # computed and small: reading it costs less than a thread hop
                return Ready(read(value))
            return Ready(await asyncio.to_thread(read, value))
        except Failure as f:
            return Failed(f.cause)
        except Exception:
            return Failed(f"computing {buffer_id} failed on host {self.host}:\n{_cause()}")

    async def wait(self, seq: int, buffer_id: str) -> Reply:
        """`Ready(None)` once the buffer's value exists, or `Failed(cause)`; nothing is copied."""
        return await self._settled(seq, buffer_id, read=finished)

    async def fetch(self, seq: int, buffer_id: str) -> Reply:
        """`Ready(raw bytes)` or `Failed(cause)`."""
        return await self._settled(seq, buffer_id, read=raw)

    async def fetch_shards(self, seq: int, buffer_id: str) -> Reply:
        """`Ready([(index, raw bytes), ...])`: the shards this host holds of a buffer on a
        slice spanning hosts, one per distinct index (the server assembles them)."""
        return await self._settled(seq, buffer_id, read=raw_shards)

    # -- programs ------------------------------------------------------------------------

    async def run(self, seq: int, message: RunMessage, plan: HostPlan | None) -> None:
        """Run a range of this host's plan for one program run (see `executors.runner`);
        answers once the message is taken (the ack sequential dispatch waits for before it
        sends the next node)."""
        self.dispatch.submit(seq, self.runner.accept(message, plan), f"run {message.run_id}",
                             run=message.run_id)

    async def run_batch(self, items: Sequence[tuple[int, RunMessage, HostPlan | None]]) -> list[Ran]:
        """Run messages the server wants told of once they have run (`executors.outbox`
        brings those of one turn together): each answers `Ran`, with this host's failed
        collective if any and the results it closed that are computed without error, once
        its steps are issued and the computations they issued have finished; the answers
        come together. The dispatch thread meanwhile goes on."""
        taken = [self.dispatch.submit(seq, self.runner.accept(message, plan), f"run {message.run_id}",
                                      settle=True, run=message.run_id)
                 for seq, message, plan in items]
        for fut in taken:
            await asyncio.wrap_future(fut)
        closed = [[b for _, b in message.results] if message.final else [] for _, message, _ in items]
        # The results computed without error: the server answers a wait for them without asking.
        return [Ran(self.collective_error, sound_among(self.store, ids)) for ids in closed]

    def deliver(self, run_id: str, tag: str, payload: Payload) -> None:
        """A peer host's `Send` for one of this host's `Recv`s (unsequenced)."""
        self.runner.deliver(run_id, tag, payload)

    async def peers_lost(self, hosts: Sequence[str], cause: str) -> int:
        """These hosts' executors are gone (unsequenced: the server tells every other host
        as it replaces them): what this host's runs wait for from them fails now. A
        coroutine, so that over the channel it is taken after the run messages sent before
        it, whose `run` coroutines take them first."""
        told = self.runner.peers_lost(hosts, cause)
        log.info("host %s: hosts %s are gone; %d runs told", self.host, list(hosts), told)
        return told

    async def cancel(self, run_ids: Sequence[str], cause: str) -> int:
        """Stop these runs' loops (unsequenced; a coroutine for the reason `peers_lost` is)."""
        return self.runner.cancel(run_ids, cause)

    async def peer_missed(self, run_id: str, host: str, cause: str) -> None:
        """`host` sends nothing more for this run (its executor is gone, or was replaced
        before its part reached it): what the run waits for from it here fails now, or when
        it gets there, rather than at the run's timeout (unsequenced, as `peers_lost`)."""
        self.runner.deliver(run_id, "abort", Abort(host, "", cause))

    def _deliver(self, to: str, run_id: str, tag: str, payload: Payload) -> None:
        """Hand a value to a peer host; `executors.pool` wires this to the peer's actor."""
        raise Failure(f"host {self.host} has no route to host {to}")

    def forget(self, seq: int, executables: dict[str, int], plans: Sequence[str]) -> None:
        """Drop executables and plans no computation or program uses any more (in sequence,
        after every request numbered before it). An executable asked for again since (a
        compile request numbered above the one given) is kept."""
        keys, plan_keys = dict(executables), list(plans)

        def op() -> None:
            self.executables.forget(keys)
            self.runner.forget(plan_keys, list(keys))

        self.dispatch.submit(seq, op, f"forget {len(keys)} executables, {len(plan_keys)} plans")

    def delete(self, seq: int, buffer_ids: Sequence[str]) -> None:
        ids = list(buffer_ids)
        self.dispatch.submit(seq, lambda: self.store.delete(ids), f"delete {len(ids)} buffers")

    async def keep(self, buffer_ids: Sequence[str], max_bytes: int) -> dict[str, list[tuple[Index, bytes]]]:
        """Unsequenced: of these buffers, those this host holds computed without error, each
        as its distinct shards' raw bytes, in the order given, up to `max_bytes` in all; one
        still computing, failed, or past the bound is left out. The server keeps them before
        it replaces this executor while it still answers (`server.keeping`): the dispatch
        thread may be held meanwhile (a computation that does not end), so this takes no turn."""
        return await asyncio.to_thread(kept, self.store, list(buffer_ids), max_bytes)

    def trace(self, run_id: str) -> HostTrace:
        """What this host recorded of a traced run (`executors.tracing`): not numbered, and
        read-only."""
        return self.runner.traces.of(run_id)

    def clock(self) -> int:
        """This host's wall clock (ns), by which its trace events are timed."""
        return time.time_ns()

    def states(self, buffer_ids: Sequence[str]) -> list[State]:
        """Unsequenced: a buffer whose producer has not been taken yet, or whose value is
        still computing, reads as pending."""
        return [State.PENDING if (s := self.store.state(b)) is State.MISSING else s for b in buffer_ids]

