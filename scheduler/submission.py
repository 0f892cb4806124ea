"""What the gang scheduler admits: one `Submission` per unit of work.

Contract: `Submission` is frozen and valid by construction. It carries what admission needs
(its id, its client, the island's hosts it runs on, its cost) and no place in any order:
the order of dispatch is the executor pool's per-host sequence numbers, which the server
assigns as it admits (see `scheduler`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ir.errors import InvalidArgument
from ir.node import check_hosts


@dataclass(frozen=True)
class Submission:
    """One unit of gang-scheduled work on one island, e.g. one program run.

    `hosts` are the island's hosts it runs on; `cost` is its weight in proportional share
    (e.g. the number of computations in the run). The window counts submissions, not cost;
    `seconds`, how long it is expected to keep its hosts busy, bounds the window in time.
    """

    id: str
    client: str
    hosts: tuple[str, ...]
    cost: float = 1.0
    seconds: float = 0.0

    def __post_init__(self) -> None:
        for field in ("id", "client"):
            value = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise InvalidArgument(
                    f"submission {self.id!r}: {field}: expected a non-empty string, got {value!r}"
                )
        check_hosts(self.hosts, f"submission {self.id!r}: hosts")
        cost = self.cost
        if (
            not isinstance(cost, int | float)
            or isinstance(cost, bool)
            or not math.isfinite(cost)
            or cost <= 0
        ):
            raise InvalidArgument(
                f"submission {self.id!r}: cost: expected a finite number > 0, got {cost!r}"
            )
        seconds = self.seconds
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not 0 <= seconds < math.inf:
            raise InvalidArgument(
                f"submission {self.id!r}: seconds: expected a finite number >= 0, got {seconds!r}"
            )

