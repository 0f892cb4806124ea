import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from holds import holding, island_row
from polling import until

import client as isthmus
import client.connection as client_connection

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_devices_on_the_embedded_default(c):
    table = c.devices()
    assert table.summary() == "2 islands, 4 hosts, 16 CPU devices"
    assert [i["name"] for i in table.islands] == ["a", "b"]
    assert sorted(d["id"] for d in table.devices) == list(range(16))
    assert {d["status"] for d in table.devices} == {"up"}
    assert all(len(h["devices"]) == 4 for h in table.hosts)
    assert "a0" in str(table)


def test_load_follows_slices(c):
    before = {d["id"]: d["load"] for d in c.devices().devices}
    s = c.slice({"x": 4}, island="b")
    after = {d["id"]: d["load"] for d in c.devices().devices}
    assert all(after[d] == before[d] + 1 for d in s.device_ids)
    s.delete()
    assert {d["id"]: d["load"] for d in c.devices().devices} == before


def test_two_clients_see_only_their_own_buffers_and_slices(connect):
    alice, bob = connect("alice"), connect("bob")
    sa = alice.slice({"x": 2})
    xa = alice.put(np.arange(4, dtype=np.float32), sa)
    f = alice.jit(lambda a: a + 1, slice=sa)
    ya = f(xa)
    sb = bob.slice({"x": 2})
    assert [s["id"] for s in bob.raw_json("GET", "/v1/slices")] == [sb.id]
    assert bob.buffers() == []
    for path in (f"/v1/buffers/{xa.id}", f"/v1/buffers/{xa.id}/data", f"/v1/slices/{sa.id}"):
        with pytest.raises(isthmus.NotFound):
            bob.raw_json("GET", path)
    with pytest.raises(isthmus.NotFound, match="does not exist"):
        bob.raw_json("POST", "/v1/calls", json={"computation_id": f.registrations[0], "inputs": []})
    with pytest.raises(isthmus.NotFound):
        bob.raw_request("DELETE", f"/v1/buffers/{xa.id}")
    # Releasing ids it does not own is a no-op for bob (a bulk release skips unknown ids).
    bob.raw_request("POST", "/v1/buffers/delete", json={"ids": [xa.id]})
    assert xa.id in {b["id"] for b in alice.buffers()}
    np.testing.assert_array_equal(ya.numpy(), np.arange(4) + 1)  # untouched by bob's attempts


def test_what_a_client_cannot_use_says_why(connect):
    a, b = connect("a"), connect("b")
    sa, sb = a.slice({"x": 1}), b.slice({"x": 1})
    xa = a.put(np.ones(4, np.float32), sa)
    fb = b.jit(lambda v: v + 1, slice=sb)
    for use in (fb, b.program(lambda v: fb(v))):
        with pytest.raises(isthmus.InvalidArgument, match=f"buffer {xa.id} .*is another client's"):
            use(xa)
    np.testing.assert_array_equal(fb(xa.numpy()).numpy(), np.full(4, 2.0))  # as the error says
    doomed = a.slice({"x": 1})
    y = a.put(np.ones(4, np.float32), doomed)
    on_doomed = a.jit(lambda v: v * 2, slice=doomed)
    on_doomed(y).result()
    doomed.delete()
    with pytest.raises(isthmus.NotFound, match=f"its slice {doomed.id} was deleted, and its computations"):
        on_doomed(np.ones(4, np.float32))  # not "computation c-... does not exist"
    with pytest.raises(isthmus.NotFound, match=f"{y.id}' was freed with its slice {doomed.id}"):
        y.numpy()
    fa = a.jit(lambda v: v + 1, slice=sa)
    with pytest.raises(isthmus.NotFound, match=f"buffer freed with its slice {doomed.id}, deleted"):
        a.program(lambda v: fa(v))(y)  # not "a slice this client did not create"
    assert y.is_deleted()
    z, fetched = a.put(np.ones(2), sa), a.put(np.ones(3), sa)
    fetched.numpy()  # its value is held in the client too: refused all the same once closed
    a.close()
    for use in (z.numpy, fetched.numpy, lambda: a.slice({"x": 1}), lambda: a.put(np.ones(2), sa)):
        with pytest.raises(isthmus.Unauthorized, match="this client is closed"):
            use()


