"""Islands heal by themselves: a host's executor killed mid-run fails what depended on it,
typed and in bounded time, and the host is back without anyone asking (server/healing.py);
the values it held that have lineage are made again when read (server/remake.py).

A server shared with other modules (`servers.HEALING`: a health probe every second, and
`max_hold_s` of 4 s): islands a and b of two hosts each, not JAX groups, so only the killed
host's executor is replaced and its island peer keeps its values. The executor is killed by
its pid (as the admin sees it in `GET /v1/islands`). Each test leaves every host up, with no
run, frame or mailbox of its own left. "In bounded time" is each test's timeout: a run's
own timeout (`step_timeout_s`, 300 s) is longer, so a failure that waited for it fails the
test.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from holds import holding
from jax.sharding import PartitionSpec as P
from polling import admin_hosts, until
from servers import HEALING, LIMITED, shared_server

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
XDIST_GROUP = "healing"  # its server's tests together under pytest-xdist (tests/conftest.py)
XDIST_EARLY = True  # a long module: handed out first under pytest-xdist (tests/conftest.py)

server = shared_server(HEALING)
limited = shared_server(LIMITED)


def settled(address: str, token: str) -> bool:
    """Every host up, with no run, frame or mailbox left."""
    rows = admin_hosts(address, token).values()
    return all(r["status"] == "up" and (r["runs"], r["frames"], r["mailboxes"]) == (0, 0, 0) for r in rows)


@pytest.fixture(autouse=True)
def heals(server) -> Iterator[None]:
    """The shared server as the test found it: its hosts back and idle."""
    yield
    until(lambda: settled(*server), 120, "every host up and idle after the test")


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
        try:
            got = y.numpy()
        except isthmus.DataLoss:  # a call before it was running: known once the host is back
            pass
        except (isthmus.Unavailable, isthmus.RemoteError):  # its call was running
            pass
        else:  # its call was still queued: it sent nothing, and was made again from its lineage
            want = x0
            with np.errstate(over="ignore"):
                for _ in range(300):
                    want = want * np.float32(2.0) + np.float32(1.0)
            np.testing.assert_array_equal(got, want)
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


def test_calls_queued_when_their_island_restarts_are_made_again_when_read(server):
    """A chain of calls queued on its island when the island's executors are replaced: a
    call whose input went with them sends nothing and its outputs are lost too, so reading
    the chain's end makes it again from its lineage (the upload put again, the calls
    repeated). Before, such calls ran on the new executors without their inputs, and the
    end of the chain read as "not on this host" for good."""
    address, token = server
    with isthmus.connect(address, token=token, name="queued") as c:
        s = c.slice({"x": 4}, island="a")
        inc = c.jit(lambda v: v + 1.0, slice=s, in_specs=P("x"), out_specs=P("x"))
        v = c.put(np.zeros(16, np.float32), s, P("x"))
        for _ in range(2000):
            v = inc(v)
        c.buffers()  # what was queued has gone to the server
        restart = httpx.post(f"{address}/v1/islands/a/restart", headers={"Authorization": f"Bearer {token}"},
                             timeout=120)
        assert restart.status_code == 200, restart.text
        np.testing.assert_array_equal(v.numpy(), np.full(16, 2000, np.float32))


def spinning(c: isthmus.Client, s: isthmus.Slice) -> isthmus.Buffer:
    """A computation that never ends: a float32 count stops growing at 2**24. Its slice is
    one device, so one thread spins (a core of CI's two), not one per device of the host."""
    return c.jit(lambda v: jax.lax.while_loop(lambda u: u >= 0, lambda u: u + 1.0, v), slice=s)(np.float32(0))


def serving(c: isthmus.Client, s: isthmus.Slice, deadline_s: float) -> None:
    """A computation on `s` comes back right within the deadline (a try may fail, typed,
    with the executor that was replaced under it)."""
    x0 = np.arange(8, dtype=np.float32)
    f = c.jit(lambda v: v * 2.0, slice=s)

    def served() -> list[np.ndarray] | None:
        try:
            return [f(c.put(x0, s)).numpy()]
        except isthmus.IsthmusError:
            return None

    [got] = until(served, deadline_s, f"slice {s.id} serving")
    np.testing.assert_array_equal(got, x0 * 2.0)


def test_a_computation_that_never_ends_stops_with_its_executor_once_its_client_closes(server):
    """XLA cannot stop a computation it has started: one that never ends would hold its
    host for every client. Once its client is closed, the host gets a new executor and
    serves the others."""
    address, token = server
    greedy = isthmus.connect(address, token=token, name="spinning")
    s = greedy.slice({"x": 1}, island="a")
    host = s.hosts[0]
    out = spinning(greedy, s)
    before = until(lambda: (row := admin_hosts(address, token)[host])["running_s"] and row["running_s"] > 1
                   and row, 60, f"the computation running on {host}")
    greedy.close()
    del out
    with isthmus.connect(address, token=token, name="neighbour") as c:
        other = next(t for t in (c.slice({"x": 4}, island="a") for _ in range(2)) if host in t.hosts)
        serving(c, other, 120)
    assert admin_hosts(address, token)[host]["pid"] != before["pid"]


def test_a_host_replaced_under_a_computation_that_never_ends_keeps_another_client_s_values(limited):
    """The executor replaced under a computation that never ends still answers, so the
    values another client holds on its host are read off it first (server/keeping.py) and
    read back unchanged, even where their lineage is gone (`servers.LIMITED` keeps no
    released buffer for lineage, so nothing could compute them again)."""
    address, token = limited
    with isthmus.connect(address, token=token, name="bystander") as c:
        greedy = isthmus.connect(address, token=token, name="spinning")
        s = greedy.slice({"x": 1}, island="a")
        host = s.hosts[0]
        mine = next(t for t in (c.slice({"x": 4}, island="a") for _ in range(2)) if host in t.hosts)
        x0 = np.arange(32, dtype=np.float32).reshape(8, 4)
        x = c.put(x0, mine)
        sharded = c.jit(lambda a: jnp.sin(a) * 3.0, slice=mine, in_specs=P("x"), out_specs=P("x"))(x)
        replicated = c.jit(lambda a: a.sum(axis=0), slice=mine)(x)
        want = [jax.jit(lambda a: jnp.sin(a) * 3.0)(x0), jax.jit(lambda a: a.sum(axis=0))(x0)]
        del x  # its upload goes from lineage with it: no run could make the two again
        for got in (sharded, replicated):
            got.block_until_ready()  # computed (not fetched: the client would keep the value)
        out = spinning(greedy, s)
        before = until(lambda: (row := admin_hosts(address, token)[host])["running_s"]
                       and row["running_s"] > 1 and row, 60, f"the computation running on {host}")
        greedy.close()
        del out
        until(lambda: admin_hosts(address, token)[host]["pid"] != before["pid"], 120,
              f"host {host} with a new executor")
        for got, expected in zip([sharded, replicated], want, strict=True):
            np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)
        serving(c, mine, 60)
    until(lambda: settled(address, token), 120, "every host up and idle")


