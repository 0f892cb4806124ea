"""What an executor reports of itself (`Host.stats`), and what a server asking it gets.

Contract:
- `HostStats` is one frozen value of plain data (it crosses Ray and the executor's channel
  as a pickle): what the host is doing, what it holds, and its bounds. `node`, `address`,
  `peer_sends` and `peer_bytes` are those of a Ray executor (`RayHost`); a plain `Host`
  leaves them empty. `peer_bytes` counts from the executor's start (a new one starts at 0).
- Asking a host for them is answered `Answered(stats)`, or `Lost(cause)` where it is gone,
  did not answer within the deadline, or failed the request (`ExecutorPool.ask`): a closed
  union, handled with `match`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from executors.messages import Lost


@dataclass(frozen=True, slots=True)
class PeerSends:
    """Sends to peer hosts, by the way they went: over their channels, or through Ray."""

    link: int = 0
    ray: int = 0


@dataclass(frozen=True, slots=True)
class Held:
    """What a host's runner holds for runs in progress (none of it once they have finished):
    runs with an environment, loop frames and mailboxes open; runs taken and not finished,
    told to stop (`cancel`), with a time limit, and with a peer that left a loop early;
    values on runs' stacks and their bytes."""

    runs: int = 0
    frames: int = 0
    mailboxes: int = 0
    taken: int = 0
    stopping: int = 0
    limited: int = 0
    aborted: int = 0
    stacked: int = 0  # values on runs' stacks (reverse mode's residuals of loops)
    stack_bytes: int = 0  # on the devices
    stack_swapped_bytes: int = 0  # moved to host memory


@dataclass(frozen=True, slots=True)
class HostStats:
    host: str
    pid: int
    queued: int  # requests arrived and waiting for their turn
    requests: int  # sequenced requests received
    completed: int
    running: str | None  # the request running now, or the oldest computation still running
    running_s: float | None
    longest_run: str | None  # the run it has been busy with the longest (`server.healing`)
    longest_run_s: float | None
    waiting_for: int | None  # a sequence number later requests wait behind (not arrived yet)
    buffers: int
    arrays: int  # arrays alive in its JAX (0 before JAX started there)
    executables: int
    plans: int
    held: Held
    busy_s: float
    unfinished: int  # computations issued, not known finished
    in_flight: int  # the bound on those
    temp_budget_bytes: int
    buffer_budget_bytes: int
    collective_error: str | None  # the first failed cross-host collective
    node: str | None = None  # the Ray node it runs on
    address: str | None = None  # that node's address
    peer_sends: PeerSends = field(default_factory=PeerSends)
    peer_bytes: tuple[tuple[str, int], ...] = ()  # (peer host, bytes of values sent to it)


@dataclass(frozen=True, slots=True)
class Answered:
    stats: HostStats


StatsAnswer = Answered | Lost