SCRIPT = """
import sys
import numpy as np
import client as isthmus
address, credential, opened = sys.argv[1:]
c = isthmus.connect(address, **({"token": credential, "close_at_exit": opened == "token"}
                                 if opened.startswith("token") else {"secret": credential}))
x = c.put(np.arange(4, dtype=np.float32), c.slice({"x": 1}))
print(c.id, flush=True)
"""  # and exits without close()


def _script(*args: str) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=120,
                          env=os.environ | {"JAX_PLATFORMS": "cpu"})
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_script_that_exits_without_closing_closes_the_session_it_opened(server, c):
    """A session the process opened with the token is closed when it exits, as a file is;
    one it attached to by its secret is its opener's, and stays open."""
    token = (Path(server.state_dir) / "token").read_text().strip()
    admin = {"Authorization": f"Bearer {token}"}

    def open_ids() -> set[str]:
        return {k["id"] for k in httpx.get(f"{server.address}/v1/clients", headers=admin).json()}

    opened = _script(server.address, token, "token")
    assert opened not in open_ids()  # closed as it exited, not a lease later
    handed_on = _script(server.address, token, "token, kept open for others")  # close_at_exit=False
    assert handed_on in open_ids()
    httpx.delete(f"{server.address}/v1/clients/{handed_on}", headers=admin).raise_for_status()
    s = c.slice({"x": 1})
    assert _script(server.address, c.secret, "secret") == c.id
    assert c.id in open_ids()
    np.testing.assert_array_equal(c.put(np.ones(2, np.float32), s).numpy(), np.ones(2))


