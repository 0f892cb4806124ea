"""Per-island gang scheduling: one island-wide order for every computation.

Pure: imports the standard library and `ir` only; no Ray, no JAX, no asyncio, no threads.
It takes plain ids and returns plain plans, so it is tested without either. Other packages
import only from this module.

- `submission`: `Submission` (id, client, the island's hosts it runs on, cost), `Admitted`
  (a submission and its island-wide `position`), and `host_orders`, which derives each
  host's sequence from the island order by restriction: the island order is the one source
  of truth, so no two hosts ever see two computations in different relative orders.
- `policy`: the `Policy` protocol, `FifoPolicy` (submission order) and `ProportionalShare`
  (stride scheduling: backlogged clients get admitted cost in proportion to their weights;
  an idle client banks no credit).
- `gang`: `GangScheduler`, one per island: `submit` queues, `admit` hands out positions
  0, 1, 2, ... while fewer than `window` submissions are in flight, `done` frees a slot,
  `cancel_client` drops a closed client's queued work. A client's own submissions are
  always admitted in the order it made them. Not thread-safe: the server calls it from its
  one event loop and numbers each admitted submission's host messages as it admits it, in
  position order.
"""

from scheduler.gang import GangScheduler
from scheduler.policy import FifoPolicy, Policy, ProportionalShare
from scheduler.submission import Admitted, Submission, host_orders

__all__ = [
    "Admitted",
    "FifoPolicy",
    "GangScheduler",
    "Policy",
    "ProportionalShare",
    "Submission",
    "host_orders",
]