def test_a_call_running_when_its_executor_is_killed_is_made_again_when_read(server):
    """The call was in flight when its host died: sent to the host, behind a loop of the
    same client's that holds the host's dispatch thread (so it is there however fast the
    machine), it computed nothing that is kept, and its inputs have lineage, so reading its
    output repeats it (once: a second loss of it would be DataLoss, since what killed the
    host may have been the call itself)."""
    address, token = server
    with isthmus.connect(address, token=token, name="in-flight") as c:
        s = c.slice({"x": 1}, island="a")
        host = s.hosts[0]
        busy = next(t for t in (c.slice({"x": 1}, island="a") for _ in range(8)) if t.hosts == s.hosts)
        step = c.jit(lambda v: jnp.tanh(v @ v) + 1.0, slice=s)
        x0 = np.eye(128, dtype=np.float32) * 0.5
        x = c.put(x0, s)
        want = jax.jit(lambda v: jnp.tanh(v @ v) + 1.0)(x0)
        np.testing.assert_allclose(step(x).numpy(), np.asarray(want), rtol=1e-6)  # compiled
        before = admin_hosts(address, token)[host]
        holding(c, "a", busy)()
        out = step(x)
        until(lambda: admin_hosts(address, token)[host]["queued"] > 0, 60,
              f"the call sent to {host}, behind the loop")
        os.kill(before["pid"], signal.SIGKILL)
        np.testing.assert_allclose(out.numpy(), np.asarray(want), rtol=1e-6)  # not DataLoss
        assert admin_hosts(address, token)[host]["pid"] != before["pid"]


