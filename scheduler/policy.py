"""Ordering policies of the gang scheduler: how far an admission advances a client's clock.

Contract: a policy is a frozen value holding only configuration; the per-island state
(each client's virtual time) lives in `GangScheduler`, so one policy may serve many
islands. The scheduler always admits the head of the backlogged client with the least
virtual time, ties by submission order, and then advances that client's virtual time by
`policy.stride(submission)` (finite, >= 0).

- `FifoPolicy`: every stride is 0, so all clocks stay equal and the tie-break decides:
  the island admits in submission order.
- `ProportionalShare`: the stride is `cost / weight(client)` (stride scheduling, as in
  Pathways' proportional-share gang scheduler): backlogged clients get admitted cost in
  proportion to their weights.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from ir.errors import InvalidArgument
from scheduler.submission import Submission


@runtime_checkable
class Policy(Protocol):
    def stride(self, submission: Submission) -> float:
        """How far admitting `submission` advances its client's virtual time (>= 0)."""
        ...


@dataclass(frozen=True)
class FifoPolicy:
    """First come, first admitted, across all clients of the island."""

    def stride(self, submission: Submission) -> float:
        return 0.0


def _check_weight(what: str, value: object) -> float:
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise InvalidArgument(f"ProportionalShare: {what}: expected a finite number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class ProportionalShare:
    """Admitted cost in proportion to client weight; clients not named get `default_weight`."""

    weights: Mapping[str, float] = field(default_factory=dict, hash=False)
    default_weight: float = 1.0

    def __post_init__(self) -> None:
        if not isinstance(self.weights, Mapping):
            raise InvalidArgument(
                f"ProportionalShare: weights: expected a mapping of client to weight, "
                f"got {self.weights!r}"
            )
        checked: dict[str, float] = {}
        for client, w in self.weights.items():
            if not isinstance(client, str) or not client:
                raise InvalidArgument(
                    f"ProportionalShare: weights: expected non-empty client names, got {client!r}"
                )
            checked[client] = _check_weight(f"weight of client {client!r}", w)
        object.__setattr__(self, "weights", MappingProxyType(checked))
        object.__setattr__(self, "default_weight", _check_weight("default_weight", self.default_weight))

    def weight(self, client: str) -> float:
        return self.weights.get(client, self.default_weight)

    def stride(self, submission: Submission) -> float:
        return submission.cost / self.weight(submission.client)
