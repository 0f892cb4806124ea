"""Request and response bodies of the REST API (`/v1`). JSON only; array data is raw bytes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

SpecJSON = list[str | list[str] | None]


class ClientCreate(BaseModel):
    name: str = Field("", max_length=200)
    weight: float = Field(1.0, gt=0, le=1e6, description="share of an island under the 'share' policy")


class ClientPublic(BaseModel):
    id: str
    name: str
    weight: float = 1.0


class DevicePublic(BaseModel):
    id: int
    island: str
    host: str
    index: int
    platform: str
    kind: str
    memory_bytes: int | None
    status: Literal["up", "down"]
    load: int = Field(description="virtual devices (slice members) mapped onto this device")


class HostPublic(BaseModel):
    name: str
    island: str
    status: Literal["up", "down"]
    devices: list[int]
    queued: int
    completed: int
    running: str | None
    running_s: float | None = Field(None, description="how long the running request has run")
    waiting_for: int | None = Field(
        None, description="a sequence number later requests wait behind (not arrived yet)")
    collective_error: str | None = Field(
        None, description="the first failed cross-host collective (the island's group is broken)")
    requests: int = Field(0, description="sequenced requests the host has received")
    dispatch_messages: int = Field(0, description="program run messages the server has sent it")


class IslandPublic(BaseModel):
    name: str
    devices: int
    slices: int
    load: float
    queued: int = Field(0, description="calls and program runs waiting for the gang scheduler")
    in_flight: int = Field(0, description="calls and program runs admitted and not yet finished")
    admitted: dict[str, float] = Field(
        default_factory=dict, description="cost admitted so far per client id (computations)"
    )
    hosts: list[HostPublic]


class IslandRestarted(BaseModel):
    island: str
    lost_buffers: int = Field(description="buffers whose values were on the island's hosts")


class SliceCreate(BaseModel):
    mesh: dict[str, int] = Field(description='named mesh axes in order, e.g. {"data": 2, "model": 2}')
    island: str | None = None
    device_kind: str | None = None


class SlicePublic(BaseModel):
    id: str
    mesh: dict[str, int]
    island: str
    hosts: list[str]
    device_ids: list[int]
    platform: str


class BufferPublic(BaseModel):
    id: str
    slice_id: str
    shape: list[int]
    dtype: str
    spec: SpecJSON
    state: Literal["pending", "ready", "failed", "missing"] | None = None


class BufferIds(BaseModel):
    ids: list[str]


class ComputationCreate(BaseModel):
    slice_id: str
    artifact: str = Field(description="the serialized jax.export artifact, base64")
    in_specs: list[SpecJSON]
    out_specs: list[SpecJSON]
    name: str = Field("", max_length=200)


class ComputationPublic(BaseModel):
    id: str
    slice_id: str
    name: str
    status: Literal["pending", "ready", "failed"]
    message: str | None
    in_avals: list[dict[str, Any]]
    out_avals: list[dict[str, Any]]
    in_specs: list[SpecJSON]
    out_specs: list[SpecJSON]


class CallCreate(BaseModel):
    computation_id: str
    inputs: list[str]
    release: list[str] = Field(
        default_factory=list, description="buffers the client dropped: freed after this call"
    )


class CallPublic(BaseModel):
    outputs: list[BufferPublic]


class Health(BaseModel):
    status: Literal["ok"]
    hosts: int
    version: str


class ProgramCreate(BaseModel):
    program: dict[str, Any] = Field(description="the IR program in its JSON wire form (format isthmus.ir)")
    name: str = Field("", max_length=200)
    fuse: bool | None = Field(
        None, description="fuse adjacent computations on one slice into one executable (default: server's)"
    )


class ProgramPublic(BaseModel):
    id: str
    name: str
    status: Literal["pending", "ready", "failed"]
    message: str | None
    args: list[dict[str, Any]]
    results: list[dict[str, Any]]
    nodes: int
    edges: int
    runs: int
    fuse: bool


class ProgramText(BaseModel):
    text: str = Field(description="the program's text form (artifacts named by hash)")
    lowered: str = Field(description="the program lowered for its slices' current placement")
    plans: list[dict[str, Any]] = Field(description="each host's plan: its steps in order")


class RunCreate(BaseModel):
    program_id: str
    inputs: list[str]
    release: list[str] = Field(
        default_factory=list, description="buffers the client dropped: freed after this run"
    )
    dispatch: Literal["parallel", "sequential"] | None = Field(
        None, description="parallel: one message per host; sequential: one per node (default: server's)"
    )


class RunPublic(BaseModel):
    outputs: list[BufferPublic]
