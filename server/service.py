"""The server's logic, independent of HTTP: the routes' one facade over its components.

Every operation takes the calling client's id and sees only that client's objects; an id
that exists but belongs to another client is reported exactly like one that does not.
Handlers in `server/routes` only parse, call one method here and shape the answer (reading
a buffer is `server.reads`).

`Service` builds the components, each owning its state and given only the components it
uses: clients (`server.clients`), slices and placement (`server.slices`), buffers, quotas
and host memory (`server.buffers`), computations (`server.computations`), programs and
calls (`server.programs`, `server.runs`, `server.lowerings`, `server.loops`,
`server.remake`), the runs that ended last (`server.run_log`) and traced runs
(`server.tracing`), healing (`server.healing`),
metrics (`server.metrics`, `server.cluster_metrics`). What crosses them (closing a client,
deleting a slice, an upload) is done here.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine, Sequence
from typing import Any

from executors import ExecutorPool, RayOptions
from executors.ray_daemon import ServerLock, hold_server_lock
from ir import Aval, InvalidArgument, Spec
from resource_manager import ClusterSpec, ResourceManager, Slice, default_cluster, load_cluster
from server import recovery
from server.auth import Admin, Credentials
from server.buffers import Buffers
from server.caches import HostCaches
from server.clients import Clients
from server.cluster_metrics import ClusterMetrics
from server.computations import Computations
from server.gang import Gangs
from server.healing import Healer
from server.host_memory import HostMemory
from server.lineage import Lineage, Upload
from server.loops import Loops
from server.lowerings import Lowerings
from server.membership import watch_nodes
from server.metrics import Metrics
from server.programs import Programs
from server.quotas import Quotas
from server.readers import Readers
from server.records import BufferRecord, ClientRecord, ComputationRecord
from server.registry import Registry
from server.remake import Remaker
from server.restarts import Restarts
from server.run_log import RunLog
from server.runs import Runs
from server.settings import Settings
from server.settling import Settling
from server.slices import Slices
from server.state import read_secret, secret
from server.store import open_store
from server.tasks import Tasks
from server.tracing import RunTraces

log = logging.getLogger("isthmus.server")
CLUSTER = "cluster"  # the registry's note of the cluster the executors were started for
SCRAPE_ASK_S = 5.0  # a scrape waits this long, at most, for each host's stats


class Service:
    def __init__(self, settings: Settings, pool: ExecutorPool, rm: ResourceManager,
                 admin_token: str, registry: Registry) -> None:
        self.settings = settings
        self.pool = pool
        self.rm = rm
        # The records (what survives a restart) are the registry's; the components read them.
        self.registry = registry
        self.clients = registry.clients
        self.buffers = registry.buffers
        self.computations = registry.computations
        self.lost = registry.lost  # buffer id -> why its value is gone (its island restarted)
        quotas = Quotas.of(settings)
        window = settings.gang_window if settings.gang_order else 1 << 30
        self.metrics = Metrics(settings.metrics_client_labels, registry.clients)
        self.gangs = Gangs(rm.islands(), settings.gang_policy, window, settings.gang_window_s, self.metrics)
        self.credentials = Credentials(admin_token, settings.metrics_token)
        self._clients = Clients(self.credentials, registry, quotas, self.gangs, settings.client_lease_s)
        # buffers' bytes on the hosts, against what they offer and the clients' claims on it
        self.memory = HostMemory(rm, registry, settings.buffer_reserve)
        self.caches = HostCaches(pool.forget)
        # Client artifacts are read in processes of their own, shared fairly (server.readers).
        self.readers = Readers(settings.artifact_readers, max_bytes=settings.max_artifact_mb << 20,
                               max_ops=settings.max_artifact_ops)
        self.readers.start()
        self.settling = Settling()  # results known ready from the hosts' answers
        self.restarting = Restarts()  # islands whose executors are being replaced
        # What made each buffer, to make a lost one again (`server.remake`).
        self.lineage = Lineage(settings.lineage_mb << 20, settings.lineage_released)
        self._slices = Slices(rm, pool, registry, quotas)
        self._buffers = Buffers(registry, self.memory, quotas, self.gangs, pool, rm, self.lineage,
                                self.settling)
        self.lowerings = Lowerings(pool, self.caches, self._slices, settings.rpc_timeout_s)
        self.loops = Loops(pool, self.lineage)
        self.healer = Healer(settings, rm, pool, self.gangs, self.restarting, self._buffers, self.lineage,
                             self.loops, self.lowerings)
        self._cluster = ClusterMetrics(rm, self.gangs, self.restarting, self.healer, self.memory,
                                       registry.buffers, registry.clients, self.metrics.client_label, pool,
                                       min(SCRAPE_ASK_S, settings.health_timeout_s))
        self.run_log = RunLog()  # the runs that ended last (`GET /v1/runs`)
        self.traces = RunTraces(self.gangs)  # the traced runs' server events (`GET /v1/runs/{id}/trace`)
        runs = Runs(settings, pool, self.gangs, self._slices, self._buffers, self.lineage, self.lowerings,
                    self.loops, self.settling, self.healer.broken, self.run_log, self.traces)
        remaker = Remaker(self._buffers, self._slices, self.lineage, self.gangs, pool, registry.clients)
        self._remaker = remaker
        self.programs = Programs(registry, quotas, settings.max_program_computations, self._slices,
                                 self._buffers, self.readers, self.lowerings, runs, remaker, self.gangs)
        self._computations = Computations(registry, quotas, self._slices, self.readers, self.programs)
        self._tasks = Tasks()
        self._lock: ServerLock | None = None  # on the state dir, while this server runs
        pool.on_host_lost = self.healer.host_lost

    @classmethod
    async def start(cls, settings: Settings, admin_token: str) -> Service:
        # Joining a cluster without a cluster file, its nodes' labels name the islands.
        spec: ClusterSpec | None = (
            load_cluster(settings.cluster_file) if settings.cluster_file
            else None if settings.ray_address else default_cluster()
        )
        if settings.ray_address is None:  # the Ray this server starts takes its token from here
            secret(settings.ray_token_file)
        elif settings.ray_token_file.exists():  # an external Ray's token, given to the server
            read_secret(settings.ray_token_file)  # checked like ours: the user's, 0600, not empty
        # One server per state dir: its records, its Ray daemon and its executors are one.
        lock = hold_server_lock(settings.state_dir)
        registry = Registry(open_store(settings.db_path))
        loaded = registry.load()
        options = RayOptions(
            address=settings.ray_address,
            num_cpus=settings.ray_num_cpus,
            object_store_bytes=settings.object_store_mb << 20,
            groups=settings.island_groups,
            ordered=settings.gang_order,
            wait_timeout_s=max(1, round(settings.step_timeout_s)),
            in_flight=settings.executor_in_flight,
            temp_mb=settings.executor_temp_mb,
            buffer_mb=settings.executor_buffer_mb,
            stack_mb=settings.executor_stack_mb,
            swap_mb=settings.executor_stack_swap_mb,
            token_file=settings.ray_token_file,
            insecure=settings.insecure_ray,
            detached=True,
            # executors holding values of the clients it knows, for the cluster they ran
            adopt=bool(registry.clients) and _same_cluster(registry.meta(CLUSTER), spec),
            daemon_dir=settings.state_dir,
            orphan_timeout_s=settings.orphan_timeout_s,
        )
        try:
            pool = await ExecutorPool.start(spec, options)
        except BaseException:
            registry.close()
            lock.release()
            raise
        try:
            reports = await pool.reports(settings.rpc_timeout_s)
            assert pool.spec is not None
            service = cls(settings, pool, ResourceManager(pool.spec, reports, max_hosts_per_slice=pool.span),
                          admin_token, registry)
            service._lock = lock
            recovery.restore(loaded, pool.adopted, registry=registry, rm=service.rm, clients=service._clients,
                             programs=service.programs, memory=service.memory, pool=pool)
            registry.set_meta(CLUSTER, pool.spec.to_json())
            service.spawn(service._expire_clients_forever())
            if pool.discovered:  # nodes labelled later become hosts
                service.spawn(watch_nodes(pool, service.rm, service.gangs, settings.node_poll_s))
            if settings.health_probe_s > 0:
                service.healer.spawn_probe()
            return service
        except BaseException:
            pool.shutdown()
            registry.close()
            lock.release()
            raise

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a task of the service's own (cancelled when it closes)."""
        self._tasks.spawn(coro)

    def close(self) -> None:
        self._tasks.cancel()
        self.healer.close()
        self.readers.close()
        self.lowerings.close()
        self.gangs.close()
        keep = self.settings.keep_executors
        self.pool.shutdown(keep if keep is not None else self.settings.ray_address is not None)
        self.registry.close()
        if self._lock is not None:
            self._lock.release()

    # -- clients ---------------------------------------------------------------------------

    def create_client(self, name: str, weight: float = 1.0) -> tuple[ClientRecord, str]:
        """Open a client; returns it and its secret (the only time the secret is shown)."""
        return self._clients.create(name, weight)

    def caller(self, authorization: str | None) -> Admin | ClientRecord:
        """The admin or the client whose credential this is (`server.auth`)."""
        return self._clients.caller(authorization)

    def client(self, client_id: str) -> ClientRecord:
        return self._clients.get(client_id)

    def expire_clients(self, now: float) -> list[str]:
        """Close every client that has sent nothing for longer than its lease (and has no
        request in progress), freeing all it holds; returns their ids."""
        gone = self._clients.expired(now)
        for cid in gone:
            log.warning("client %s: no request for %gs; closing it and freeing what it holds", cid,
                        self._clients.lease_s)
            self.close_client(cid)
        return gone

    async def _expire_clients_forever(self) -> None:
        while True:
            await asyncio.sleep(min(30.0, self.settings.client_lease_s / 4))
            try:
                self.expire_clients(time.monotonic())
            except Exception:  # never let one bad close stop the leases
                log.exception("expiring clients failed")

    def close_client(self, client_id: str) -> None:
        owner = self._clients.get(client_id)
        self._clients.forget(owner)  # its queued work first: nothing of it runs after
        closed = f"client {owner.id} was closed"
        self.loops.cancel_runs(owner.id, closed)  # nor loops on
        self.healer.stop([*owner.programs, *owner.computations], closed)  # nor one computation
        self._buffers.delete(owner, sorted(owner.buffers))
        self.lineage.drop_owner(owner.id)
        self._computations.drop(owner, list(owner.computations))
        self.programs.forget(owner)
        self.rm.release_owner(owner.id)
        self._clients.remove(owner)

    # -- slices ----------------------------------------------------------------------------

    def create_slice(self, owner: ClientRecord, mesh: dict[str, int], island: str | None,
                     device_kind: str | None) -> Slice:
        return self._slices.create(owner, mesh, island, device_kind)

    def slice(self, owner: ClientRecord, slice_id: str) -> Slice:
        return self._slices.get(owner, slice_id)

    def slices_of(self, owner: ClientRecord) -> list[Slice]:
        return self._slices.of(owner)

    def slice_platform(self, s: Slice) -> str:
        return self._slices.platform(s)

    def delete_slice(self, owner: ClientRecord, slice_id: str) -> None:
        s = self._slices.get(owner, slice_id)
        deleted = f"slice {s.id} was deleted"
        self.loops.cancel_runs(owner.id, deleted, s.id)  # its loops end too
        on_it = [b for b in owner.buffers if self.buffers[b].slice_id == s.id]
        self._buffers.delete(owner, on_it)
        owner.free_with(on_it, s.id)
        on_slice = self._computations.on_slice(owner, s.id)
        self.healer.stop([*on_slice, *self.programs.using(owner, s.id)], deleted)  # one computation too
        self._computations.drop(owner, on_slice)
        self.programs.forget_slice(owner, s.id)
        self._slices.release(s)

    # -- metrics ---------------------------------------------------------------------------

    async def scrape(self) -> bytes:
        """The Prometheus text of `GET /metrics`: what was counted, and what is held now."""
        return self.metrics.exposition(await self._cluster.families())

    def made_by(self, rec: BufferRecord) -> str | None:
        """The id of the run that computes the buffer (its newest repeat's); None for an upload."""
        origin = self.lineage.origins.get(rec.id)
        return origin.run or None if origin is not None else None

    async def trace(self, client: str | None, run_id: str) -> dict[str, Any]:
        """The Chrome trace of `client`'s traced run (None: the admin, any client's), once
        it has ended (`server.tracing`)."""
        run = self.traces.get(client, run_id)
        timeout = self.settings.rpc_timeout_s
        return await self.traces.collect(self.pool, run, timeout, timeout)

    # -- islands ---------------------------------------------------------------------------

    async def restart_island(self, island: str, cause: str) -> int:
        """Replace the island's executors; how many buffers were lost (`Healer.restart_island`)."""
        return await self.healer.restart_island(island, cause)

    # -- buffers ---------------------------------------------------------------------------

    def upload(self, owner: ClientRecord, slice_id: str, aval: Aval, spec: Spec,
               data: bytes, buffer_id: str | None = None) -> BufferRecord:
        """Upload onto a slice; `buffer_id` is an id the client chose (`records.output_ids`)."""
        [new] = self._buffers.output_ids(owner, None if buffer_id is None else [buffer_id], 1, "id")
        s = self._slices.get(owner, slice_id)
        spec.check(aval, s.mesh, "upload")
        if len(data) != aval.nbytes:
            raise InvalidArgument(
                f"body has {len(data)} bytes; an array {aval} needs exactly {aval.nbytes} "
                "(raw little-endian bytes in C order, nothing else)"
            )
        [footprint] = self._buffers.check_room(owner, [(s, aval, spec)])
        rec = BufferRecord(new, owner.id, s.id, tuple(s.hosts), aval, spec)
        upload = Upload(data, s.id, aval, spec)
        if s.island in self.restarting:  # for its new executors, once they are up
            self._remaker.put(owner, s, rec.id, upload)
        else:
            mesh = self._slices.mesh(s)
            self.pool.put(rec.hosts, rec.id, data, aval.dtype, aval.shape, mesh, spec.to_json())
        self._buffers.add(owner, [rec], [footprint])
        self.lineage.uploaded(rec.id, upload, owner.id)
        return rec

    def buffer(self, owner: ClientRecord, buffer_id: str) -> BufferRecord:
        return self._buffers.get(owner, buffer_id)

    def release(self, owner: ClientRecord, buffer_ids: Sequence[str]) -> None:
        """Free what the client dropped; ids already gone are skipped (`Buffers.release`)."""
        self._buffers.release(owner, buffer_ids)

    def delete_buffers(self, owner: ClientRecord, buffer_ids: Sequence[str]) -> None:
        self._buffers.delete(owner, buffer_ids)

    def not_lost(self, rec: BufferRecord, what: str = "") -> BufferRecord:
        return self._buffers.not_lost(rec, what)

    def usable(self, rec: BufferRecord, what: str = "") -> BufferRecord:
        """The buffer, made again first if it was lost (`server.remake`)."""
        return self.programs.usable(rec, what)

    # -- computations ----------------------------------------------------------------------

    async def register(self, owner: ClientRecord, slice_id: str, artifact_b64: str,
                       in_specs: list[Any], out_specs: list[Any], name: str) -> ComputationRecord:
        """A computation of the artifact for the slice (`Computations.register`)."""
        return await self._computations.register(owner, slice_id, artifact_b64, in_specs, out_specs, name)

    def delete_computations(self, owner: ClientRecord, computation_ids: Sequence[str]) -> None:
        self._computations.delete(owner, computation_ids)

    def forget_computations(self, owner: ClientRecord, computation_ids: Sequence[str]) -> None:
        self._computations.forget(owner, computation_ids)

    def computation(self, owner: ClientRecord, computation_id: str) -> ComputationRecord:
        return self._computations.get(owner, computation_id)

    def call(self, owner: ClientRecord, computation_id: str, inputs: Sequence[str],
             ids: Sequence[str] | None = None) -> list[BufferRecord]:
        """Enqueue one call (a run of the computation's one-node program, `server.calls`) and
        return its outputs at once, as futures; `ids` names them (the client's choice), else
        the server does."""
        return self._computations.call(owner, computation_id, inputs, ids)


def _same_cluster(stored: dict[str, Any] | None, spec: ClusterSpec | None) -> bool:
    """Whether executors started for the `stored` cluster may serve `spec` (None: read from
    the Ray nodes' labels, whose hosts keep their names). A changed cluster file starts
    afresh: its hosts' devices may differ from what the old executors have."""
    if stored is None or spec is None:
        return True
    if stored != spec.to_json():
        log.warning("the cluster differs from the one the running executors were started for: "
                    "new executors (the values on the old ones are lost)")
        return False
    return True
