"""What the hosts hold once the runs in flight have settled (for tests that count state)."""

import time


def host_rows(c) -> dict:
    """Every host's row of `GET /v1/islands`, once no island has a run in flight (each host
    has reported its part done: the condition itself, polled, within a bound)."""
    deadline = time.monotonic() + 60
    while True:
        islands = c.raw_json("GET", "/v1/islands")
        if all(isl["in_flight"] == 0 for isl in islands) or time.monotonic() > deadline:
            return {h["name"]: h for isl in islands for h in isl["hosts"]}
