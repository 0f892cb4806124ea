"""The server's logic, independent of HTTP: clients, slices, buffers, computations, calls.

Every operation takes the calling client's id and sees only that client's objects; an id
that exists but belongs to another client is reported exactly like one that does not.
Handlers in `server/routes` only parse, call one method here and shape the answer.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Sequence
from typing import Any

from executors import ExecutorPool, Placement, RayOptions
from ir import (
    Aval,
    Conflict,
    InvalidArgument,
    MeshAxes,
    NotFound,
    Spec,
    Unavailable,
    content_hash,
    executable_key,
)
from resource_manager import ClusterSpec, ResourceManager, Slice, default_cluster, load_cluster
from server.artifacts import inspect_artifact
from server.errors import Unauthorized
from server.programs import Programs
from server.records import BufferRecord, ClientRecord, ComputationRecord, new_id
from server.settings import Settings

log = logging.getLogger("isthmus.server")


class Service:
    def __init__(self, settings: Settings, pool: ExecutorPool, rm: ResourceManager) -> None:
        self.settings = settings
        self.pool = pool
        self.rm = rm
        self.clients: dict[str, ClientRecord] = {}
        self.buffers: dict[str, BufferRecord] = {}
        self.computations: dict[str, ComputationRecord] = {}
        self.programs = Programs(self)
        self._tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def start(cls, settings: Settings) -> Service:
        spec: ClusterSpec = (
            load_cluster(settings.cluster_file) if settings.cluster_file else default_cluster()
        )
        options = RayOptions(
            address=settings.ray_address,
            num_cpus=settings.ray_num_cpus,
            object_store_bytes=settings.object_store_mb << 20,
        )
        pool = await ExecutorPool.start(spec, options)
        try:
            reports = await pool.reports(settings.rpc_timeout_s)
            return cls(settings, pool, ResourceManager(spec, reports))
        except BaseException:
            pool.shutdown()
            raise

    def close(self) -> None:
        for t in self._tasks:
            t.cancel()
        self.programs.close()
        self.pool.shutdown()

    # -- clients ---------------------------------------------------------------------------

    def create_client(self, name: str) -> ClientRecord:
        rec = ClientRecord(new_id("cl"), name)
        self.clients[rec.id] = rec
        return rec

    def client(self, client_id: str | None) -> ClientRecord:
        if client_id is None:
            raise Unauthorized("missing X-Isthmus-Client header: create a client with POST /v1/clients")
        rec = self.clients.get(client_id)
        if rec is None:
            raise Unauthorized(f"unknown client {client_id!r}: create one with POST /v1/clients")
        return rec

    def close_client(self, client_id: str) -> None:
        owner = self.client(client_id)
        self.delete_buffers(owner, sorted(owner.buffers))
        for cid in owner.computations:
            self.computations.pop(cid, None)
        self.programs.forget(owner)
        self.rm.release_owner(owner.id)
        del self.clients[owner.id]

    # -- slices ----------------------------------------------------------------------------

    def create_slice(self, owner: ClientRecord, mesh: dict[str, int], island: str | None,
                     device_kind: str | None) -> Slice:
        return self.rm.create_slice(MeshAxes.of(mesh), owner.id, island=island,
                                    device_kind=device_kind)

    def slice(self, owner: ClientRecord, slice_id: str) -> Slice:
        s = self.rm.get_slice(slice_id)  # NotFound names the id
        if s.owner != owner.id:  # another client's slice reads exactly like a missing one
            raise NotFound(f"slice {slice_id!r} does not exist")
        return s

    def slice_platform(self, s: Slice) -> str:
        return self.rm.device(s.device_ids[0]).platform

    def delete_slice(self, owner: ClientRecord, slice_id: str) -> None:
        s = self.slice(owner, slice_id)
        self.delete_buffers(owner, [b for b in owner.buffers if self.buffers[b].slice_id == s.id])
        for cid in [c for c in owner.computations if self.computations[c].slice_id == s.id]:
            owner.computations.discard(cid)
            self.computations.pop(cid, None)
        self.programs.forget_slice(owner, s.id)
        self.rm.release(s.id)

    def _host_and_placement(self, s: Slice) -> tuple[str, Placement]:
        if len(s.hosts) != 1:
            raise Conflict(f"slice {s.id} spans hosts {list(s.hosts)}; one host is supported")
        indices = tuple(self.rm.device(d).index for d in s.device_ids)
        return s.hosts[0], (indices, s.mesh.axes)

    # -- buffers ---------------------------------------------------------------------------

    def upload(self, owner: ClientRecord, slice_id: str, aval: Aval, spec: Spec,
               data: bytes) -> BufferRecord:
        s = self.slice(owner, slice_id)
        spec.check(aval, s.mesh, "upload")
        if len(data) != aval.nbytes:
            raise InvalidArgument(
                f"body has {len(data)} bytes; an array {aval} needs exactly {aval.nbytes} "
                "(raw little-endian bytes in C order, nothing else)"
            )
        host, placement = self._host_and_placement(s)
        rec = BufferRecord(new_id("b"), owner.id, s.id, host, aval, spec)
        self.pool.put(host, rec.id, data, aval.dtype, aval.shape, placement, spec.to_json())
        return self.own(owner, rec)

    def own(self, owner: ClientRecord, rec: BufferRecord) -> BufferRecord:
        self.buffers[rec.id] = rec
        owner.buffers.add(rec.id)
        return rec

    def buffer(self, owner: ClientRecord, buffer_id: str) -> BufferRecord:
        rec = self.buffers.get(buffer_id)
        if rec is None or rec.owner != owner.id:
            raise NotFound(f"buffer {buffer_id!r} does not exist")
        return rec

    async def state(self, rec: BufferRecord) -> str:
        try:
            [state] = await self.pool.states(rec.host, [rec.id], self.settings.rpc_timeout_s)
        except Unavailable:
            return "failed"
        return state

    async def wait(self, rec: BufferRecord) -> str:
        """Wait until the buffer settles; raise its remote cause if it failed."""
        await self.pool.wait(rec.host, rec.id, self.settings.fetch_timeout_s)
        return "ready"

    async def fetch(self, owner: ClientRecord, buffer_id: str) -> tuple[BufferRecord, bytes]:
        rec = self.buffer(owner, buffer_id)
        return rec, await self.pool.fetch(rec.host, rec.id, self.settings.fetch_timeout_s)

    def delete_buffers(self, owner: ClientRecord, buffer_ids: Sequence[str]) -> None:
        by_host: dict[str, list[str]] = {}
        for b in buffer_ids:
            rec = self.buffer(owner, b)
            by_host.setdefault(rec.host, []).append(rec.id)
        for host, ids in by_host.items():
            self.pool.delete(host, ids)
            for b in ids:
                owner.buffers.discard(b)
                del self.buffers[b]

    # -- computations ----------------------------------------------------------------------

    def register(self, owner: ClientRecord, slice_id: str, artifact_b64: str,
                 in_specs: list[Any], out_specs: list[Any], name: str) -> ComputationRecord:
        s = self.slice(owner, slice_id)
        try:
            artifact = base64.b64decode(artifact_b64, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument("artifact: not valid base64") from None
        info = inspect_artifact(artifact, s.mesh, self.slice_platform(s))
        ins = _specs(in_specs, info.in_avals, s, "in_specs")
        outs = _specs(out_specs, info.out_avals, s, "out_specs")
        info.check_specs(ins, outs, "")
        host, placement = self._host_and_placement(s)
        key = executable_key(content_hash(artifact), placement[0], s.mesh.axes)
        rec = ComputationRecord(new_id("c"), owner.id, s.id, key, name or "computation",
                                info.in_avals, info.out_avals, ins, outs)
        self.computations[rec.id] = rec
        owner.computations.add(rec.id)
        task = asyncio.get_running_loop().create_task(
            self._compile(rec, host, artifact, placement)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return rec

    async def _compile(self, rec: ComputationRecord, host: str, artifact: bytes,
                       placement: Placement) -> None:
        try:
            message = await self.pool.compile(
                host, rec.key, artifact, placement, [s.to_json() for s in rec.in_specs],
                [s.to_json() for s in rec.out_specs], self.settings.rpc_timeout_s,
            )
        except Exception as e:
            message = f"{type(e).__name__}: {e}"
        rec.status, rec.message = ("failed", message) if message else ("ready", None)

    def computation(self, owner: ClientRecord, computation_id: str) -> ComputationRecord:
        rec = self.computations.get(computation_id)
        if rec is None or rec.owner != owner.id:
            raise NotFound(f"computation {computation_id!r} does not exist")
        return rec

    # -- calls -----------------------------------------------------------------------------

    def call(self, owner: ClientRecord, computation_id: str,
             inputs: Sequence[str]) -> list[BufferRecord]:
        """Enqueue one call and return its outputs at once, as futures."""
        comp = self.computation(owner, computation_id)
        if comp.status == "failed":
            raise Conflict(f"computation {comp.id} failed to compile: {comp.message}")
        if len(inputs) != len(comp.in_avals):
            raise InvalidArgument(
                f"computation {comp.id} takes {len(comp.in_avals)} inputs; got {len(inputs)}"
            )
        s = self.slice(owner, comp.slice_id)
        host, placement = self._host_and_placement(s)
        args: list[str] = []
        moved: list[str] = []
        for i, (b, want) in enumerate(zip(inputs, comp.in_avals, strict=True)):
            rec = self.buffer(owner, b)
            if rec.aval != want:
                raise InvalidArgument(
                    f"input {i} (buffer {b}): expected {want}, got {rec.aval}"
                )
            if rec.host != host:
                tmp = new_id("t")
                self.pool.transfer(rec.host, rec.id, host, tmp, placement,
                                   comp.in_specs[i].to_json())
                moved.append(tmp)
                b = tmp
            args.append(b)
        outs = [BufferRecord(new_id("b"), owner.id, s.id, host, aval, spec)
                for aval, spec in zip(comp.out_avals, comp.out_specs, strict=True)]
        self.pool.call(host, comp.key, args, [o.id for o in outs], f"{comp.name} ({comp.id})")
        self.pool.delete(host, moved)
        return [self.own(owner, o) for o in outs]


def _specs(values: list[Any], avals: Sequence[Aval], s: Slice, field: str) -> tuple[Spec, ...]:
    if len(values) != len(avals):
        raise InvalidArgument(f"{field}: {len(values)} specs for {len(avals)} arrays")
    specs = tuple(Spec.from_json(v, f"{field}[{i}]") for i, v in enumerate(values))
    for i, (spec, aval) in enumerate(zip(specs, avals, strict=True)):
        spec.check(aval, s.mesh, f"{field}[{i}]")
    return specs
