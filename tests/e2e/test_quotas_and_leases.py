"""Quotas answer 429 with Retry-After and let a client go on once it frees something; a
client that vanishes without closing is closed after its lease, everything it held freed.

A server of its own, with small quotas and a 2 s lease, started once for the module."""

from __future__ import annotations

import gc
import time

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from polling import until
from servers import module_server

import client as isthmus
from client import connection as client_connection
from client import jit as client_jit
from client import program as client_program

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]
XDIST_EARLY = True  # a long module: handed out first under pytest-xdist (tests/conftest.py)

LEASE_S = 2.0
ENV = {
    "ISTHMUS_CLIENT_LEASE_S": str(LEASE_S), "ISTHMUS_MAX_SLICES": "2", "ISTHMUS_MAX_BUFFER_MB": "1",
    "ISTHMUS_MAX_COMPUTATIONS": "2", "ISTHMUS_MAX_PROGRAMS": "1", "ISTHMUS_MAX_CLIENTS": "4",
    "ISTHMUS_MAX_ARTIFACT_MB": "1", "ISTHMUS_EXECUTOR_TEMP_MB": "32", "ISTHMUS_MAX_STORED_MB": "1",
    "ISTHMUS_MAX_PROGRAM_COMPUTATIONS": "2",
}


small = module_server("isthmus-quotas", ENV)


def test_over_quota_is_429_with_retry_after_and_freeing_lets_the_client_go_on(small):
    address, token = small
    with isthmus.connect(address, token=token, name="greedy") as c:
        h = {"Authorization": f"Bearer {c.secret}"}
        s1, s2 = c.slice({"x": 1}), c.slice({"x": 1})
        r = httpx.post(f"{address}/v1/slices", json={"mesh": {"x": 1}}, headers=h)
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert "slices: 2 held" in r.json()["detail"] and "limit of 2" in r.json()["detail"]
        s2.delete()
        s3 = c.slice({"x": 1})  # room again

        big = np.zeros(96 * 1024, np.float32)  # 384 KiB: two fit in the 1 MiB quota, three do not
        a, b = c.put(big, s1), c.put(big, s1)
        with pytest.raises(isthmus.OverQuota, match="buffer bytes"):
            c.put(np.zeros(160 * 1024, np.float32), s1)
        f = c.jit(lambda v: v + 1, slice=s1)
        with pytest.raises(isthmus.OverQuota, match="buffer bytes"):  # the call's output
            f(a).result()  # the call does not wait: its refusal lands on its future
        del b  # dropped: freed with the next request
        np.testing.assert_array_equal(f(a).numpy(), big + 1)

        g = c.jit(lambda v: v * 2, slice=s3)
        g(c.put(np.ones(4, np.float32), s3)).result()
        with pytest.raises(isthmus.OverQuota, match="computations: 2 held"):
            c.jit(lambda v: v - 1, slice=s3)(c.put(np.ones(4, np.float32), s3))


def materializing(n: int):
    """A function whose [n, n] float32 intermediate XLA keeps as a temporary."""
    return lambda v: v + (jnp.full((n, n), v[0]) @ jnp.ones(n, jnp.float32))[:4] * 0 + 1


def test_a_computation_whose_temporaries_exceed_its_hosts_budget_fails_to_compile(small):
    """64 MiB of temporaries against the 32 MiB this server's hosts give: refused when
    compiled (the registration waits for it: the call is refused, 409), with both figures;
    the host serves on, one that fits runs."""
    address, token = small
    with isthmus.connect(address, token=token, name="hungry") as c:
        s = c.slice({"x": 1})
        x = c.put(np.ones(4, np.float32), s)
        with pytest.raises(isthmus.Conflict, match=r"compiling failed: MemoryError: it needs 6\d MiB of "
                           r"working memory on host \w+ .* may take 32 MiB together \(executor_temp_mb\)"):
            c.jit(materializing(4096), slice=s)(x).result()
        fits = c.jit(materializing(512), slice=s)  # 1 MiB
        np.testing.assert_array_equal(fits(x).numpy(), np.full(4, 2, np.float32))


def test_the_default_budget_refuses_temporaries_no_machine_could_hold(c):
    """4 TB of temporaries on the shared test server (its default budget: half the machine
    among its hosts): refused before anything runs; nothing of the client's is lost."""
    s = c.slice({"x": 1})
    x = c.put(np.ones(4, np.float32), s)
    with pytest.raises(isthmus.Conflict, match=r"failed to compile: .*MiB of working memory on host"):
        c.jit(materializing(1_000_000), slice=s)(x).result()
    np.testing.assert_array_equal(c.jit(materializing(8), slice=s)(x).numpy(), np.full(4, 2, np.float32))
    np.testing.assert_array_equal(x.numpy(), np.ones(4, np.float32))


