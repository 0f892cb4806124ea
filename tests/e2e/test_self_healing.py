"""Islands heal by themselves: a host's executor killed mid-run fails what depended on it,
typed and in bounded time, and the host is back without anyone asking (server/healing.py);
the values it held that have lineage are made again when read (server/remake.py).

Its own server (the session's is shared): islands a and b of two hosts each, not JAX groups,
so only the killed host's executor is replaced and its island peer keeps its values. The
executor is killed by its pid (as the admin sees it in `GET /v1/islands`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from polling import admin_hosts, until
from servers import own_server

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, str]]:
    with own_server(tmp_path / "state", {"ISTHMUS_HEALTH_PROBE_S": "1"}) as server:
        yield server


def test_a_killed_executor_fails_its_work_typed_and_its_host_comes_back_by_itself(server):
    address, token = server
    with isthmus.connect(address, token=token, name="healing") as c:
        s, other = c.slice({"x": 4}, island="b"), c.slice({"x": 4}, island="b")
        assert s.hosts != other.hosts  # one host each: the least loaded first
        host = s.hosts[0]
        f = c.jit(lambda v: v * 2.0 + 1.0, slice=s)
        g = c.jit(lambda v: v * 3.0, slice=other)
        x0 = np.arange(8, dtype=np.float32)
        x, kept = c.put(x0, s), c.put(x0 + 100, other)
        fx = f(x)
        np.testing.assert_array_equal(fx.numpy(), x0 * 2.0 + 1.0)
        mid = f(fx)
        top = f(mid)
        np.testing.assert_array_equal(top.numpy(), ((x0 * 2.0 + 1.0) * 2.0 + 1.0) * 2.0 + 1.0)
        del mid  # released: top's lineage keeps what made it

        before = admin_hosts(address, token)[host]
        y = x
        for _ in range(300):  # queued and running when the executor dies
            y = f(y)
        os.kill(before["pid"], signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises((isthmus.Unavailable, isthmus.RemoteError)):
            y.numpy()
        assert time.monotonic() - killed < 10
        # The values that were computed there come back, made again from their lineage when
        # read: the upload put again, the runs repeated (the released one under another id).
        np.testing.assert_array_equal(top.numpy(), ((x0 * 2.0 + 1.0) * 2.0 + 1.0) * 2.0 + 1.0)
        np.testing.assert_array_equal(g(fx).numpy(), (x0 * 2.0 + 1.0) * 3.0)  # read on another host
        np.testing.assert_array_equal(x.numpy(), x0)

        # No manual step: the host has a new executor, and the next call there succeeds.
        def back() -> dict | None:
            row = admin_hosts(address, token)[host]
            return row if row["status"] == "up" and row["pid"] != before["pid"] else None

        row = until(back, 60, f"host {host} back with a new executor")
        assert row["pid"] != before["pid"]
        np.testing.assert_array_equal(f(c.put(x0, s)).numpy(), x0 * 2.0 + 1.0)
        np.testing.assert_array_equal(kept.numpy(), x0 + 100)  # the island's other host kept its values
