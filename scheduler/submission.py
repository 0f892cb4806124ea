"""What the gang scheduler orders: submissions in, admitted submissions with positions out.

Contract: `Submission` and `Admitted` are frozen and valid by construction. The island
order (positions) is the one source of truth for dispatch: `host_orders` derives each
host's sequence from it by restriction, so every host sees any two computations in the
same relative order and no two hosts can wait on each other in a cycle.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from ir.errors import InvalidArgument
from ir.node import check_hosts


@dataclass(frozen=True)
class Submission:
    """One unit of gang-scheduled work on one island, e.g. one program run.

    `hosts` are the island's hosts it runs on; `cost` is its weight in proportional share
    (e.g. the number of computations in the run). The window counts submissions, not cost.
    """

    id: str
    client: str
    hosts: tuple[str, ...]
    cost: float = 1.0

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


@dataclass(frozen=True)
class Admitted:
    """A submission admitted to run, at `position` in its island's order."""

    submission: Submission
    position: int

    def __post_init__(self) -> None:
        if not isinstance(self.submission, Submission):
            raise InvalidArgument(f"admitted: expected a Submission, got {self.submission!r}")
        p = self.position
        if not isinstance(p, int) or isinstance(p, bool) or p < 0:
            raise InvalidArgument(
                f"admitted {self.submission.id!r}: position: expected an int >= 0, got {p!r}"
            )


def host_orders(admitted: Sequence[Admitted]) -> dict[str, list[str]]:
    """Each host's sequence of submission ids: the island order restricted to that host.

    Hosts appear in the order they are first touched. Repeated positions or ids are an
    error: they would let two hosts disagree on an order.
    """
    by_position = sorted(admitted, key=lambda a: a.position)
    for prev, cur in pairwise(by_position):
        if prev.position == cur.position:
            raise InvalidArgument(
                f"host_orders: position {cur.position} is held by both "
                f"{prev.submission.id!r} and {cur.submission.id!r}"
            )
    seen: set[str] = set()
    orders: dict[str, list[str]] = {}
    for a in by_position:
        sub = a.submission
        if sub.id in seen:
            raise InvalidArgument(f"host_orders: submission {sub.id!r} appears more than once")
        seen.add(sub.id)
        for host in sub.hosts:
            orders.setdefault(host, []).append(sub.id)
    return orders