def test_a_program_of_more_distinct_computations_than_the_bound_is_refused(small):
    """Each distinct computation of a program is an executable its hosts compile ahead of
    their other work: at most max_program_computations of them (2 here), named."""
    address, token = small
    with isthmus.connect(address, token=token, name="compiles") as c:
        s = c.slice({"x": 1})
        fs = [c.jit(lambda v, k=k: v * k, slice=s) for k in range(3)]
        x = c.put(np.ones(4, np.float32), s)
        bound = r"3 distinct computations .*max_program_computations \(2\)"
        with pytest.raises(isthmus.InvalidArgument, match=bound):
            c.program(lambda v: fs[2](fs[1](fs[0](fs[0](v)))))(x).result()  # fs[0] twice: one


def test_a_program_s_intermediate_values_count_against_the_buffer_quota_while_it_runs(small):
    """The 1 MiB quota: a program passing 2 MiB between its computations is refused when
    registered; one passing 768 KiB runs, but not beside a 384 KiB buffer (429, then room)."""
    address, token = small
    with isthmus.connect(address, token=token, name="passing") as c:
        s = c.slice({"x": 1})
        x = c.put(np.ones(4, np.float32), s)

        def through(n: int):
            widen = c.jit(lambda v: jnp.tile(v, n // 4), slice=s)  # n float32: the intermediate
            narrow = c.jit(lambda w: w.reshape(-1, 4).sum(0), slice=s)
            return c.program(lambda v: narrow(widen(v)))

        refused = r"a run holds up to 2097152 bytes of intermediate values at once \(2097152 on host a\d\)"
        with pytest.raises(isthmus.InvalidArgument, match=refused + ".*max_buffer_mb"):
            through(512 * 1024)(x).result()
        fits = through(192 * 1024)  # 768 KiB
        np.testing.assert_array_equal(fits(x).numpy(), np.full(4, 48 * 1024, np.float32))
        held = c.put(np.zeros(96 * 1024, np.float32), s)
        with pytest.raises(isthmus.OverQuota, match=r"786432 of them the intermediate values its run holds"):
            fits(x).result()
        del held  # dropped: freed with the next request
        np.testing.assert_array_equal(fits(x).numpy(), np.full(4, 48 * 1024, np.float32))


def test_jitting_again_in_a_loop_counts_once_against_the_quota(small):
    address, token = small
    with isthmus.connect(address, token=token, name="looping") as c:
        s = c.slice({"x": 1})
        x = c.put(np.zeros(4, np.float32), s)

        def step(v):
            return v + 1

        for _ in range(4):  # as jax.jit(step)(x) in a loop: traced and registered once
            x = c.jit(step, slice=s)(x)
        assert c.jit(step, slice=s) is c.jit(step, slice=s)

        class Model:
            def apply(self, v):
                return v + 1

        model = Model()  # a method is bound anew each time it is read: the same function
        assert c.jit(model.apply, slice=s) is c.jit(model.apply, slice=s)
        assert c.jit(model.apply, slice=s) is not c.jit(Model().apply, slice=s)
        assert c.program(step) is c.program(step) and c.program(step) is not c.program(step, fuse=True)
        for _ in range(4):  # a new function each time, the same artifact: one computation
            x = c.jit(lambda v: v + 1, slice=s)(x)
        np.testing.assert_array_equal(x.numpy(), np.full(4, 8, np.float32))
        listed = httpx.get(f"{address}/v1/computations", headers={"Authorization": f"Bearer {c.secret}"})
        assert len(listed.json()) == 2  # the quota's limit, never passed


def _listed(address: str, secret: str, what: str) -> list[dict]:
    return httpx.get(f"{address}/v1/{what}", headers={"Authorization": f"Bearer {secret}"}).json()


def test_a_function_called_with_more_signatures_than_it_keeps_goes_on(small, monkeypatch):
    """As jax.jit takes any number of shapes, a function keeps the registrations of its
    newest signatures only (256; 2 here, as this server holds 2 computations): the oldest
    is forgotten on the server and registered again if called again."""
    monkeypatch.setattr(client_jit, "SIGNATURES_KEPT", 2)
    monkeypatch.setattr(client_program, "SIGNATURES_KEPT", 1)
    address, token = small
    with isthmus.connect(address, token=token, name="shapes") as c:
        s = c.slice({"x": 1})
        total = c.jit(lambda v: v.sum(), slice=s)
        for n in [*range(1, 8), 1, 2]:
            assert total(np.ones(n, np.float32)).numpy() == n
        assert len(_listed(address, c.secret, "computations")) <= 2

        twice = c.jit(lambda v: v * 2, slice=s)

        @c.program
        def quadruple(v: object) -> object:
            return twice(twice(v))

        for n in [*range(1, 5), 1]:  # a program for each shape; one kept
            np.testing.assert_array_equal(quadruple(np.ones(n, np.float32)).numpy(), np.full(n, 4.0))
        assert len(_listed(address, c.secret, "programs")) == 1


def test_functions_made_in_a_loop_are_forgotten_on_the_server_once_dropped(small, monkeypatch):
    """A function and program written anew each step, each different: what the client no
    longer holds leaves the server's quota (with 256 functions kept; 1 here)."""
    monkeypatch.setattr(client_connection, "JITTED_KEPT", 1)
    address, token = small
    with isthmus.connect(address, token=token, name="anew") as c:
        s = c.slice({"x": 1})
        x = c.put(np.zeros(4, np.float32), s)
        for i in range(1, 6):
            add = c.jit(lambda v, i=i: v + i, slice=s)
            step = c.program(lambda v, add=add: add(add(v)))
            x = add(step(x))
            assert len(_listed(address, c.secret, "computations")) <= 2
            assert len(_listed(address, c.secret, "programs")) <= 1
        np.testing.assert_array_equal(x.numpy(), np.full(4, 45, np.float32))


def test_a_dropped_function_s_queued_calls_still_run(small, monkeypatch):
    """Calls queued before their function was dropped run: the server forgets it after
    them, and the hosts forget its executables once they have run."""
    monkeypatch.setattr(client_connection, "JITTED_KEPT", 0)  # `c.jit` keeps no function
    address, token = small
    with isthmus.connect(address, token=token, name="dropping") as c:
        s = c.slice({"x": 1})
        x = c.put(np.arange(4, dtype=np.float32), s)
        f = c.jit(lambda v: v * 3, slice=s)
        ys = [f(x) for _ in range(50)]
        del f
        gc.collect()
        for y in ys:
            np.testing.assert_array_equal(y.numpy(), np.arange(4) * 3)
        assert _listed(address, c.secret, "computations") == []


def test_a_session_on_the_same_secret_keeps_what_it_registered_when_another_lets_go(small, monkeypatch):
    """The server counts registrations: two sessions on one secret answered with one id
    (the same function registered by each) each hold it; one letting go leaves the other's."""
    monkeypatch.setattr(client_connection, "JITTED_KEPT", 0)  # `c.jit` keeps no function
    address, token = small
    with isthmus.connect(address, token=token, name="shared") as a:
        b = isthmus.connect(address, secret=a.secret)
        s = a.slice({"x": 1})
        x = np.arange(4, dtype=np.float32)

        def times_5(v: object) -> object:
            return v * 5

        fa, fb = a.jit(times_5, slice=s), b.jit(times_5, slice=s)
        for f in (fa, fb):  # (one call site: an export carries its source locations)
            f(x).result()
        assert len(_listed(address, a.secret, "computations")) == 1  # one id for both
        del fa
        gc.collect()
        a.flush()
        np.testing.assert_array_equal(fb(x).numpy(), x * 5)
        del fb, f
        gc.collect()
        b.flush()
        assert _listed(address, a.secret, "computations") == []


def test_deleting_a_computation_or_program_over_http(small):
    address, token = small
    with isthmus.connect(address, token=token, name="owner") as c, \
            isthmus.connect(address, token=token, name="other") as other:
        s = c.slice({"x": 1})
        f = c.jit(lambda v: v + 1, slice=s)

        @c.program
        def g(v: object) -> object:
            return f(f(v))

        x = c.put(np.zeros(4, np.float32), s)
        np.testing.assert_array_equal(g(f(x)).numpy(), np.full(4, 3.0))
        [comp], [prog] = _listed(address, c.secret, "computations"), _listed(address, c.secret, "programs")
        mine, theirs = {"Authorization": f"Bearer {c.secret}"}, {"Authorization": f"Bearer {other.secret}"}
        for what, record in (("computations", comp), ("programs", prog)):
            r = httpx.delete(f"{address}/v1/{what}/{record['id']}", headers=theirs)
            assert r.status_code == 404 and record["id"] in r.json()["detail"], r.text
            assert httpx.delete(f"{address}/v1/{what}/{record['id']}", headers=mine).status_code == 204
            assert httpx.get(f"{address}/v1/{what}/{record['id']}", headers=mine).status_code == 404
        r = httpx.post(f"{address}/v1/calls", json={"computation_id": comp["id"], "inputs": [x.id]},
                       headers=mine)
        assert r.status_code == 404 and comp["id"] in r.json()["detail"], r.text


def test_a_large_array_closed_over_is_refused_with_what_to_do_instead(small):
    address, token = small
    with isthmus.connect(address, token=token, name="closing-over") as c:
        s = c.slice({"x": 1})
        table = np.arange(512 * 1024, dtype=np.float32)  # 2 MiB, embedded as a constant
        with pytest.raises(isthmus.InvalidArgument, match=r"at most 1048576 \(max_artifact_mb\)\. "
                                                          r"Arrays the function closes over"):
            c.jit(lambda i: jnp.asarray(table)[i], slice=s)(np.int32(3))
        lookup = c.jit(lambda t, i: t[i], slice=s)  # the way it suggests: the table as an argument
        part = table[: 192 * 1024]  # (0.75 MiB: this server holds at most 1 MiB of buffers)
        assert lookup(c.put(part, s), np.int32(3)).numpy() == 3.0


def test_what_the_state_dir_keeps_of_a_client_is_bounded(small):
    """Each artifact (a 600 KiB table embedded) is within the artifact limit, but two are past
    what the state dir keeps of one client (1 MiB here); deleting one makes room."""
    address, token = small
    with isthmus.connect(address, token=token, name="hoarder") as c:
        s = c.slice({"x": 1})
        tables = [np.arange(150 * 1024, dtype=np.float32) + k for k in range(2)]
        first = c.jit(lambda i: jnp.asarray(tables[0])[i], slice=s)
        assert first(np.int32(3)).numpy() == 3.0
        kept = httpx.get(f"{address}/v1/clients/self", headers={"Authorization": f"Bearer {c.secret}"})
        assert kept.json()["stored_bytes"] > 600 * 1024, kept.text
        second = c.jit(lambda i: jnp.asarray(tables[1])[i], slice=s)
        with pytest.raises(isthmus.OverQuota, match=r"stored bytes: \d+ bytes held.*the artifact, kept "
                                                    r"in the state dir.*limit of 1048576"):
            second(np.int32(3)).result()
        (computation,) = first.registrations
        assert httpx.delete(f"{address}/v1/computations/{computation}",
                            headers={"Authorization": f"Bearer {c.secret}"}).status_code == 204
        assert second(np.int32(3)).numpy() == 4.0


def test_client_count_is_bounded(small):
    address, token = small
    opened = []
    try:
        with pytest.raises(isthmus.OverQuota, match="clients"):
            for k in range(5):
                opened.append(isthmus.connect(address, token=token, name=f"c{k}"))
    finally:
        for c in opened:
            c.close()
    isthmus.connect(address, token=token).close()  # closing made room


def _hosts_buffers(address: str, token: str) -> int:
    islands = httpx.get(f"{address}/v1/islands", headers={"Authorization": f"Bearer {token}"}).json()
    return sum(h["buffers"] for i in islands for h in i["hosts"])


def test_a_client_that_vanishes_is_closed_after_its_lease_and_its_buffers_freed(small):
    address, token = small
    admin = {"Authorization": f"Bearer {token}"}
    before = _hosts_buffers(address, token)
    # A client speaking plain HTTP, which then stops talking (no lease renewal, no close).
    made = httpx.post(f"{address}/v1/clients", json={"name": "ghost"}, headers=admin).json()
    h = {"Authorization": f"Bearer {made['secret']}"}
    assert made["lease_s"] == LEASE_S
    s = httpx.post(f"{address}/v1/slices", json={"mesh": {"x": 2}}, headers=h).json()
    for k in range(3):
        params = {"slice_id": s["id"], "dtype": "float32", "shape": "8"}
        r = httpx.post(f"{address}/v1/buffers", params=params,
                       content=np.full(8, k, np.float32).tobytes(),
                       headers=h | {"Content-Type": "application/octet-stream"})
        assert r.status_code == 201, r.text
        httpx.get(f"{address}/v1/buffers/{r.json()['id']}", params={"wait": True}, headers=h)
    ghost = next(c for c in httpx.get(f"{address}/v1/clients", headers=admin).json() if c["id"] == made["id"])
    assert (ghost["slices"], ghost["buffers"]) == (1, 3)
    assert _hosts_buffers(address, token) == before + 3  # one host holds the 2-device slice

    def open_ids() -> set[str]:
        return {c["id"] for c in httpx.get(f"{address}/v1/clients", headers=admin).json()}

    until(lambda: made["id"] not in open_ids(), 10 * LEASE_S, "the silent client closed")
    assert httpx.get(f"{address}/v1/slices", headers=h).status_code == 401  # its secret is dead
    until(lambda: _hosts_buffers(address, token) == before, 10 * LEASE_S, "its buffers freed on the hosts")


def test_an_open_python_client_keeps_its_lease_while_idle(small):
    address, token = small
    with isthmus.connect(address, token=token, name="patient") as c:
        s = c.slice({"x": 1})
        x = c.put(jnp.arange(4, dtype=jnp.float32), s, P())
        start = time.monotonic()
        admin = {"Authorization": f"Bearer {token}"}
        # Idle for three leases, watched from outside; the client's own thread renews it.
        until(lambda: time.monotonic() - start > 3 * LEASE_S
              and c.id in {k["id"] for k in httpx.get(f"{address}/v1/clients", headers=admin).json()},
              10 * LEASE_S, "three leases passed with the client still open")
        np.testing.assert_array_equal(x.numpy(), np.arange(4))


def _hosts_caches(address: str, token: str) -> tuple[int, int]:
    islands = httpx.get(f"{address}/v1/islands", headers={"Authorization": f"Bearer {token}"}).json()
    hosts = [h for i in islands for h in i["hosts"]]
    return sum(h["executables"] for h in hosts), sum(h["plans"] for h in hosts)


def test_hosts_forget_executables_and_plans_no_client_uses(small):
    """Compile caches and plan caches are bounded by what live clients hold: a closing
    client's executables and plans leave the hosts, a shared one stays while another uses it."""
    address, token = small
    before = _hosts_caches(address, token)
    with isthmus.connect(address, token=token, name="a") as a, isthmus.connect(address, token=token) as b:
        sa, sb = a.slice({"x": 1}, island="b"), b.slice({"x": 1}, island="b")
        x = np.arange(4, dtype=np.float32)
        fb = b.jit(lambda v: jnp.sin(v) * 3, slice=sb)
        np.testing.assert_allclose(fb(b.put(x, sb)).numpy(), np.sin(x) * 3, rtol=1e-6)
        b_only = _hosts_caches(address, token)
        fa = a.jit(lambda v: jnp.sin(v) * 3, slice=sa)  # fb's artifact; maybe the same devices
        ga = a.jit(lambda v: v - 1, slice=sa)

        @a.program
        def step(v: object) -> object:
            return ga(fa(v))

        np.testing.assert_allclose(step(a.put(x, sa)).numpy(), np.sin(x) * 3 - 1, rtol=1e-6)
        during = _hosts_caches(address, token)
        assert during[0] > b_only[0] > before[0] and during[1] > b_only[1] > before[1]
        a.close()
        until(lambda: _hosts_caches(address, token) == b_only, 30, "a's executables and plans forgotten")
        np.testing.assert_allclose(fb(b.put(x, sb)).numpy(), np.sin(x) * 3, rtol=1e-6)  # b's still work
    until(lambda: _hosts_caches(address, token) == before, 30, "every cache back to what it was")


def test_a_client_killed_while_it_waits_is_closed_after_its_lease(small):
    """Its wait for a computation that does not end stops counting once its connection is
    gone, so the lease runs out and the client is closed, as one that sent nothing (and the
    computation stops with its host's executor: the host is back up after)."""
    import socket

    address, token = small
    c = isthmus.connect(address, token=token, name="waiter", close_at_exit=False)
    c.lease.stop()  # (as a killed process would: no renewal)
    s = c.slice({"x": 1})
    hours = c.jit(lambda v: jax.lax.fori_loop(0, 2**31 - 1, lambda _, a: jnp.tanh(a @ a), v), slice=s)
    out = hours(c.put(np.eye(32, dtype=np.float32), s))
    c.flush()
    host, port = address.removeprefix("http://").rsplit(":", 1)
    waiting = socket.create_connection((host, int(port)), timeout=10)
    waiting.sendall(f"GET /v1/buffers/{out.id}/data HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: Bearer {c.secret}\r\n\r\n".encode())
    admin = {"Authorization": f"Bearer {token}"}

    def clients() -> dict[str, dict]:
        return {r["id"]: r for r in httpx.get(f"{address}/v1/clients", headers=admin).json()}

    until(lambda: clients()[c.id]["idle_s"] == 0.0, 30, "the wait in progress")
    waiting.close()  # the process that waited is gone
    until(lambda: c.id not in clients(), 60, "the client closed after its lease")
    until(lambda: all(h["status"] == "up" and not h["running"] for i in httpx.get(
        f"{address}/v1/islands", headers=admin).json() for h in i["hosts"]), 120,
          "the host back with a new executor")