def test_requests_without_the_token_are_refused(server):
    r = httpx.get(f"{server.address}/v1/devices")
    assert r.status_code == 401 and "missing credential" in r.json()["detail"]
    r = httpx.get(f"{server.address}/v1/devices", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401


def test_uploads_while_an_island_restarts_land_on_its_new_executors(c):
    s = c.slice({"x": 4}, island="b")
    f = c.jit(lambda a: a - 1, slice=s)
    f(c.put(np.zeros(4, np.float32), s)).result()  # compiled
    restarted = threading.Event()

    def restart() -> None:
        try:
            c.restart_island("b")
        finally:
            restarted.set()

    threading.Thread(target=restart, daemon=True).start()
    sent = []
    while not restarted.is_set() or not sent:  # uploads before, during and after the restart
        x0 = np.full(4, len(sent), np.float32)
        x = c.put(x0, s)
        if len(sent) % 3 == 0:  # a read at once waits for the put queued behind the restart
            np.testing.assert_array_equal(x.numpy(), x0)
        sent.append((x, x0))
    for x, x0 in sent:
        np.testing.assert_array_equal(x.numpy(), x0)
        np.testing.assert_array_equal(f(x).numpy(), x0 - 1)


def test_an_island_restarted_on_request_makes_its_values_again_and_computes_again(c):
    # Island b is two hosts that are not one JAX group here: each gets a new executor.
    s = c.slice({"x": 4}, island="b")
    f = c.jit(lambda a: a * 2 + 1, slice=s)
    x0 = np.arange(8, dtype=np.float32)
    x = c.put(x0, s)
    y = f(x)
    y.result()
    assert c.restart_island("b") == 2  # x and y, lost; made again from their lineage when read
    np.testing.assert_array_equal(y.numpy(), x0 * 2 + 1)
    np.testing.assert_array_equal(f(c.put(x0, s)).numpy(), x0 * 2 + 1)  # compiled again there
    assert {h["status"] for i in c.devices().islands for h in i["hosts"]} == {"up"}


def test_values_made_by_functions_since_dropped_are_made_again_after_a_restart(c, monkeypatch):
    # A function jitted anew in a loop and let go of (past the newest 256 the client keeps;
    # none here): the server forgets its computation, but the values it made keep what
    # lineage needs to make them again.
    monkeypatch.setattr(client_connection, "JITTED_KEPT", 0)
    s = c.slice({"x": 4}, island="b")
    x0 = np.arange(8, dtype=np.float32)
    y = c.put(x0, s)
    for k in range(3):
        y = c.jit(lambda a, k=k: a * 2 + k, slice=s)(y)

    def twice(g):
        return c.program(lambda v: g(g(v)))

    z = twice(c.jit(lambda a: a - 1, slice=s))(y)
    gc.collect()  # the functions and the program are let go of, forgotten with the next request
    z.result()
    assert c.raw_json("GET", "/v1/programs") == []  # (after what is queued)
    assert c.raw_json("GET", "/v1/computations") == []
    want_y = ((x0 * 2 + 0) * 2 + 1) * 2 + 2
    assert c.restart_island("b") >= 2  # y and z, lost
    np.testing.assert_array_equal(z.numpy(), want_y - 2)
    np.testing.assert_array_equal(y.numpy(), want_y)
    assert c.restart_island("b") >= 2  # again: what made them the first time is still known
    np.testing.assert_array_equal(y.numpy(), want_y)
    np.testing.assert_array_equal(z.numpy(), want_y - 2)


def test_another_client_s_backlog_of_long_calls_holds_few_places_ahead_of_a_call(server, connect):
    """Past two at once, a host admits no more than `gang_window_s` (0.5 s) of work as each
    kind took last, not its whole window of 256 submissions; and a client's backlog of long
    calls then holds few places ahead of another client's call on the same host.

    Read from the scheduler's counts with the host held still (tests/e2e/holds.py): behind
    two loops of a third client, none of greedy's 30 calls is admitted (with the window
    alone, all 30 would be). Once those loops end, the other client's call is followed by
    two loops of its own, which hold the host again once admitted: from the first one's
    admission on, greedy has had only a few of its calls admitted (the policy takes turns,
    and takes at most one more of greedy's before the second loop), not all 30."""
    import jax
    import jax.numpy as jnp

    address = server.address
    token = (Path(server.state_dir) / "token").read_text().strip()
    greedy, other, blocker = connect("greedy"), connect("other"), connect("blocker")
    s = greedy.slice({"x": 1}, island="b")
    host = s.hosts[0]

    def on_host(c: isthmus.Client) -> isthmus.Slice:
        return next(t for t in (c.slice({"x": 1}, island="b") for _ in range(8)) if t.hosts == s.hosts)

    mine, held, freezer = on_host(other), on_host(blocker), on_host(other)

    def work(v):
        return jax.lax.fori_loop(0, 100, lambda _, a: jnp.tanh(a @ a), v)

    slow = greedy.jit(work, slice=s)
    x0 = np.eye(256, dtype=np.float32) * 0.5
    x = greedy.put(x0, s)
    slow(x).result()  # compiled, and how long it takes known
    quick = other.jit(lambda v: v + 1.0, slice=mine)
    quick(np.ones(4, np.float32)).result()  # compiled: from here on, calls only
    hold_b, hold_o = holding(blocker, "b", held), holding(other, "b", freezer)
    blocked = [hold_b(), hold_b()]
    blocker.flush()
    outs = [slow(x) for _ in range(30)]
    greedy.flush()
    ones = quick(np.ones(4, np.float32))
    frozen = [hold_o(), hold_o()]
    other.flush()
    row = until(lambda: (r := island_row(address, token, "b"))["queued"] == 33 and r, 60,
                "greedy's 30 calls and the other client's three submissions queued")
    assert any(h["name"] == host and h["running"] for h in row["hosts"]), row
    before = dict(row["admitted"])
    blocker.close()  # its loops end: the host takes the queued work
    after = until(lambda: (a := island_row(address, token, "b")["admitted"]).get(other.id, 0)
                  - before.get(other.id, 0) >= 2 and a, 120, "the other client's call and loop admitted")
    ahead = after.get(greedy.id, 0) - before.get(greedy.id, 0)
    assert ahead <= 4, f"{ahead} of greedy's 30 calls were admitted before the other client's held the host"
    # (computed before the loop behind it was admitted; the server learns that a little after)
    until(ones.ready, 60, "the other client's call computed")
    assert not any(b.ready() for b in frozen)
    freezer.delete()  # its loops end (a value is read off a host its loop does not hold)
    np.testing.assert_array_equal(ones.numpy(), np.full(4, 2.0, np.float32))
    want = np.asarray(jax.jit(work)(x0))
    for b in outs[-2:]:
        np.testing.assert_allclose(b.numpy(), want, rtol=1e-6)
    del blocked