def test_a_host_waiting_for_a_killed_sender_fails_at_once_and_serves_on(server):
    """A program whose value crosses from island a to island b: while its sender computes,
    the receiving host waits for it on its dispatch thread. The sender's executor killed,
    the server tells the receiver as it replaces it: the wait ends with the cause, and the
    receiver takes other work at once (not after the run's 300 s timeout)."""
    address, token = server
    with isthmus.connect(address, token=token, name="healing-across") as c:
        src, dst = c.slice({"x": 1}, island="a"), c.slice({"x": 1}, island="b")
        sender, receiver = src.hosts[0], dst.hosts[0]
        spin = c.jit(lambda v, n: jax.lax.fori_loop(0, n, lambda i, w: jnp.tanh(w @ w), v), slice=src)
        inc = c.jit(lambda v: v + 1.0, slice=dst)

        @c.program
        def across(v, n):
            return inc(spin(v, n))

        x0 = np.eye(64, dtype=np.float32) * 0.5
        x = c.put(x0, src)
        expected = jax.jit(lambda v: jnp.tanh(v @ v) + 1.0)(x0)
        np.testing.assert_allclose(across(x, c.put(np.int32(1), src)).numpy(), expected, rtol=1e-6)

        out = across(x, c.put(np.int32(2**31 - 1), src))  # computes until its host is killed
        until(lambda: all(admin_hosts(address, token)[h]["running"] for h in (sender, receiver)), 60,
              "the program running on both hosts")
        os.kill(admin_hosts(address, token)[sender]["pid"], signal.SIGKILL)
        with pytest.raises(isthmus.RemoteError, match=f"(executors of {sender} are gone|host {sender} sends "
                                                       "nothing more)"):
            out.numpy()

        y0 = np.arange(4, dtype=np.float32)
        np.testing.assert_array_equal(inc(c.put(y0, dst)).numpy(), y0 + 1.0)


def across_islands(c):
    """Slices on islands a and b, a program adding 1 on a, b, then a again, and a's `+ 1`."""
    a, b = c.slice({"x": 1}, island="a"), c.slice({"y": 1}, island="b")
    inc, incb = c.jit(lambda v: v + 1, slice=a), c.jit(lambda v: v + 1, slice=b)
    return a, b, c.program(lambda v: inc(incb(inc(v)))), inc


def test_a_run_sent_to_a_dead_peer_fails_at_once_and_its_other_hosts_serve_on(server):
    """A program over islands a and b submitted while b's killed executor is replaced: its
    part for b never reaches a live executor, so a's part is told, and fails what it waits
    for from b at once rather than holding a's dispatch thread for the run's 300 s timeout;
    once b is back, the same program runs."""
    address, token = server
    with isthmus.connect(address, token=token, name="healing-unsent") as c:
        a, b, there_and_back, inc = across_islands(c)
        x0 = np.zeros(16, np.float32)
        x = c.put(x0, a)
        np.testing.assert_array_equal(there_and_back(x).numpy(), x0 + 3)
        before = admin_hosts(address, token)[b.hosts[0]]
        os.kill(before["pid"], signal.SIGKILL)
        until(lambda: (row := admin_hosts(address, token)[b.hosts[0]])["status"] != "up"
              or row["pid"] != before["pid"], 30, "the server noticing b's executor gone")
        out = there_and_back(x)  # (sent while b restarts, unless that was quicker than the poll)
        try:
            np.testing.assert_array_equal(out.numpy(), x0 + 3)  # b came back before it was sent
        except (isthmus.Unavailable, isthmus.RemoteError, isthmus.DataLoss):
            pass
        np.testing.assert_array_equal(inc(x).numpy(), x0 + 1)  # a serves on
        until(lambda: (row := admin_hosts(address, token)[b.hosts[0]])["status"] == "up"
              and row["pid"] != before["pid"], 60, "b's host back with a new executor")
        np.testing.assert_array_equal(there_and_back(x).numpy(), x0 + 3)


def test_a_loop_across_islands_ends_when_one_of_its_hosts_is_lost(server):
    """A loop whose predicate is computed on island a, its body crossing to island b: b's
    executor killed, a stops looping too (it would loop on, sending every iteration to b's
    new executor, which never took the run), the run fails naming the lost host, and no
    host keeps a run, frame or mailbox of it."""
    address, token = server
    with isthmus.connect(address, token=token, name="healing-loop") as c:
        a, b = c.slice({"x": 1}, island="a"), c.slice({"y": 1}, island="b")
        fa, fb = c.jit(lambda v: jnp.tanh(v), slice=a), c.jit(lambda v: v * 0.5, slice=b)
        lt, inc = c.jit(lambda i, n: i < n, slice=a), c.jit(lambda i: i + 1, slice=a)

        @c.program
        def loop(x, n):
            body = lambda s: (inc(s[0]), fa(fb(s[1])))  # noqa: E731
            return isthmus.while_loop(lambda s: lt(s[0], n), body, (np.int32(0), x))[1]

        out = loop(np.ones(4, np.float32), np.int32(2**30))
        until(lambda: admin_hosts(address, token)[b.hosts[0]]["frames"] > 0, 60, "the loop on b")
        before = admin_hosts(address, token)[b.hosts[0]]
        os.kill(before["pid"], signal.SIGKILL)
        with pytest.raises(isthmus.RemoteError, match=f"host {b.hosts[0]} was lost"):
            out.numpy()
        until(lambda: admin_hosts(address, token)[b.hosts[0]]["pid"] != before["pid"]
              and settled(address, token), 60, "b back, and no run, frame or mailbox left on any host")
        x0 = np.arange(4, dtype=np.float32)
        np.testing.assert_allclose(loop(x0, np.int32(3)).numpy(),
                                   np.tanh(np.tanh(np.tanh(x0 * 0.5) * 0.5) * 0.5), rtol=1e-6)


