"""A server killed with SIGKILL and started again carries on (server/recovery.py): the
client's secret and handles still work, its buffers read back unchanged from the executors
the new server took over, its registered program runs, and what was in flight when the
server died fails typed (a loop it was running ends: the host serves the new server).

Its own server, on a fixed port (the client keeps its address), stopped with everything it
started by pid: the server, then the Ray daemon recorded in its state dir.
"""

from __future__ import annotations

import gc
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
from polling import admin_hosts, until
from servers import kill_daemon

import client as isthmus
import client.connection as client_connection
from bench.soak import free_port
from client.embedded import EmbeddedServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def test_a_server_killed_and_started_again_carries_on_with_the_clients_handles(tmp_path: Path,
                                                                              monkeypatch) -> None:
    monkeypatch.setattr(client_connection, "JITTED_KEPT", 0)  # a function dropped is let go of
    state, port = tmp_path / "state", free_port()
    servers: list[EmbeddedServer] = []
    try:
        servers.append(EmbeddedServer.start(state, port=port))
        token = (state / "token").read_text().strip()
        with isthmus.connect(servers[0].address, token=token, name="survivor") as c:
            s = c.slice({"x": 2}, island="a")
            f = c.jit(lambda v: v * 2.0 + 1.0, slice=s)
            x0 = np.arange(8, dtype=np.float32)
            x = c.put(x0, s)
            y = f(x)
            np.testing.assert_array_equal(y.numpy(), x0 * 2.0 + 1.0)

            @c.program
            def step(v):
                return f(f(v))

            np.testing.assert_array_equal(step(x).numpy(), (x0 * 2.0 + 1.0) * 2.0 + 1.0)
            # A second session on the same secret registers the same function: the server
            # answers with f's computation, held twice.
            other = isthmus.connect(servers[0].address, secret=c.secret)
            g = other.jit(f.fn, slice=s)
            np.testing.assert_array_equal(g(other.put(x0, s)).numpy(), x0 * 2.0 + 1.0)
            assert g._registered.values() == f._registered.values()
            z = x
            for _ in range(300):  # queued and running when the server dies
                z = f(z)
            spin = c.program(lambda v: isthmus.fori_loop(0, 2**31 - 1, lambda i, u: f(u), v))
            spinning = spin(x)  # looping on the host when the server dies: stopped by the new one
            c.flush()  # sent: the server has them when it dies
            until(lambda: "run p-" in str(admin_hosts(servers[0].address, token)[s.hosts[0]]["running"]),
                  60, "the loop running")
            held = admin_hosts(servers[0].address, token)[s.hosts[0]]["buffer_bytes"]
            os.kill(servers[0].pid, signal.SIGKILL)
            servers[0].process.wait(30)

            started = time.monotonic()
            servers.append(EmbeddedServer.start(state, port=port))
            # The same client, secret and handles: the buffers read back unchanged.
            np.testing.assert_array_equal(x.numpy(), x0)
            np.testing.assert_array_equal(y.numpy(), x0 * 2.0 + 1.0)
            restart_s = time.monotonic() - started
            # Its buffers count on the host's memory again, those lost with the restart too.
            assert held > 0 and admin_hosts(servers[1].address, token)[s.hosts[0]]["buffer_bytes"] == held
            want = x0
            for _ in range(300):
                want = want * np.float32(2.0) + np.float32(1.0)
            try:  # in flight when the server died: failed, typed; or settled before it died
                np.testing.assert_array_equal(z.numpy(), want)
            except isthmus.IsthmusError:
                pass
            with pytest.raises(isthmus.DataLoss, match="before the computation producing it had finished"):
                spinning.numpy()
            del g  # lets go of its registration: f's computation, still held once, stays
            gc.collect()
            other.flush()
            np.testing.assert_array_equal(f(y).numpy(), (x0 * 2.0 + 1.0) * 2.0 + 1.0)
            np.testing.assert_array_equal(step(x).numpy(), (x0 * 2.0 + 1.0) * 2.0 + 1.0)
            w = c.put(x0 + 1, s)
            np.testing.assert_array_equal(f(w).numpy(), (x0 + 1) * 2.0 + 1.0)
        print(f"first successful call with old handles {restart_s:.1f}s after the restart began")
    finally:
        for srv in servers:
            srv.stop()
        kill_daemon(state)
