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
import contextlib
import itertools
import logging
import random
import secrets
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from executors import adoption, ray_start
from executors.channel import SECRET_BYTES, Channel
from executors.deletes import Deletes
from executors.islands import IslandLifecycle
from executors.memory import Budget
from executors.messages import Adopted, Failed, Ran, Settled, Settlement, State
from executors.outbox import Outbox
from executors.ray_host import DIRECT, DIRECT_PUT_BYTES, TOLD, new_actor
from executors.replies import actor_gone, settled
from executors.runner import IN_FLIGHT, RunMessage
from executors.shards import Index
from ir import DeviceMesh, HostPlan, RemoteError, Unavailable
from resource_manager import (
    ClusterSpec,
    DeviceReport,
    HostSpec,
    cluster_from_nodes,
    default_cluster,
)
from resource_manager.discovery import ISLAND_LABEL

log = logging.getLogger("isthmus.executors")

# Reads a host may have waiting at once: far fewer than the requests a host serves at once
# (`executors.ray_host.HOST_CONCURRENCY`), so a read never takes the place of what it waits for.
READS_PER_HOST = 1024
LATE_EVERY_S = 60.0  # while a host is late with a settle reply, log what it does this often


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None  # None: start a local Ray owned by this process
    num_cpus: int = 2
    object_store_bytes: int = 1 << 30
    namespace: str = "isthmus"
    groups: bool = True  # multi-host islands (of one platform) form one JAX distributed group each
    ordered: bool = True  # False only to show what the island order prevents (debug)
    peer_links: bool = True  # False: hosts send each other values as actor calls (to compare)
    group_timeout_s: int = 120
    # The longest a host waits for an executable, and a CPU collective for its peers: past
    # it the computation fails with the cause instead of hanging (a host that failed its part
    # of a cross-host computation before the collective leaves the others waiting there).
    wait_timeout_s: int = 300
    # Computations an executor issues without waiting for them (docs/architecture.md).
    in_flight: int = IN_FLIGHT
    # MiB of XLA temporaries a CPU host's computations in flight may take together, and of
    # buffers it may hold; None: half of its machine's memory for the one, 35% for the
    # other, shared by the hosts placed on that machine (`executors.memory`).
    temp_mb: int | None = None
    buffer_mb: int | None = None
    # Ray's token: read from (or, for a Ray this pool starts, written to) this file.
    token_file: Path | None = None
    insecure: bool = False  # join an external Ray without token authentication
    # Executors outlive the server (detached actors); a new server takes over those it finds
    # (`adopt`) or, finding ones it does not take, kills them (`executors.adoption`).
    detached: bool = False
    adopt: bool = False
    # The Ray this pool starts runs apart from it, as the daemon of this state dir, and
    # stops by itself once no server has used it for `orphan_timeout_s` (`ray_daemon`).
    daemon_dir: Path | None = None
    orphan_timeout_s: float = 600.0


def _new_actor(host: HostSpec, hosts: Iterable[HostSpec], options: RayOptions, generation: int) -> Any:
    """An executor for `host`, its memory budgets shared with the cluster's other hosts
    on its machine: those pinned to its node, or, unpinned, every other unpinned host (all
    on one machine in the embedded default; fewer share a machine wherever Ray spreads them,
    so the share is never too large)."""
    sharing = sum(1 for h in hosts if h.node == host.node)
    return new_actor(host, options.namespace, options.wait_timeout_s, options.in_flight, generation,
                     options.detached, Budget(options.temp_mb, options.buffer_mb, max(1, sharing)))


async def _answer(ref: Any) -> Any:
    while isinstance(ref, Future | ray.ObjectRef):
        ref = await asyncio.wrap_future(ref if isinstance(ref, Future) else ref.future())
    return ref


