"""Values as they cross between hosts inside a program: what a `Send` hands a peer, and what
a `Recv` makes of the parts it received.

Contract:
- `payload_of(value)` is what a host sends of a value of its run: `Whole` (host memory, numpy)
  from a slice on one host, this host's distinct `Shards` from a slice spanning hosts, the
  `Failed` cause of a failed value (the peer's dependents fail with the same cause), and
  `Dead` for a dead one (the peer's branch finishes too).
- `received(parts, step)` is the value a `Recv` defines from its sources' parts (one per
  source host, in order): failed if one failed, dead if one is dead, else the whole value
  assembled; kept in host memory if the step says so, or while it is for this process's
  devices alone (a `HostArray`: JAX places it as the computation taking it is called),
  else placed on the step's mesh.
- A part is delivered under `part_tag(step tag, sending host)`, so a receive from a slice
  spanning hosts waits for each of its sources.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from executors.compile import HostArray, host_copy, place, sharding_of
from executors.control import DEAD
from executors.messages import Dead, Failed, Payload, Shards, Whole
from executors.shards import Index, distinct_shards, whole
from executors.store import Failure
from ir import Recv


def part_tag(step_tag: str, source: str) -> str:
    """The mailbox of one source host's part of a transfer."""
    return f"{step_tag}@{source}"


def payload_of(value: Any) -> Payload:
    if value is DEAD:  # the dead signal crosses hosts, so the peer's branch finishes too
        return Dead()
    if isinstance(value, Failure):
        return Failed(value.cause)
    if isinstance(value, HostArray):  # received here, sent on as it came
        return Whole(value.array)
    if value.is_fully_addressable:
        return Whole(host_copy(value))
    return Shards(distinct_shards(value, host_copy))


def received(parts: Sequence[Payload], step: Recv) -> Any:
    failed = next((p for p in parts if isinstance(p, Failed)), None)
    if failed is not None:
        return Failure(failed.cause)
    if any(isinstance(p, Dead) for p in parts):
        return DEAD
    match parts:
        case [Whole(array=value)]:
            pass
        case _:
            value = whole([shard for p in parts for shard in _shards(p)])
    if step.on_host:
        return value
    sharding = sharding_of(step.mesh, step.spec)
    if sharding.is_fully_addressable:  # placed by the computation that takes it
        return HostArray(value, sharding)
    return place(value, step.mesh, step.spec)


def _shards(part: Payload) -> Sequence[tuple[Index, np.ndarray]]:
    match part:
        case Shards(shards=shards):
            return shards
        case Whole(array=array):
            return [([(0, n) for n in array.shape], array)]
        case _:  # an Abort is never a receive's part: it fails the mailbox instead
            raise TypeError(f"a receive's part must be Whole or Shards, found {part!r}")
