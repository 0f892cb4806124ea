"""What the server knows of each client, buffer and computation: control metadata only.

Array data never lives here; it lives on the executors, keyed by the same ids.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field

from ir import Aval, Spec


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


@dataclass(eq=False)
class ClientRecord:
    id: str
    name: str
    weight: float = 1.0  # its share of an island under proportional-share scheduling
    key: bytes = field(default=b"", repr=False)  # its secret's digest (server.auth)
    last_seen: float = field(default_factory=time.monotonic)  # its lease runs from here
    in_flight: int = 0  # requests of it in progress (it never expires meanwhile)
    buffer_bytes: int = 0  # the bytes of its live buffers, against its quota
    buffers: set[str] = field(default_factory=set)
    computations: set[str] = field(default_factory=set)
    programs: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class BufferRecord:
    id: str
    owner: str
    slice_id: str
    hosts: tuple[str, ...]  # one, or every host of a slice spanning an island's hosts
    aval: Aval
    spec: Spec


@dataclass
class ComputationRecord:
    id: str
    owner: str
    slice_id: str
    key: str  # the executable's cache key on the host: artifact hash @ devices
    name: str
    in_avals: tuple[Aval, ...]
    out_avals: tuple[Aval, ...]
    in_specs: tuple[Spec, ...]
    out_specs: tuple[Spec, ...]
    hosts: tuple[str, ...] = ()  # where its executable is compiled
    status: str = "pending"
    message: str | None = None
    artifact: bytes = field(default=b"", repr=False)  # kept to compile again on restarted hosts
