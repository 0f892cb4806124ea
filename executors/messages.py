"""What executors answer and hand each other: closed types, never strings or tuples.

- A read of a buffer answers `Ready(value)` or `Failed(cause)`; the pool turns a host that
  is gone into `Lost(cause)` where it settles runs, and into `Unavailable` where it reads.
- A host hands a value to a peer host as `Whole(array)` (from a slice on one host),
  `Shards(shards)` (its distinct shards, from a slice spanning hosts), `Failed(cause)`, or
  `Dead()` from a branch not taken.
- A buffer's state on a host is a `State`.
- A run message, once its steps are issued, answers `Ran(collective_error, ready)`: the
  host's first failed cross-host collective, if any (its island's group must be formed
  again), and the results it closed that this host holds computed without error.
- The pool sums a run's answers into a `Settlement`.
- A host taken over by a restarted server answers `Adopted`.
- The server hands a host a `RunMessage`: which steps of which plan it runs, and the run's
  buffer bindings (`executors.runner`).
"""

from __future__ import annotations

import enum
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from executors.shards import Index


@dataclass(frozen=True, slots=True)
class Ready:
    value: Any = None


@dataclass(frozen=True, slots=True)
class Failed:
    cause: str


@dataclass(frozen=True, slots=True)
class Lost:
    cause: str


@dataclass(frozen=True, slots=True)
class Whole:
    array: Any  # np.ndarray


@dataclass(frozen=True, slots=True)
class Shards:
    shards: Sequence[tuple[Index, Any]]  # (index, np.ndarray), one per distinct index


@dataclass(frozen=True, slots=True)
class Dead:
    """The dead signal of an untaken branch or a finished loop (Yu et al.): no data."""


@dataclass(frozen=True, slots=True)
class Abort:
    """A host left a loop early (its predicate failed): every value it would still have sent
    in that frame (tags `...@<host><prefix>...`) fails with `cause` rather than being waited for."""

    host: str
    prefix: str  # the enclosing frames and iterations, then `/<frame>:`
    cause: str


@dataclass(frozen=True, slots=True)
class Ran:
    collective_error: str | None = None
    ready: tuple[str, ...] = ()  # buffer ids


@dataclass(frozen=True)
class Settlement:
    broken: dict[str, str] = field(default_factory=dict)  # host -> its failed collective
    ready: Counter[str] = field(default_factory=Counter)  # buffer id -> hosts holding it computed


@dataclass(frozen=True)
class Adopted:
    """What a host a new server takes over answers (`Host.adopt`): the sequence number the
    new server's requests start from, and the buffers it holds, by state (pending: still
    computing, or queued behind a request that never came)."""

    next_seq: int
    states: dict[str, State]


class State(enum.Enum):
    PENDING = "pending"
    READY = "ready"
    FAILED = "failed"
    MISSING = "missing"


Reply = Ready | Failed
Payload = Whole | Shards | Failed | Dead | Abort
Settled = Ran | Lost


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
    trace: bool = False  # record what the run does here (`executors.tracing`)
