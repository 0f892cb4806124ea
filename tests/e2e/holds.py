"""Holding a host still, so the gang scheduler's counts (`GET /v1/islands`: what is queued,
and what each client has had admitted) can be read at one moment, whatever the machine's
speed: a program that loops until its client is closed is admitted and never ends. Past
two submissions in flight on a host, nothing more is admitted there while those in flight
are expected to take `gang_window_s` (a loop's kind, never seen to end, is expected to take
all of it); with one submission in flight per island, nothing more is admitted on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import numpy as np

import client as isthmus


def holding(c: isthmus.Client, island: str, s: isthmus.Slice | None = None) -> Callable[[], Any]:
    """A program that loops until its client is closed (2**30 steps: far past any test), on
    `s` or on a new slice of one device on the island; calling it submits one run."""
    s = s or c.slice({"x": 1}, island=island)
    below = c.jit(lambda i, n: i < n, slice=s)
    step = c.jit(lambda i: i + 1, slice=s)
    hold = c.program(lambda i, n: isthmus.while_loop(lambda j: below(j, n), step, i))
    return lambda: hold(np.int32(0), np.int32(2**30))


def island_row(address: str, token: str, name: str) -> dict[str, Any]:
    """The island's row of `GET /v1/islands` as the admin sees it (every client's counts)."""
    islands = httpx.get(f"{address}/v1/islands", headers={"Authorization": f"Bearer {token}"},
                        timeout=30).raise_for_status().json()
    return next(i for i in islands if i["name"] == name)
