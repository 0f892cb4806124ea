"""Per-island gang scheduling: which submission is admitted, and when.

Pure: imports the standard library and `ir` only; no Ray, no JAX, no asyncio, no threads.
It takes plain ids and returns plain plans, so it is tested without either. Other packages
import only from this module.

- `submission`: `Submission` (id, client, the island's hosts it runs on, cost).
- `policy`: the `Policy` protocol, `FifoPolicy` (submission order) and `ProportionalShare`
  (stride scheduling: backlogged clients get admitted cost in proportion to their weights;
  an idle client banks no credit).
- `gang`: `GangScheduler`, one per island: `submit` queues, `admit` returns the submissions
  admitted now, in admission order, while fewer than `window` are in flight, `done` frees a
  slot, `cancel_client` drops a closed client's queued work. A client's own submissions are
  always admitted in the order it made them.
- `window`: `Durations`, what each kind of submission is expected to take (the window's
  bound in seconds), from the times the caller passes in.
- `parking`: `Parking`, which buffers the islands' queued, parked and admitted work
  touches: whether a submission reading another island's pending buffer must park outside
  its queue, and which actions waiting for buffers to be free are due.

The scheduler numbers nothing. The one source of the global order is the executor pool's
per-host sequence numbers: the server, on its one event loop, numbers each admitted
submission's host messages at once, as `admit` returns it, all hosts of a message in one
step under the pool's lock. Every host's sequence is therefore a restriction of one global
order, so any two hosts take any two computations they share in the same relative order
and no two hosts can wait on each other's collectives in a cycle. Not thread-safe: the
caller serialises calls.
"""

from scheduler.gang import GangScheduler
from scheduler.parking import Parking
from scheduler.policy import FifoPolicy, Policy, ProportionalShare
from scheduler.submission import Submission
from scheduler.window import Durations

__all__ = [
    "Durations",
    "FifoPolicy",
    "GangScheduler",
    "Parking",
    "Policy",
    "ProportionalShare",
    "Submission",
]
