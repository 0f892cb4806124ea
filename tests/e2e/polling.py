"""Waiting, bounded, for what takes its own time (a lease, a host coming back), and the
admin's view of the hosts."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx


def until(condition: Callable[[], object], deadline_s: float, what: str, every: float = 0.05) -> object:
    """The first truthy value of `condition()`, polled until the deadline (then an error
    naming `what`)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if value := condition():
            return value
        time.sleep(every)
    raise AssertionError(f"not within {deadline_s:g}s: {what}")


def admin_hosts(address: str, token: str) -> dict[str, dict]:
    """Every host's row of GET /v1/islands as the admin sees it (node, address, pid)."""
    islands = httpx.get(f"{address}/v1/islands", headers={"Authorization": f"Bearer {token}"},
                        timeout=30).raise_for_status().json()
    return {h["name"]: h for i in islands for h in i["hosts"]}
