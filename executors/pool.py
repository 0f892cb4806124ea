"""Start Ray and one executor actor per host, and give the server a Ray-free face.

The server talks to hosts only through `ExecutorPool`: plain ids, bytes and `ir` values in,
plain values or typed errors out. Requests that produce buffers (uploads, run messages) are
fire-and-forget; each carries a per-host sequence number that the host takes them in (Ray
does not order an async actor's calls). These numbers, given under one lock in the order the
gang schedulers admit work, are the one source of the global order. Reads are awaited with a
deadline, so a dead host turns into `Unavailable` instead of a hang. The requests on every
call's path travel over each executor's channel (`executors.channel`), the rest as actor
calls; the sequence numbers order them whichever way they came. Joining a cluster without a
cluster spec, the islands come from the nodes' labels and each executor is pinned to its
node (`resource_manager.discovery`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import random
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import ray

from executors import ray_start, startup
from executors.deletes import Deletes
from executors.islands import IslandLifecycle
from executors.links import Links, new_executor
from executors.messages import Adopted, Failed, Lost, RunMessage, Settled, Settlement, State
from executors.options import RayOptions
from executors.outbox import Outbox
from executors.ray_host import DIRECT_PUT_BYTES
from executors.replies import on_missed, settled, settlement
from executors.shards import Index
from executors.stats import Answered, HostStats, StatsAnswer
from executors.tracing import HostTrace
from ir import DeviceMesh, HostPlan, IsthmusError, RemoteError, Unavailable
from resource_manager import ClusterSpec, DeviceReport, HostSpec

__all__ = ["ExecutorPool", "RayOptions"]

log = logging.getLogger("isthmus.executors")

# Reads a host may have waiting at once: far fewer than the requests a host serves at once
# (`executors.ray_host.HOST_CONCURRENCY`), so a read never takes the place of what it waits for.
READS_PER_HOST = 1024
LATE_EVERY_S = 60.0  # while a host is late with a settle reply, log what it does this often


class ExecutorPool(IslandLifecycle):
    _reads_per_host = READS_PER_HOST

    def __init__(self, handles: Mapping[str, Any], connection: ray_start.Connection | None,
                 groups: Mapping[str, tuple[str, ...]] | None = None,
                 options: RayOptions | None = None) -> None:
        self.links = Links(handles, options or RayOptions())
        # island -> its hosts in process order, for islands that are one JAX distributed group
        self.groups = dict(groups or {})
        self._ray = connection  # how it joined Ray (None: Ray was joined before), undone at shutdown
        self._seq: dict[str, Iterator[int]] = {h: itertools.count() for h in handles}
        self._lock = threading.Lock()
        self._plans: set[tuple[str, str]] = set()  # (host, plan key) already sent
        self._compiles = 0  # compile requests sent (each carries its number, see `forget`)
        self.ordered = True  # False only to show what the island order prevents (debug)
        self.messages: dict[str, int] = dict.fromkeys(handles, 0)  # run messages sent per host
        self.spec: ClusterSpec | None = None  # the islands and hosts it runs (`start`)
        self._specs: dict[str, HostSpec] = {}
        self.islands: dict[str, tuple[str, ...]] = {}  # island -> its hosts
        self._options = self.links.options
        self._generation = 0  # of replaced executors (their actor names carry it)
        self._reads = {h: asyncio.Semaphore(READS_PER_HOST) for h in handles}
        self.discovered = False  # its islands came from the Ray nodes' labels (it may grow)
        self.outbox = Outbox(self.links.call)
        self.deletes = Deletes(self._numbered_delete, self._schedule_deletes)  # under `self._lock`
        self._reports: set[asyncio.Task[None]] = set()  # late hosts' stats, being logged
        self.adopted: dict[str, Adopted] = {}  # hosts taken over from a previous server (`start`)

    @property
    def on_host_lost(self) -> Callable[[str, str], None] | None:
        """Told (host, why) on the event loop when a host's executor is lost (its channel ended)."""
        return self.links.on_lost

    @on_host_lost.setter
    def on_host_lost(self, told: Callable[[str, str], None] | None) -> None:
        self.links.on_lost = told

    def _new_actor(self, host: HostSpec, generation: int) -> Any:
        return new_executor(host, self._specs.values(), self._options, generation)

    def _send(self, host: str, method: str, *args: Any, direct: bool = True, uses: Sequence[str] = ()) -> Any:
        """Number the request in this host's order and send it; never leave a gap."""
        return self._send_all((host,), method, *args, direct=direct, uses=uses)[0]

    def _send_all(self, hosts: Sequence[str], method: str, *args: Any, direct: bool = True,
                  uses: Sequence[str] = ()) -> list[Any]:
        """The same request to several hosts, numbered in one atomic step: every host of a
        slice spanning hosts sees it at the same place relative to everything else (the
        island order that keeps their collectives from waiting on each other in a cycle).
        A queued delete of a buffer it `uses` (reads or writes) is numbered before it."""
        if not self.ordered and len(hosts) > 1:
            # `direct` kept: a multi-host upload's body is in the object store, an actor call's
            return [self._later(functools.partial(self._send, h, method, *args, direct=direct, uses=uses))
                    for h in hosts]
        with self._lock:
            for host in hosts:
                self.deletes.before_use(host, uses)
            return [self._numbered(host, method, *args, direct=direct) for host in hosts]

    def _numbered(self, host: str, method: str, *args: Any, direct: bool = True) -> Any:
        """Number one request in the host's order and send it (under `self._lock`)."""
        seq = next(self._seq[host])
        try:
            return self.links.call(host, method, seq, *args, direct=direct)
        except Exception:
            self.links.handles[host].skip.remote(seq)
            raise

    @classmethod
    async def start(cls, spec: ClusterSpec | None, options: RayOptions) -> ExecutorPool:
        """Start one actor per host (`executors.startup`); each multi-host island of one
        platform forms one JAX distributed group (`RayOptions.groups`), its hosts joining at
        once, before anything else uses JAX (CPU collectives over gloo; GPU collectives are
        NCCL's). With no `spec`, the islands are those the Ray nodes' labels name, each
        executor pinned to its node; with none labelled, the default shape, placed by Ray."""
        begun = await startup.begin(spec, options)
        pool = cls(begun.handles, begun.joined, begun.groups, options)
        pool.ordered = options.ordered
        pool.spec, pool._specs, pool.discovered = begun.spec, begun.specs, begun.discovered
        pool.islands = {i.name: tuple(h.name for h in i.hosts) for i in begun.spec.islands}
        pool._generation = begun.generation
        pool.adopted = begun.adopted
        for h, adopted in pool.adopted.items():
            pool._seq[h] = itertools.count(adopted.next_seq)
        try:
            links = pool.links
            await asyncio.gather(*(links.form_group(links.handles, hosts) for hosts in pool.groups.values()
                                   if not set(hosts) & set(begun.adopted)))
            links.channels = await links.connect(links.handles)
            await links.tell_peers(links.handles)
            # Agents are up once executors started by them answer.
            if begun.joined is not None and begun.joined.owned:
                await pool.reports(options.group_timeout_s)
                ray_start.check_own()
        except BaseException:
            pool.shutdown()
            raise
        return pool

    @property
    def span(self) -> int:
        """The most hosts a slice may span: the largest island that is one JAX group."""
        return max((len(hosts) for hosts in self.groups.values()), default=1)

    @property
    def ranks(self) -> dict[str, int]:
        """Each grouped host's process index in its island's JAX group."""
        return {h: k for hosts in self.groups.values() for k, h in enumerate(hosts)}

    @property
    def hosts(self) -> list[str]:
        return list(self.links.handles)

    @property
    def addresses(self) -> dict[str, tuple[str, int]]:
        """host -> where its executor takes its peers' sends."""
        return self.links.addresses

    async def reports(self, timeout: float) -> dict[str, list[DeviceReport]]:
        handles = self.links.handles
        infos = await asyncio.gather(
            *(self.links.answer(h.info.remote(), n, timeout, "info") for n, h in handles.items())
        )
        return {
            n: [DeviceReport(d["platform"], d["kind"], d["memory_bytes"]) for d in info]
            for n, info in zip(handles, infos, strict=True)
        }

    async def compile(self, host: str, key: str, artifact: bytes, mesh: DeviceMesh,
                      in_specs: list[Any], out_specs: list[Any], timeout: float) -> str | None:
        with self._lock:
            self._compiles += 1
            number = self._compiles
            if host in self.links.channels:  # ahead of any run sent after this (see `Host.expect`)
                self.links.call(host, "expect", key, number)
        ref = self.links.handles[host].compile.remote(key, artifact, mesh, in_specs, out_specs, number)
        return await self.links.answer(ref, host, timeout, f"compile {key}")

    def forget(self, host: str, executables: Sequence[str], plans: Sequence[str]) -> None:
        """Tell the host to drop executables and plans nothing uses any more, after every
        request numbered before. Each executable goes with the number of the latest compile
        request sent so far: one asked for again after this (a higher number) is kept, and
        a compile request this overtook on its way is refused as stale."""
        if host not in self.links.handles or not (executables or plans):
            return
        with self._lock:  # one step: a run numbered after it carries its plan again
            self._plans -= {(host, k) for k in plans}
            try:
                self._numbered(host, "forget", dict.fromkeys(executables, self._compiles), list(plans))
            except Unavailable as e:  # a host that is down has forgotten everything
                log.info("forget on host %s skipped: %s", host, e)

    def put(self, hosts: Sequence[str], buffer_id: str, data: bytes, dtype: str, shape: Sequence[int],
            mesh: DeviceMesh, spec: Any) -> None:
        """Upload onto a slice's hosts; each keeps the shards on its own devices. The bytes
        go into the object store once, however many hosts read them."""
        direct = len(hosts) == 1 and len(data) <= DIRECT_PUT_BYTES
        body = ray.put(data) if len(hosts) > 1 else data
        self._send_all(hosts, "put", buffer_id, body, dtype, list(shape), mesh, spec, direct=direct,
                       uses=(buffer_id,))

    def _run(self, host: str, message: RunMessage, plan: HostPlan, notify: bool = False) -> Any:
        """Send one run message (under `self._lock`); the plan travels once per host. With
        `notify` it goes through the outbox, coalesced with the others of this turn."""
        carried = None if (host, message.plan_key) in self._plans else plan
        self.deletes.before_use(host, [b for _, b in (*message.args, *message.results)])
        seq = next(self._seq[host])
        if notify:
            ref = self.outbox.add(host, seq, message, carried)
        else:
            try:
                ref = self.links.call(host, "run", seq, message, carried)
            except Exception:
                self.links.handles[host].skip.remote(seq)
                raise
        self._plans.add((host, message.plan_key))
        self.messages[host] += 1
        return ref

    def run(self, messages: Sequence[tuple[str, RunMessage, HostPlan]], notify: bool = False) -> list[Any]:
        """Parallel dispatch: one message per host, numbered in one atomic step.

        Numbering every host's message of a run at once puts all runs in one global order,
        the same on every host, so hosts never wait on each other in a cycle. With `notify`,
        the returned replies settle once each host has run its part (`settle`).
        """
        if not self.ordered and len(messages) > 1:
            return [self._later(functools.partial(self._locked_run, h, m, p, notify)) for h, m, p in messages]
        with self._lock:
            refs = [self._run(host, message, plan, notify) for host, message, plan in messages]
        if notify and len(messages) > 1:
            self._tell_if_missed([host for host, _, _ in messages], messages[0][1].run_id, refs)
        return refs

    def _tell_if_missed(self, hosts: list[str], run_id: str, replies: list[Future[Any]]) -> None:
        """A host whose part of a run gets no answer (its executor died, or was replaced
        while the part waited to go, before or while it ran it) sends nothing more: its
        peers in the run are told, so that they fail what they wait for from it now rather
        than at the run's timeout, holding their dispatch threads, and every tenant's work
        behind them, meanwhile. (A host replaced before the run was sent is not among the
        runs `peers_lost` reaches: they are taken after it.)"""
        on_missed(hosts, run_id, replies, lambda peers, host, cause: self._tell_all(
            peers, "peer_missed", run_id, host, cause))

    def _locked_run(self, host: str, message: RunMessage, plan: HostPlan, notify: bool) -> Any:
        with self._lock:
            return self._run(host, message, plan, notify)

    def _later(self, send: Callable[[], Any]) -> Future[Any]:
        """Debug, gang order off: send after a random delay of up to 5 ms, as if each host took
        work in its own arrival order; the ref comes back through a future. (It also reorders
        a multi-host upload against the call after it, and a plan against the runs after it:
        further failures on top of the cross-host collectives it is meant to show.)"""
        box: Future[Any] = Future()

        def fire() -> None:
            try:
                box.set_result(send())
            except Exception as e:
                box.set_exception(e)

        asyncio.get_running_loop().call_later(random.uniform(0, 0.005), fire)
        return box

    async def settle(self, refs: Sequence[Any], hosts: Sequence[str], timeout: float) -> Settlement:
        """Wait until every host has taken what `refs` were sent for; a dead or silent host
        counts as settled (`Lost`: its outputs fail or are unreachable, never a hang).
        Returns the hosts that report a failed collective (their group is broken), with its
        cause, and how many hosts reported each result computed."""
        return settlement(hosts, await settled(refs, hosts, timeout, LATE_EVERY_S, self._late))

    def when_settled(self, refs: Sequence[Any], hosts: Sequence[str], timeout: float,
                     then: Callable[[Settlement | None], None]) -> None:
        """`settle` without a task: `then` is called on the event loop with the settlement
        (None if waiting for it failed), for the one wait per run on the server's hot path."""
        def answered(replies: asyncio.Future[list[Settled]]) -> None:
            if replies.cancelled() or replies.exception() is not None:
                if not replies.cancelled():
                    log.error("settling a run on hosts %s failed", hosts, exc_info=replies.exception())
                then(None)
            else:
                then(settlement(hosts, replies.result()))

        settled(refs, hosts, timeout, LATE_EVERY_S, self._late).add_done_callback(answered)

    def _late(self, hosts: list[str]) -> None:
        """Log what hosts late with a settle reply are doing: their running request and for
        how long, or the sequence number they wait for."""
        async def report(host: str) -> None:
            match await self.ask(host, timeout=5.0):
                case Answered(stats=st):
                    doing = (f"running {st.running!r} for {st.running_s}s, waiting for {st.waiting_for}, "
                             f"{st.queued} queued, {st.completed} completed, collective error "
                             f"{st.collective_error!r}")
                case Lost(cause=cause):
                    doing = f"it did not say ({cause})"
            log.warning("host %s has not finished a request after %gs or more: %s", host, LATE_EVERY_S, doing)

        for host in hosts:
            task = asyncio.ensure_future(report(host))
            self._reports.add(task)
            task.add_done_callback(self._reports.discard)

    async def fetch_shards(self, host: str, buffer_id: str, timeout: float) -> list[tuple[list[Any], bytes]]:
        return await self._read(host, "fetch_shards", buffer_id, timeout)

    async def fetch(self, host: str, buffer_id: str, timeout: float) -> bytes:
        return await self._read(host, "fetch", buffer_id, timeout)

    async def wait(self, host: str, buffer_id: str, timeout: float) -> None:
        await self._read(host, "wait", buffer_id, timeout)

    async def _read(self, host: str, method: str, buffer_id: str, timeout: float) -> Any:
        """A read waits on the host until its turn and its value come; at most READS_PER_HOST
        wait at once (a read is numbered only once it has its place)."""
        async with self._reads[host]:
            reply = await self.links.answer(self._send(host, method, buffer_id, uses=(buffer_id,)), host,
                                            timeout, f"{method.replace('_', ' ')} {buffer_id}")
        if isinstance(reply, Failed):
            raise RemoteError(reply.cause)
        return reply.value

    async def states(self, host: str, buffer_ids: Sequence[str], timeout: float) -> list[State]:
        ref = self.links.call(host, "states", list(buffer_ids))
        states: list[State] = await self.links.answer(ref, host, timeout, "states")
        return states

    async def keep(self, host: str, buffer_ids: Sequence[str], max_bytes: int,
                   timeout: float) -> dict[str, list[tuple[Index, bytes]]]:
        """The host's computed values among these, as shards (`Host.keep`; an actor call, so
        a large answer travels through Ray's object store)."""
        ref = self.links.call(host, "keep", list(buffer_ids), max_bytes)
        kept: dict[str, list[tuple[Index, bytes]]] = await self.links.answer(ref, host, timeout, "keep")
        return kept

    async def stats(self, host: str, timeout: float) -> HostStats:
        """What the host is doing (`Host.stats`); raises `Unavailable` or `RemoteError`."""
        stats: HostStats = await self.links.answer(self.links.call(host, "stats"), host, timeout, "stats")
        return stats

    async def trace(self, host: str, run_id: str, timeout: float) -> HostTrace:
        """What the host recorded of a traced run (`Host.trace`)."""
        ref = self.links.call(host, "trace", run_id)
        trace: HostTrace = await self.links.answer(ref, host, timeout, "trace")
        return trace

    async def clock(self, host: str, timeout: float) -> int:
        """The host's wall clock, ns (`Host.clock`)."""
        now: int = await self.links.answer(self.links.call(host, "clock"), host, timeout, "clock")
        return now

    async def ask(self, host: str, timeout: float) -> StatsAnswer:
        """The host's stats, or why it gave none: gone, silent past `timeout`, or failed."""
        try:
            return Answered(await self.stats(host, timeout))
        except IsthmusError as e:
            return Lost(str(e))

    def cancel(self, hosts: Sequence[str], run_ids: Sequence[str], cause: str) -> None:
        """Stop these runs' loops on these hosts (`Host.cancel`)."""
        self._tell_all(hosts, "cancel", list(run_ids), cause)

    def _tell_all(self, hosts: Sequence[str], method: str, *args: Any) -> None:
        """An unsequenced request nobody reads the answer of, to each of these hosts, after
        the run messages numbered for it so far (the outbox is flushed first), which the
        host has taken by the time it reads this."""
        self.outbox.flush()
        for host in hosts:
            try:
                self.links.call(host, method, *args)
            except Unavailable as e:  # a host that is down: its own loss is reported
                log.info("%s on host %s skipped: %s", method, host, e)

    def delete(self, host: str, buffer_ids: Sequence[str]) -> None:
        """Free buffers on a host, with the others released in this turn (`executors.deletes`);
        one that is down has lost them already."""
        if buffer_ids and host in self.links.handles:
            with self._lock:
                self.deletes.add(host, buffer_ids)

    def _numbered_delete(self, host: str, buffer_ids: list[str]) -> None:
        """(Under `self._lock`.)"""
        try:
            self._numbered(host, "delete", buffer_ids)
        except Unavailable as e:
            log.info("delete on host %s skipped: %s", host, e)

    def _schedule_deletes(self) -> None:
        """(Under `self._lock`.) The queued deletes leave at the loop's next turn; at once
        where no loop runs."""
        try:
            asyncio.get_running_loop().call_soon(self._flush_deletes)
        except RuntimeError:
            self.deletes.flush()

    def _flush_deletes(self) -> None:
        with self._lock:
            self.deletes.flush()

    def shutdown(self, keep_executors: bool = False) -> None:
        """Stop the executors (unless `keep_executors`: left for the next server to take
        over) and the Ray this pool started, if any."""
        self.links.close(keep_executors)
        if self._ray is not None:
            self._ray.close()

