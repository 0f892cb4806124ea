"""The server's logic, independent of HTTP: clients, slices, buffers, computations, calls
(reading a buffer is `server.reads`).

Every operation takes the calling client's id and sees only that client's objects; an id
that exists but belongs to another client is reported exactly like one that does not.
Handlers in `server/routes` only parse, call one method here and shape the answer.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from typing import Any

from executors import ExecutorPool, RayOptions
from executors.messages import Settlement
from executors.ray_daemon import ServerLock, hold_server_lock
from ir import (
    Aval,
    Conflict,
    DeviceMesh,
    InvalidArgument,
    MeshAxes,
    NotFound,
    Placement,
    RemoteError,
    Spec,
)
from ir.passes import device_mesh
from resource_manager import ClusterSpec, ResourceManager, Slice, default_cluster, load_cluster
from server import recovery
from server.artifacts import ArtifactInfo, declared_specs, decode_artifact, registration_digest
from server.auth import Admin, Credentials
from server.caches import HostCaches
from server.gang import Gangs
from server.healing import Healer
from server.host_memory import Footprint, HostMemory
from server.lineage import Lineage, Upload
from server.membership import watch_nodes
from server.program_record import compiled
from server.programs import Programs
from server.quotas import Quotas
from server.readers import Readers
from server.records import BufferRecord, ClientRecord, ComputationRecord, new_id, output_ids
from server.registry import Registry
from server.remake import queued_put
from server.restarts import Restarts
from server.settings import Settings
from server.settling import Settling
from server.state import read_secret, secret
from server.store import open_store
from server.tasks import Tasks

log = logging.getLogger("isthmus.server")
CLUSTER = "cluster"  # the registry's note of the cluster the executors were started for
PLACEMENTS_KEPT = 4096  # slices whose placement is remembered (far more than are live)
LOST_RELEASED_KEPT = 1 << 16  # released buffers remembered as lost with their hosts


class Service:
    def __init__(self, settings: Settings, pool: ExecutorPool, rm: ResourceManager,
                 admin_token: str, registry: Registry) -> None:
        self.settings = settings
        self.pool = pool
        self.rm = rm
        # id(slice) -> the slice (held, so its id names no other) and its placement
        self._placed: dict[int, tuple[Slice, Placement]] = {}
        self.credentials = Credentials(admin_token)
        self.quotas = Quotas.of(settings)
        # buffers' bytes on the hosts, against what they offer and the clients' claims on it
        self.memory = HostMemory(rm, registry, settings.buffer_reserve)
        self.caches = HostCaches(pool.forget)
        # Client artifacts are read in processes of their own, shared fairly (server.readers).
        self.readers = Readers(settings.artifact_readers)
        self.readers.start()
        # The records (what survives a restart) are the registry's; these read them.
        self.registry = registry
        self.clients = registry.clients
        self.buffers = registry.buffers
        self.computations = registry.computations
        self.lost = registry.lost  # buffer id -> why its value is gone (its island restarted)
        self.freeing: set[str] = set()  # released buffers whose hosts free them after queued work
        # released buffers that queued work reads, lost with their hosts -> why (newest kept)
        self.lost_released: OrderedDict[str, str] = OrderedDict()
        # What made each buffer, to make a lost one again (`server.remake`).
        self.lineage = Lineage(settings.lineage_mb << 20, settings.lineage_released)
        self.programs = Programs(self)
        window = settings.gang_window if settings.gang_order else 1 << 30
        self.gangs = Gangs(rm.islands(), settings.gang_policy, window, settings.gang_window_s)
        self.settling = Settling()  # results known ready from the hosts' answers
        self.restarting = Restarts()  # islands whose executors are being replaced
        self._tasks = Tasks()
        self._lock: ServerLock | None = None  # on the state dir, while this server runs
        self.healer = Healer(self)
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
            recovery.restore(service, loaded, pool.adopted)
            registry.set_meta(CLUSTER, pool.spec.to_json())
            service._tasks.spawn(service._expire_clients_forever())
            if pool.discovered:  # nodes labelled later become hosts
                service._tasks.spawn(watch_nodes(service))
            if settings.health_probe_s > 0:
                service._tasks.spawn(service.healer.probe_forever())
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
        self.readers.close()
        self.programs.close()
        self.gangs.close()
        keep = self.settings.keep_executors
        self.pool.shutdown(keep if keep is not None else self.settings.ray_address is not None)
        self.registry.close()
        if self._lock is not None:
            self._lock.release()

    # -- clients ---------------------------------------------------------------------------

    def create_client(self, name: str, weight: float = 1.0) -> tuple[ClientRecord, str]:
        """Open a client; returns it and its secret (the only time the secret is shown)."""
        self.quotas.check("clients", len(self.clients), 1)
        rec = ClientRecord(new_id("cl"), name, weight)
        secret, rec.key = self.credentials.issue(rec.id)
        self.registry.add_client(rec)
        self.gangs.set_weight(rec.id, weight)
        return rec, secret

    def caller(self, authorization: str | None) -> Admin | ClientRecord:
        """The admin or the client whose credential this is (`server.auth`)."""
        who = self.credentials.who(authorization)
        return who if isinstance(who, Admin) else self.clients[who]

    def client(self, client_id: str) -> ClientRecord:
        rec = self.clients.get(client_id)
        if rec is None:
            raise NotFound(f"client {client_id!r} does not exist")
        return rec

    def expire_clients(self, now: float) -> list[str]:
        """Close every client that has sent nothing for longer than its lease (and has no
        request in progress), freeing all it holds; returns their ids."""
        lease = self.settings.client_lease_s
        gone = [c.id for c in self.clients.values() if c.in_flight == 0 and now - c.last_seen > lease]
        for cid in gone:
            log.warning("client %s: no request for %gs; closing it and freeing what it holds", cid, lease)
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
        owner = self.client(client_id)
        self.credentials.revoke(owner.key)
        self.gangs.cancel_client(owner.id)  # its queued work first: nothing of it runs after
        closed = f"client {owner.id} was closed"
        self.programs.cancel_runs(owner.id, closed)  # nor loops on
        self.healer.stop([*owner.programs, *owner.computations], closed)  # nor one computation
        self.delete_buffers(owner, sorted(owner.buffers))
        self.lineage.drop_owner(owner.id)
        self._drop_computations(owner, list(owner.computations))
        self.programs.forget(owner)
        self.rm.release_owner(owner.id)
        self.registry.remove_client(owner)

    # -- slices ----------------------------------------------------------------------------

    def create_slice(self, owner: ClientRecord, mesh: dict[str, int], island: str | None,
                     device_kind: str | None) -> Slice:
        self.quotas.check("slices", len(self.rm.slices(owner=owner.id)), 1)
        s = self.rm.create_slice(MeshAxes.of(mesh), owner.id, island=island, device_kind=device_kind)
        if len(s.hosts) > 1 and s.island not in self.pool.groups:
            self.rm.release(s.id)
            raise Conflict(f"slice of {s.mesh.size} devices ({s.mesh.to_json()}) would span hosts "
                           f"{list(s.hosts)} of island {s.island}, which is not one JAX group")
        self.registry.add_slice(s)
        return s

    def slice(self, owner: ClientRecord, slice_id: str) -> Slice:
        s = self.rm.get_slice(slice_id)  # NotFound names the id
        if s.owner != owner.id:  # another client's slice reads exactly like a missing one
            raise NotFound(f"slice {slice_id!r} does not exist")
        return s

    def slice_platform(self, s: Slice) -> str:
        return self.rm.device(s.device_ids[0]).platform

    def delete_slice(self, owner: ClientRecord, slice_id: str) -> None:
        s = self.slice(owner, slice_id)
        deleted = f"slice {s.id} was deleted"
        self.programs.cancel_runs(owner.id, deleted, s.id)  # its loops end too
        on_it = [b for b in owner.buffers if self.buffers[b].slice_id == s.id]
        self.delete_buffers(owner, on_it)
        owner.free_with(on_it, s.id)
        on_slice = [c for c in owner.computations if self.computations[c].slice_id == s.id]
        self.healer.stop([*on_slice, *self.programs.using(owner, s.id)], deleted)  # one computation too
        self._drop_computations(owner, on_slice)
        self.programs.forget_slice(owner, s.id)
        self.rm.release(s.id)
        self.registry.remove_slices([s.id])

    def placement(self, s: Slice) -> Placement:
        """Where the slice's mesh lives: its island, and (host, local index) per position.
        Worked out once per slice (every call asks): a slice never moves, and the devices
        it names keep their host and index."""
        placed = self._placed.get(id(s))
        if placed is not None:
            return placed[1]
        devices = [self.rm.device(d) for d in s.device_ids]
        placement = Placement(s.island, tuple((d.host, d.index) for d in devices))
        if len(self._placed) >= PLACEMENTS_KEPT:  # slices released long ago: start afresh
            self._placed.clear()
        self._placed[id(s)] = (s, placement)
        return placement

    def mesh(self, s: Slice) -> DeviceMesh:
        """The slice's devices as its executors name them (`ir.passes.device_mesh`)."""
        try:
            return device_mesh(self.placement(s), s.mesh, self.pool.ranks, f"slice {s.id}")
        except InvalidArgument as e:
            raise Conflict(str(e)) from None

    # -- islands ---------------------------------------------------------------------------

    async def restart_island(self, island: str, cause: str) -> int:
        """Replace the island's executors (forming its JAX group again, if it is one); return
        how many buffers were lost with the old ones. Their records stay (reading them says
        why they are gone); computations and programs on the island compile again."""
        if island not in self.rm.islands():
            raise NotFound(f"island {island!r} does not exist (islands: {', '.join(self.rm.islands())})")
        if island in self.restarting:
            raise Conflict(f"island {island!r} is already restarting")
        self.restarting.add(island)
        return await self.healer.restart_claimed(island, cause)

    def restart_when_broken(self, island: str, cause: str) -> None:
        """A host reported a failed collective: its island's group cannot run collectives
        again, so restart it (once; reports during the restart are ignored)."""
        if island in self.pool.groups:
            self.healer.restart(island, f"a collective failed: {cause}", keep=True)

    def lose_values(self, hosts: Sequence[str], why: str) -> list[str]:
        """The buffers on these hosts are gone (their executors are): reading one says why.
        Those that work still queued will compute (numbered for new executors) are not."""
        gone = set(hosts)
        islands = {self.rm.host_island(h) for h in gone}
        coming = {b for i in islands for b in self.gangs.queued_outputs(i)}
        lost = [b for b, rec in self.buffers.items()
                if gone & set(rec.hosts) and b not in coming and b not in self.lost]
        self.registry.lose(lost, why)
        self.settling.forget(lost)
        # Released ones that queued work still reads went too (`Programs._unless_lost`).
        self.lose_released({b for i in islands for b in self.gangs.queued_reads(i)} - coming
                           - self.buffers.keys(), why)
        return lost

    def lose_released(self, buffer_ids: Iterable[str], why: str) -> None:
        """These released buffers (or temporary ones) are gone: work reading them finds out
        (the newest `LOST_RELEASED_KEPT` are remembered)."""
        for b in buffer_ids:
            self.lost_released[b] = why
            self.lost_released.move_to_end(b)
        while len(self.lost_released) > LOST_RELEASED_KEPT:
            self.lost_released.popitem(last=False)

    # -- buffers ---------------------------------------------------------------------------

    def upload(self, owner: ClientRecord, slice_id: str, aval: Aval, spec: Spec,
               data: bytes, buffer_id: str | None = None) -> BufferRecord:
        """Upload onto a slice; `buffer_id` is an id the client chose (`records.output_ids`)."""
        [new] = self.output_ids(owner, None if buffer_id is None else [buffer_id], 1, "id")
        s = self.slice(owner, slice_id)
        spec.check(aval, s.mesh, "upload")
        if len(data) != aval.nbytes:
            raise InvalidArgument(
                f"body has {len(data)} bytes; an array {aval} needs exactly {aval.nbytes} "
                "(raw little-endian bytes in C order, nothing else)"
            )
        [footprint] = self.check_room(owner, [(s, aval, spec)])
        rec = BufferRecord(new, owner.id, s.id, tuple(s.hosts), aval, spec)
        upload = Upload(data, s.id, aval, spec)
        if s.island in self.restarting:  # for its new executors, once they are up
            queued_put(self, owner, s, rec.id, upload)
        else:
            self.pool.put(rec.hosts, rec.id, data, aval.dtype, aval.shape, self.mesh(s), spec.to_json())
        self.add_buffers(owner, [rec], [footprint])
        self.lineage.uploaded(rec.id, upload, owner.id)
        return rec

    def check_room(self, owner: ClientRecord, outputs: Sequence[tuple[Slice, Aval, Spec]], submits: int = 0,
                   held: Mapping[str, int] | None = None) -> list[Footprint]:
        """Refuse buffers (and a queued submission whose run holds `held` bytes of its own
        values at once on each host, at most) past the client's quotas or the memory of
        their hosts (`server.host_memory`); the bytes each output takes on each host."""
        held = held or {}
        self.quotas.check("buffers", len(owner.buffers), len(outputs))
        total = sum(held.values())
        why = f" ({total} of them the intermediate values its run holds at once)" if total else ""
        more = sum(aval.nbytes for _, aval, _ in outputs) + total
        self.quotas.check("buffer_bytes", owner.buffer_bytes, more, " bytes", why)
        if submits:
            self.quotas.check("queued", self.gangs.waiting[owner.id], submits)
        footprints = [self.memory.footprint(s, aval, spec) for s, aval, spec in outputs]
        self.memory.check([*footprints, held], " (with the values its run holds at once)" if total else "",
                          owner.id)
        return footprints

    def add_buffers(self, owner: ClientRecord, recs: Sequence[BufferRecord],
                    footprints: Sequence[Footprint]) -> None:
        """Register new buffers, their bytes counted on their hosts."""
        self.registry.add_buffers(owner, recs)
        for rec, footprint in zip(recs, footprints, strict=True):
            self.memory.charge(rec.id, footprint, owner.id)

    def output_ids(self, owner: ClientRecord, chosen: Sequence[str] | None, count: int,
                   what: str) -> list[str]:
        """Ids for new buffers: fresh, or the client's own choice, checked; choosing an id
        takes it out of the client's refused ones."""
        ids = output_ids(chosen, count, self.buffers, what, owner.id, self.freeing)
        for b in chosen or ():
            owner.failed.pop(b, None)
            owner.freed_with.pop(b, None)
            self.lost_released.pop(b, None)  # a new value under an old id is not that one
        return ids

    def buffer(self, owner: ClientRecord, buffer_id: str) -> BufferRecord:
        rec = self.buffers.get(buffer_id)
        cause = owner.failed.get(buffer_id)
        if cause is not None:  # an output of a submission the server refused
            raise RemoteError(f"buffer {buffer_id} was never made: {cause}")
        if rec is None or rec.owner != owner.id:
            freed_with = owner.freed_with.get(buffer_id)
            if freed_with is not None:
                raise NotFound(f"buffer {buffer_id!r} was freed with its slice {freed_with}, deleted")
            raise NotFound(f"buffer {buffer_id!r} does not exist")
        return rec

    def release(self, owner: ClientRecord, buffer_ids: Sequence[str]) -> None:
        """Free what the client dropped: its buffers and refused ids among these; any other
        id (already freed, say) is skipped, so releasing is idempotent."""
        for b in buffer_ids:
            owner.failed.pop(b, None)
        self.delete_buffers(owner, [b for b in buffer_ids if b in owner.buffers])

    def delete_buffers(self, owner: ClientRecord, buffer_ids: Sequence[str]) -> None:
        buffer_ids = list(dict.fromkeys(buffer_ids))  # an id named twice is freed once
        by_host: dict[str, list[str]] = {}
        for b in buffer_ids:
            rec = self.buffer(owner, b)
            for host in rec.hosts:
                by_host.setdefault(host, []).append(rec.id)
        for host, ids in by_host.items():  # after any queued call or run that uses them
            self.gangs.later(ids, lambda host=host, ids=ids: self.pool.delete(host, ids))
        # Until then an id is not chosen again: its new value's submission would be queued
        # among those the delete waits for, and the delete, numbered after it, would free it.
        waiting = [b for b in buffer_ids if self.gangs.queued_for(b)]
        if waiting:
            self.freeing.update(waiting)
            self.gangs.later(waiting, lambda: self.freeing.difference_update(waiting))
        self.registry.remove_buffers(owner, buffer_ids)
        self.gangs.after_reads(buffer_ids, self.memory.release(buffer_ids))  # counted until freed
        for b in buffer_ids:
            self.lineage.release(b, owner.id)
        self.settling.forget(buffer_ids)

    def not_lost(self, rec: BufferRecord, what: str = "") -> BufferRecord:
        cause = self.lost.get(rec.id)
        if cause is not None:
            raise RemoteError(f"{what}buffer {rec.id} is gone: {cause}")
        return rec

    # -- computations ----------------------------------------------------------------------

    async def register(self, owner: ClientRecord, slice_id: str, artifact_b64: str,
                       in_specs: list[Any], out_specs: list[Any], name: str) -> ComputationRecord:
        """A computation of the artifact for the slice: the client's computation already
        registered with the same artifact, slice, specs and name, if it has one that has not
        failed (nothing is read or compiled again, and the quota counts it once)."""
        s = self.slice(owner, slice_id)
        # In proportion to the artifact's size (tens of MB at most): off the event loop too.
        said = await asyncio.to_thread(registration_digest, artifact_b64,
                                       [slice_id, in_specs, out_specs, name])
        known = self.computations.get(owner.registered.get(said, ""))
        if known is not None and known.status != "failed":
            self.registry.hold(owner, said, known.id)
            return known  # (one that failed to compile, on a host since lost perhaps, is tried anew)
        self.quotas.check("computations", len(owner.computations), 1)
        # Decoding and reading the artifact take time in proportion to its size: off the
        # event loop, which meanwhile serves every other request.
        artifact = await asyncio.to_thread(decode_artifact, artifact_b64)
        info = await self.inspect(owner, artifact, s)
        s = self.slice(owner, slice_id)  # still there, and still the caller's, after the wait
        self.quotas.check("computations", len(owner.computations), 1)
        self.quotas.check("stored_bytes", owner.stored_bytes, len(artifact), " bytes",
                          " (the artifact, kept in the state dir)")
        ins = declared_specs(in_specs, info.in_avals, s, "in_specs")
        outs = declared_specs(out_specs, info.out_avals, s, "out_specs")
        info.check_specs(ins, outs, "")
        self.mesh(s)  # its devices can be named (a slice spanning hosts needs their JAX group)
        rec = ComputationRecord(new_id("c"), owner.id, s.id, name or "computation",
                                info.in_avals, info.out_avals, ins, outs, artifact=artifact)
        call = self.programs.add_computation(rec)  # lowered, held on its hosts and compiled there
        self.registry.add_computation(owner, rec)
        self.registry.hold(owner, said, rec.id)
        await compiled(call)  # (answered once compiled: see `server.program_record.compiled`)
        return rec

    async def inspect(self, owner: ClientRecord, artifact: bytes, s: Slice) -> ArtifactInfo:
        """Read the owner's artifact for slice `s` under the server's limits, taking its turn
        among the clients (server.readers)."""
        return await self.readers.read(owner.id, artifact, s.mesh, self.slice_platform(s),
                                       max_bytes=self.settings.max_artifact_mb << 20,
                                       max_ops=self.settings.max_artifact_ops)

    def delete_computations(self, owner: ClientRecord, computation_ids: Sequence[str]) -> None:
        """Forget computations the client no longer calls; an id not among its computations
        is skipped (deleting is idempotent). Calls already queued still run."""
        self._drop_computations(owner, [c for c in computation_ids if c in owner.computations])

    def forget_computations(self, owner: ClientRecord, computation_ids: Sequence[str]) -> None:
        """Registrations the client let go of (an id once for each): a computation goes once
        none holds it (`delete_computations`)."""
        self.delete_computations(owner, self.registry.let_go(owner, computation_ids))

    def _drop_computations(self, owner: ClientRecord, computation_ids: Sequence[str]) -> None:
        """Forget these computations; hosts forget executables nothing else uses, once the
        calls queued before have run."""
        for cid in computation_ids:
            if self.registry.remove_computation(owner, cid):
                self.programs.forget_calls(cid)
        self.registry.unregister(owner, computation_ids)

    def computation(self, owner: ClientRecord, computation_id: str) -> ComputationRecord:
        rec = self.computations.get(computation_id)
        if rec is None or rec.owner != owner.id:
            raise NotFound(f"computation {computation_id!r} does not exist")
        return rec

    # -- calls -----------------------------------------------------------------------------

    def call(self, owner: ClientRecord, computation_id: str, inputs: Sequence[str],
             ids: Sequence[str] | None = None) -> list[BufferRecord]:
        """Enqueue one call (a run of the computation's one-node program, `server.calls`) and
        return its outputs at once, as futures; `ids` names them (the client's choice), else
        the server does."""
        return self.programs.call(owner, self.computation(owner, computation_id), inputs, ids)

    def settled(self, refs: Sequence[Any], hosts: Sequence[str],
                outputs: Sequence[str] = ()) -> asyncio.Future[None]:
        """What to await until the hosts have run their part (called at admission, so that
        a wait for `outputs` finds them settling): restart the group of any island whose
        host reports a failed collective; note the outputs every host holds computed. A
        future, not a task: the gang scheduler waits for one per run."""
        done = self.settling.start(outputs)

        def then(settlement: Settlement | None) -> None:
            ready: set[str] = set()
            try:
                if settlement is not None:
                    for host, cause in settlement.broken.items():
                        self.restart_when_broken(self.rm.host_island(host), cause)
                    ready = {b for b in outputs if (rec := self.buffers.get(b)) is not None
                             and settlement.ready[b] == len(rec.hosts) and b not in self.lost}
                    # (an output the client released already counts as made: its run is repeatable)
                    self.lineage.settled(ready | {b for b in outputs if b not in self.buffers})
            except Exception:
                log.exception("settling the run of %s failed", list(outputs)[:4])
            finally:
                self.settling.finish(done, outputs, ready)

        self.pool.when_settled(refs, hosts, self.settings.fetch_timeout_s, then)
        return done


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