class ExecutorPool(IslandLifecycle):
    _reads_per_host = READS_PER_HOST

    def __init__(self, handles: Mapping[str, Any], connection: ray_start.Connection | None,
                 groups: Mapping[str, tuple[str, ...]] | None = None) -> None:
        self._handles = dict(handles)
        # island -> its hosts in process order, for islands that are one JAX distributed group
        self.groups = dict(groups or {})
        self._ray = connection  # how it joined Ray (None: Ray was joined before), undone at shutdown
        self._seq = {h: itertools.count() for h in handles}
        self._lock = threading.Lock()
        self._plans: set[tuple[str, str]] = set()  # (host, plan key) already sent
        self._compiles = 0  # compile requests sent (each carries its number, see `forget`)
        self.ordered = True  # False only to show what the island order prevents (debug)
        self.messages: dict[str, int] = dict.fromkeys(handles, 0)  # run messages sent per host
        self.spec: ClusterSpec | None = None  # the islands and hosts it runs (`start`)
        self._specs: dict[str, HostSpec] = {}
        self.islands: dict[str, tuple[str, ...]] = {}  # island -> its hosts
        self._options = RayOptions()
        self._generation = 0  # of replaced executors (their actor names carry it)
        self._reads = {h: asyncio.Semaphore(READS_PER_HOST) for h in handles}
        self._secret = secrets.token_bytes(SECRET_BYTES)  # what an executor's channel asks first
        self.addresses: dict[str, tuple[str, int]] = {}  # host -> where its executor takes peers' sends
        self.discovered = False  # its islands came from the Ray nodes' labels (it may grow)
        # Told (host, why) on the event loop when a host's executor is lost (its channel ended).
        self.on_host_lost: Callable[[str, str], None] | None = None
        self._channels: dict[str, Channel] = {}
        self.outbox = Outbox(self._call)
        self.deletes = Deletes(self._numbered_delete, self._schedule_deletes)  # under `self._lock`
        self._reports: set[asyncio.Task[None]] = set()  # late hosts' stats, being logged
        self.adopted: dict[str, Adopted] = {}  # hosts taken over from a previous server (`start`)

    def _new_actor(self, host: HostSpec, generation: int) -> Any:
        return _new_actor(host, self._specs.values(), self._options, generation)

    def _call(self, host: str, method: str, *args: Any, direct: bool = True) -> Any:
        """Send one request to a host: over its channel where it has one and the method is
        served there, else as an actor call. Returns the answer's future or ObjectRef (None
        for a request nobody reads the answer of, sent over the channel)."""
        channel = self._channels.get(host)
        if channel is None or not direct or method not in DIRECT:
            return getattr(self._handles[host], method).remote(*args)
        if method in TOLD:
            channel.tell(method, *args)
            return None
        return channel.call(method, *args)

    async def _open_channels(self, handles: Mapping[str, Any]) -> dict[str, Channel]:
        timeout = self._options.group_timeout_s

        async def one(host: str, handle: Any) -> Channel:
            address, port, peer_port = await self._await(handle.open_channel.remote(self._secret), host,
                                                         timeout, "open its channel")
            channel = await Channel.connect(host, address, port, self._secret, timeout)
            channel.on_lost = lambda why: self._lost(host, channel, why)
            self.addresses[host] = (address, peer_port)
            return channel

        opened = await asyncio.gather(*(one(h, a) for h, a in handles.items()), return_exceptions=True)
        channels = {h: c for h, c in zip(handles, opened, strict=True) if isinstance(c, Channel)}
        failed = next((c for c in opened if isinstance(c, BaseException)), None)
        if failed is not None:
            for c in channels.values():
                c.close()
            raise failed
        return channels

    def _lost(self, host: str, channel: Channel, why: str) -> None:
        """A host's channel ended other than by the pool closing it: the executor is gone
        (or unreachable). Tell `on_host_lost`, if it is still that host's channel."""
        if self._channels.get(host) is channel and self.on_host_lost is not None:
            self.on_host_lost(host, why)

    async def _tell_peers(self, handles: Mapping[str, Any]) -> None:
        """Tell every executor its peers' actors and channel addresses (executors taken over
        from a previous server know older ones)."""
        told = await asyncio.gather(*(self._await(a.set_peers.remote(handles), h, 30, "take its peers")
                                      for h, a in handles.items()), return_exceptions=True)
        for h, outcome in zip(handles, told, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("host %s did not take its peers: %s", h, outcome)
        await self._tell_addresses(handles)

    async def _tell_addresses(self, handles: Mapping[str, Any]) -> None:
        """Tell every executor where each host's channel is (`RayHost.set_peer_addresses`),
        so that sends inside programs go executor to executor. One that does not answer
        sends through Ray meanwhile; it is logged, never fatal."""
        if not self._options.peer_links:
            return
        addresses = dict(self.addresses)
        told = await asyncio.gather(
            *(self._await(a.set_peer_addresses.remote(addresses), h, 30, "take its peers' addresses")
              for h, a in handles.items()), return_exceptions=True)
        for h, outcome in zip(handles, told, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("host %s did not take its peers' channel addresses: %s", h, outcome)

    def _send(self, host: str, method: str, *args: Any, uses: Sequence[str] = ()) -> Any:
        """Number the request in this host's order and send it; never leave a gap."""
        return self._send_all((host,), method, *args, uses=uses)[0]

    def _send_all(self, hosts: Sequence[str], method: str, *args: Any, direct: bool = True,
                  uses: Sequence[str] = ()) -> list[Any]:
        """The same request to several hosts, numbered in one atomic step: every host of a
        slice spanning hosts sees it at the same place relative to everything else (the
        island order that keeps their collectives from waiting on each other in a cycle).
        A queued delete of a buffer it `uses` (reads or writes) is numbered before it."""
        if not self.ordered and len(hosts) > 1:
            return [self._later(lambda h=h: self._send(h, method, *args, uses=uses)) for h in hosts]
        with self._lock:
            for host in hosts:
                self.deletes.before_use(host, uses)
            return [self._numbered(host, method, *args, direct=direct) for host in hosts]

    def _numbered(self, host: str, method: str, *args: Any, direct: bool = True) -> Any:
        """Number one request in the host's order and send it (under `self._lock`)."""
        seq = next(self._seq[host])
        try:
            return self._call(host, method, seq, *args, direct=direct)
        except Exception:
            self._handles[host].skip.remote(seq)
            raise

    @classmethod
    async def start(cls, spec: ClusterSpec | None, options: RayOptions) -> ExecutorPool:
        """Start one actor per host; each multi-host island of one platform forms one JAX
        distributed group (`RayOptions.groups`), its hosts joining at once, before anything
        else uses JAX (CPU collectives over gloo; GPU collectives are NCCL's). With no
        `spec`, the islands are those the Ray nodes' labels name (`cluster_from_nodes`), each
        executor pinned to its node; with none labelled, the default shape, placed by Ray."""
        # A Ray this process has already joined is used as it is: whoever joined it chose how.
        joined = None if ray.is_initialized() else ray_start.connect(
            options.address, namespace=options.namespace, num_cpus=options.num_cpus,
            object_store_bytes=options.object_store_bytes, token_file=options.token_file,
            insecure=options.insecure, daemon_dir=options.daemon_dir,
            orphan_timeout_s=options.orphan_timeout_s)
        discovered = spec is None
        if spec is None:
            spec = cluster_from_nodes(ray.nodes())
            discovered = spec is not None
            if spec is None:
                log.warning("no Ray node is labelled %s: the default islands, placed wherever Ray "
                            "likes (docs/kubernetes.md, \"Labels\")", ISLAND_LABEL)
                spec = default_cluster()
        specs = {h.name: h for _, h in spec.hosts()}
        groups = spec.groups() if options.groups else {}
        # Executors a previous server left: taken over, or killed (their names are reused).
        newest, names = adoption.found(options.namespace)
        generation = 1 + max((g for g, _ in newest.values()), default=-1)
        taken = await adoption.take_over(
            {h: name for h, (_, name) in newest.items() if h in specs}, options.namespace, groups,
            "the server that sent this run stopped before it finished",
            options.group_timeout_s) if options.adopt else {}
        adoption.kill((n for n in names if n not in {newest[h][1] for h in taken}), options.namespace)
        handles = {name: taken[name][0] if name in taken else
                   _new_actor(host, specs.values(), options, generation)
                   for name, host in specs.items()}
        pool = cls(handles, joined, groups)
        pool.ordered = options.ordered
        pool.spec, pool._specs, pool._options = spec, specs, options
        pool.discovered = discovered
        pool.islands = {i.name: tuple(h.name for h in i.hosts) for i in spec.islands}
        pool._generation = generation
        pool.adopted = {h: adopted for h, (_, adopted) in taken.items()}
        for h, adopted in pool.adopted.items():
            pool._seq[h] = itertools.count(adopted.next_seq)
        try:
            await asyncio.gather(*(pool._form_group(pool._handles, hosts) for hosts in groups.values()
                                   if not set(hosts) & set(taken)))
            pool._channels = await pool._open_channels(pool._handles)
            await pool._tell_peers(pool._handles)
            if joined is not None and joined.owned:  # agents are up once executors started by them answer
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
        return list(self._handles)

    async def _await(self, ref: Any, host: str, timeout: float | None, what: str) -> Any:
        """The answer to `ref`: a Ray ObjectRef, or a future of one or of the answer itself
        (a coalesced message's, or one sent later with the gang order off)."""
        try:
            return await asyncio.wait_for(_answer(ref), timeout)
        except TimeoutError:
            raise Unavailable(f"host {host} did not answer {what} within {timeout:g}s") from None
        except ray.exceptions.RayActorError as e:
            raise Unavailable(actor_gone(host, e)) from None
        except ray.exceptions.RayTaskError as e:
            raise RemoteError(f"{what} on host {host} failed: {e}") from None

    async def reports(self, timeout: float) -> dict[str, list[DeviceReport]]:
        infos = await asyncio.gather(
            *(self._await(h.info.remote(), n, timeout, "info") for n, h in self._handles.items())
        )
        return {
            n: [DeviceReport(d["platform"], d["kind"], d["memory_bytes"]) for d in info]
            for n, info in zip(self._handles, infos, strict=True)
        }

    async def compile(self, host: str, key: str, artifact: bytes, mesh: DeviceMesh,
                      in_specs: list[Any], out_specs: list[Any], timeout: float) -> str | None:
        with self._lock:
            self._compiles += 1
            number = self._compiles
            if host in self._channels:  # ahead of any run sent after this (see `Host.expect`)
                self._call(host, "expect", key, number)
        ref = self._handles[host].compile.remote(key, artifact, mesh, in_specs, out_specs, number)
        return await self._await(ref, host, timeout, f"compile {key}")

    def forget(self, host: str, executables: Sequence[str], plans: Sequence[str]) -> None:
        """Tell the host to drop executables and plans nothing uses any more, after every
        request numbered before. Each executable goes with the number of the latest compile
        request sent so far: one asked for again after this (a higher number) is kept, and
        a compile request this overtook on its way is refused as stale."""
        if host not in self._handles or not (executables or plans):
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
                ref = self._call(host, "run", seq, message, carried)
            except Exception:
                self._handles[host].skip.remote(seq)
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
            return [self._later(lambda a=(h, m, p): self._locked_run(*a, notify)) for h, m, p in messages]
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
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:  # called from a thread of its own (tests): told from the callback
            loop = None

        def answered(reply: Future[Any], host: str) -> None:
            if reply.cancelled() or (error := reply.exception()) is None:
                return
            peers = [h for h in hosts if h != host]
            cause = f"host {host} sends nothing more for run {run_id}: {error}"
            if loop is None:
                self._tell_all(peers, "peer_missed", run_id, host, cause)
                return
            with contextlib.suppress(RuntimeError):  # the loop closed: the server is stopping
                loop.call_soon_threadsafe(self._tell_all, peers, "peer_missed", run_id, host, cause)

        for host, reply in zip(hosts, replies, strict=True):
            reply.add_done_callback(lambda r, h=host: answered(r, h))

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
            try:
                st = await self.stats(host, timeout=5.0)
            except (Unavailable, RemoteError) as e:
                st = {"error": str(e)}
            log.warning("host %s has not finished a request after %gs or more: %s", host, LATE_EVERY_S,
                        {k: st.get(k) for k in ("running", "running_s", "waiting_for", "queued",
                                                  "completed", "collective_error", "error")})

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
            reply = await self._await(self._send(host, method, buffer_id, uses=(buffer_id,)), host, timeout,
                                      f"{method.replace('_', ' ')} {buffer_id}")
        if isinstance(reply, Failed):
            raise RemoteError(reply.cause)
        return reply.value

    async def states(self, host: str, buffer_ids: Sequence[str], timeout: float) -> list[State]:
        return await self._await(self._call(host, "states", list(buffer_ids)), host, timeout, "states")

    async def keep(self, host: str, buffer_ids: Sequence[str], max_bytes: int,
                   timeout: float) -> dict[str, list[tuple[Index, bytes]]]:
        """The host's computed values among these, as shards (`Host.keep`; an actor call, so
        a large answer travels through Ray's object store)."""
        return await self._await(self._call(host, "keep", list(buffer_ids), max_bytes), host, timeout, "keep")

    async def stats(self, host: str, timeout: float) -> dict[str, Any]:
        return await self._await(self._call(host, "stats"), host, timeout, "stats")

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
                self._call(host, method, *args)
            except Unavailable as e:  # a host that is down: its own loss is reported
                log.info("%s on host %s skipped: %s", method, host, e)

    def delete(self, host: str, buffer_ids: Sequence[str]) -> None:
        """Free buffers on a host, with the others released in this turn (`executors.deletes`);
        one that is down has lost them already."""
        if buffer_ids and host in self._handles:
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
        for channel in self._channels.values():
            try:
                channel.close()
            except RuntimeError as e:  # its event loop has ended: nothing is left to close
                log.debug("channel: %s", e)
        self._channels.clear()
        for h in [] if keep_executors else self._handles.values():
            try:
                ray.kill(h)
            except Exception as e:  # a host already gone is what shutdown wants
                log.debug("kill: %s", e)
        self._handles.clear()
        if self._ray is not None:
            self._ray.close()


def settlement(hosts: Sequence[str], replies: Sequence[Settled]) -> Settlement:
    """The hosts that report a failed collective, with its cause, and how many hosts
    reported each result computed."""
    ran = [(h, r) for h, r in zip(hosts, replies, strict=True) if isinstance(r, Ran)]
    return Settlement({h: r.collective_error for h, r in ran if r.collective_error is not None},
                      Counter(b for _, r in ran for b in r.ready))
