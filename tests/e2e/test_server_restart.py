"""A server killed with SIGKILL and started again carries on (server/recovery.py), and its
clients wait it out (client/retry.py, client/sender.py).

One server start-up for both: a client's secret and handles still work after the restart,
its buffers read back unchanged from the executors the new server took over, its
registered program runs, and what was in flight when the server died fails typed (a loop
it was running ends: the host serves the new server). Meanwhile another client, busy in a
thread on the other island (uploads, calls, a program and reads in a loop), sees no error
at all: its requests wait for the new server, a batch
whose answer was lost is sent again as far as the server did not take it, and every value
it reads equals `jax.jit`'s here. Its `restart_grace_s` is 180 s, not the default 30: how
long this machine takes to start a server again (10-25 s idle, more under load) is not
what is tested.

Its own server, on a fixed port (the clients keep its address), stopped with everything it
started by pid: the server, then the Ray daemon recorded in its state dir.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from polling import admin_hosts, until
from servers import kill_daemon

import client as isthmus
import client.connection as client_connection
from bench.soak import free_port
from client.embedded import EmbeddedServer

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]
XDIST_EARLY = True  # a long module: handed out first under pytest-xdist (tests/conftest.py)


def bump(v):
    return jnp.sin(v) * 2.0 + 1.0


def steady(read: Callable[[], int], polls: int = 5) -> Callable[[], int | None]:
    """A condition for `until`: what `read` gives, once it has given it `polls` times in a row."""
    seen: list[int] = []

    def check() -> int | None:
        seen.append(read())
        return seen[-1] if len(seen) >= polls and len(set(seen[-polls:])) == 1 else None

    return check


class Busy:
    """A client in a thread: each round uploads an array, calls a function on it, runs a
    program on the result, reads both and a call on a buffer made before the restart, and
    checks each value against `jax.jit` here. It stops at its first error (kept) or when
    told to."""

    def __init__(self, c: isthmus.Client) -> None:
        self.c = c
        self.rounds = 0
        self.errors: list[BaseException] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="busy-client", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        c = self.c
        try:
            s = c.slice({"x": 1}, island="b")
            f = c.jit(bump, slice=s)
            twice = c.program(lambda v: f(f(v)))
            base = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
            kept = c.put(base, s)  # read (through a call) every round, across the restart
            local_f = jax.jit(bump)
            while not self.stop.is_set():
                a = np.arange(8, dtype=np.float32) + np.float32(self.rounds)
                y = f(c.put(a, s))
                z = twice(y)
                want_y = np.asarray(local_f(a))
                np.testing.assert_array_equal(y.numpy(), want_y)
                np.testing.assert_array_equal(z.numpy(), np.asarray(local_f(local_f(want_y))))
                np.testing.assert_array_equal(f(kept).numpy(), np.asarray(local_f(base)))
                self.rounds += 1
        except BaseException as e:
            self.errors.append(e)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(60)
        assert not self.thread.is_alive(), "the busy client did not end its round"


def test_a_server_killed_and_started_again_carries_on_and_a_busy_client_waits_it_out(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(client_connection, "JITTED_KEPT", 0)  # a function dropped is let go of
    state, port = tmp_path / "state", free_port()
    servers: list[EmbeddedServer] = []
    busy: Busy | None = None
    try:
        servers.append(EmbeddedServer.start(state, port=port))
        token = (state / "token").read_text().strip()
        with isthmus.connect(servers[0].address, token=token, name="survivor") as c, \
                isthmus.connect(servers[0].address, token=token, name="busy", restart_grace_s=180) as b:
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
            assert g.registrations == f.registrations
            z = x
            for _ in range(300):  # queued and running when the server dies
                z = f(z)
            spin = c.program(lambda v: isthmus.fori_loop(0, 2**31 - 1, lambda i, u: f(u), v))
            spinning = spin(x)  # looping on the host when the server dies: stopped by the new one
            c.flush()  # sent: the server has them when it dies
            until(lambda: "run p-" in str(admin_hosts(servers[0].address, token)[s.hosts[0]]["running"]),
                  60, "the loop running")
            busy = Busy(b)
            until(lambda: busy.rounds >= 3 or busy.errors, 120, "the busy client's first rounds")
            assert not busy.errors, busy.errors
            # (measured as late as can be, once the server has freed what the chain's calls
            # released: it does as their runs settle, which its bookkeeping learns a little after
            # the host ran them, and later under load; the busy client is on the other island)
            held = until(steady(lambda: admin_hosts(servers[0].address, token)[s.hosts[0]]["buffer_bytes"]),
                         60, "the host's buffer bytes settled")
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
            # What the client asks of a batch whose answer was lost (`client.sender`): which of its
            # ids the server has no buffer of, and which it lost unfinished at the restart.
            stranger = f"{c.id}.{'0' * 32}"
            fates = c.raw_json("POST", "/v1/batch", json={"ops": [], "known": [x.id, spinning.id, stranger]})
            assert (fates["unknown"], fates["unfinished"]) == ([stranger], [spinning.id])
            with pytest.raises(isthmus.DataLoss, match="before the computation producing it had finished"):
                spinning.numpy()
            del g  # lets go of its registration: f's computation, still held once, stays
            gc.collect()
            other.flush()
            np.testing.assert_array_equal(f(y).numpy(), (x0 * 2.0 + 1.0) * 2.0 + 1.0)
            np.testing.assert_array_equal(step(x).numpy(), (x0 * 2.0 + 1.0) * 2.0 + 1.0)
            w = c.put(x0 + 1, s)
            np.testing.assert_array_equal(f(w).numpy(), (x0 + 1) * 2.0 + 1.0)
            # The busy client carried on through the restart, and goes on after it.
            after = busy.rounds
            until(lambda: busy.rounds >= after + 3 or busy.errors, 120, "the busy client's rounds after")
            busy.finish()
            assert not busy.errors, busy.errors
        print(f"first successful call with old handles {restart_s:.1f}s after the restart began; "
              f"the busy client did {busy.rounds} rounds")
    finally:
        if busy is not None:
            busy.stop.set()
        for srv in servers:
            srv.stop()
        kill_daemon(state)