def test_both_islands_restarted_at_once_know_each_other_s_new_executors(server):
    """Islands a and b restarted at the same time: the first one back compiled the programs
    across both islands on the other island's hosts too, one of them being replaced; that
    compile failed, and the program was refused (Conflict) until the second island's own
    compile came. A program across both islands now runs at once afterwards."""
    address, token = server
    with isthmus.connect(address, token=token, name="healing-both") as c:
        a, _, there_and_back, _ = across_islands(c)
        x0 = np.zeros(16, np.float32)
        np.testing.assert_array_equal(there_and_back(c.put(x0, a)).numpy(), x0 + 3)

        def restart(island: str) -> int:
            return httpx.post(f"{address}/v1/islands/{island}/restart", timeout=240,
                              headers={"Authorization": f"Bearer {token}"}).status_code

        with ThreadPoolExecutor(2) as both:
            assert list(both.map(restart, ("a", "b"))) == [200, 200]
        # At once: not refused (Conflict) for a compile that failed on a host being replaced.
        np.testing.assert_array_equal(there_and_back(c.put(x0, a)).numpy(), x0 + 3)


@contextmanager
def sharing_a_host(server: tuple[str, str], mesh: dict[str, int], island: str, tries: int,
                   holding: dict[str, int] | None = None) -> Iterator[tuple]:
    """Two clients with a slice each on one host of the server (the holding one's of mesh
    `holding`, where given), whose runs may hold a host another client waits on for 4 s
    (`max_hold_s`): (address, token, the waiting client, its slice, the holding client, its
    slice, the host)."""
    address, token = server
    with isthmus.connect(address, token=token, name="waiting") as c, \
            isthmus.connect(address, token=token, name="holding") as greedy:
        s = greedy.slice(holding or mesh, island=island)
        host = s.hosts[0]
        mine = next(t for t in (c.slice(mesh, island=island) for _ in range(tries)) if host in t.hosts)
        yield address, token, c, mine, greedy, s, host


def test_a_computation_holding_a_shared_host_past_max_hold_s_is_stopped_for_the_waiting_client(server):
    """One client's computation that never ends holds a host another client's work waits
    on: past `max_hold_s` (here 4 s) its executor is replaced, the waiting call runs, the
    other client's values on the host are kept, and the stopped run is not repeated when
    its output is read. Before, the waiting client hung for up to `max_run_s` (3600 s),
    while its neighbour kept its own client open (an attack run's finding)."""
    with sharing_a_host(server, {"x": 4}, "a", 2, {"x": 1}) as (address, token, c, mine, greedy, s, host):
        x0 = np.arange(8, dtype=np.float32)
        x = c.put(x0, mine)
        tripled = c.jit(lambda v: v * 3.0, slice=mine)(x)
        tripled.block_until_ready()
        out = spinning(greedy, s)
        until(lambda: admin_hosts(address, token)[host]["running"], 60, f"the computation running on {host}")
        np.testing.assert_array_equal(c.jit(lambda v: v * 2.0, slice=mine)(x).numpy(), x0 * 2.0)
        with pytest.raises(isthmus.DataLoss, match="max_hold_s"):
            out.numpy()  # not run again: it would hold the host again
        np.testing.assert_array_equal(tripled.numpy(), x0 * 3.0)
        serving(greedy, s, 60)  # the other client is served too


def test_a_loop_holding_a_shared_host_past_max_hold_s_ends_and_its_executor_stays(server):
    """A program's in-graph loop can be ended at its next test: past `max_hold_s` with
    another client waiting for the host, it ends failed naming the rule, and the host's
    executor (every value on it) stays."""
    with sharing_a_host(server, {"x": 1}, "b", 4) as (address, token, c, mine, greedy, s, host):
        lt, inc = greedy.jit(lambda i, n: i < n, slice=s), greedy.jit(lambda i: i + 1, slice=s)

        @greedy.program
        def count(i, n):
            return isthmus.while_loop(lambda j: lt(j, n), inc, i)

        out = count(np.int32(0), np.int32(2**30))
        before = until(lambda: (row := admin_hosts(address, token)[host])["running"] and row, 60,
                       f"the loop running on {host}")
        x0 = np.arange(4, dtype=np.float32)
        np.testing.assert_array_equal(c.jit(lambda v: v * 2.0, slice=mine)(x0).numpy(), x0 * 2.0)
        with pytest.raises(isthmus.RemoteError, match="max_hold_s"):
            out.numpy()
        assert admin_hosts(address, token)[host]["pid"] == before["pid"]
        assert int(count(np.int32(5), np.int32(7)).numpy()) == 7
