"""Buffers are bounded by what their hosts' machine can hold, not only per client: clients
each within their quota cannot, together, fill a machine until the kernel kills executors.

A server of its own whose CPU hosts offer buffers 2 MiB each (`executor_buffer_mb`): the
default cluster's four hosts share one machine, so their buffers may take 8 MiB together."""

from __future__ import annotations

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from polling import until
from servers import module_server

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

MIB = 1 << 20
ENV = {"ISTHMUS_EXECUTOR_BUFFER_MB": "2", "ISTHMUS_MAX_BUFFER_MB": "1"}


server = module_server("isthmus-host-memory", ENV)


def test_each_cpu_device_shows_its_share_of_what_its_host_offers(server):
    address, token = server
    devices = httpx.get(f"{address}/v1/devices", headers={"Authorization": f"Bearer {token}"}).json()
    assert {d["memory_bytes"] for d in devices} == {2 * MIB // 4}


def test_replicated_buffers_of_clients_within_their_quotas_are_refused_once_the_machine_is_full(server):
    """768 KiB replicated over a 4-device host takes 3 MiB of it: two clients fit (6 of the
    8 MiB), a third is refused with 429, naming the host and the figures, whatever host its
    slice is on; room freed lets it in, and nothing stored is lost."""
    address, token = server
    value = np.arange(192 * 1024, dtype=np.float32)  # 768 KiB, within each client's 1 MiB
    with (isthmus.connect(address, token=token, name="first") as a,
          isthmus.connect(address, token=token, name="second") as b):
        held = a.put(value, a.slice({"x": 4}))
        also = b.put(value, b.slice({"x": 4}))
        with isthmus.connect(address, token=token, name="third") as c:
            c_slice = c.slice({"x": 4})
            full = (rf"host memory: host {c_slice.hosts[0]}: {6 * MIB} bytes of buffers held, "
                    rf"{3 * MIB} bytes more would pass the {8 * MIB} bytes its executors offer buffers")
            with pytest.raises(isthmus.OverQuota, match=full):
                c.put(value, c_slice)
            small = c.put(np.ones(4, np.float32), c_slice)  # what fits still goes
            double = c.jit(lambda v: v * 2, slice=c_slice)
            with pytest.raises(isthmus.OverQuota, match="host memory"):  # a call's output counts too
                double(c.put(value[: 64 * 1024], c_slice)).result()  # 1 MiB in, 1 MiB more out
            also.delete()
            b.close()  # its buffer freed, and its claim on the machine gone with it
            part = value[: 64 * 1024]
            np.testing.assert_array_equal(double(c.put(part, c_slice)).numpy(), part * 2)
            np.testing.assert_array_equal(held.numpy(), value)
            np.testing.assert_array_equal(small.numpy(), np.ones(4, np.float32))


def test_a_client_past_its_claim_on_the_machine_is_refused_while_other_open_clients_hold_less(server):
    """Three open clients each have a claim on a third of the 8 MiB: one may not take more
    (429, naming its claim and the figures) even with the machine idle, and the others'
    claims are there for them; alone it may take more."""
    address, token = server
    value = np.arange(192 * 1024, dtype=np.float32)  # 3 MiB replicated over a 4-device host
    with isthmus.connect(address, token=token, name="greedy") as a:
        s = a.slice({"x": 4})
        with (isthmus.connect(address, token=token, name="idle") as b,
              isthmus.connect(address, token=token, name="also idle") as c):
            claim = (rf"host memory: host {s.hosts[0]} \(shared by the hosts on its machine, unpinned "
                     rf"hosts\): this client's buffers there take 0 bytes; {3 * MIB} bytes more would pass "
                     rf"its claim, {8 * MIB // 3} of the {8 * MIB} bytes its executors offer \(its weight, "
                     rf"1, of the open clients' 3\), and take room the other clients' unused claims keep "
                     rf"\({2 * 8 * MIB // 3} of the {8 * MIB} bytes left\)")
            with pytest.raises(isthmus.OverQuota, match=claim):
                a.put(value, s)
            part = value[: 128 * 1024]  # 2 MiB so, within each claim
            theirs = [b.put(part, b.slice({"x": 4})), c.put(part, c.slice({"x": 4}))]
            mine = a.put(part, s)
            np.testing.assert_array_equal(theirs[0].numpy(), part)
        more = a.put(value[: 64 * 1024], s)  # alone now: 3 MiB in all, past a third
        np.testing.assert_array_equal(more.numpy(), value[: 64 * 1024])
        np.testing.assert_array_equal(mine.numpy(), part)


def host_row(address: str, token: str, host: str) -> dict:
    islands = httpx.get(f"{address}/v1/islands", headers={"Authorization": f"Bearer {token}"}).json()
    return next(h for i in islands for h in i["hosts"] if h["name"] == host)


def test_a_sharded_buffer_takes_a_shard_per_device_and_the_islands_show_the_bytes(server):
    address, token = server
    value = np.arange(64 * 1024, dtype=np.float32)  # 256 KiB
    with isthmus.connect(address, token=token, name="sharded") as c:
        s = c.slice({"x": 4})
        [host] = s.hosts
        before = host_row(address, token, host)["buffer_bytes"]
        sharded = c.put(value, s, P("x"))
        assert host_row(address, token, host)["buffer_bytes"] == before + 256 * 1024
        replicated = c.put(value, s)
        row = host_row(address, token, host)
        assert row["buffer_bytes"] == before + 5 * 256 * 1024
        assert row["buffer_budget_bytes"] == 2 * MIB and row["buffer_pool"] == "unpinned hosts"
        pool = sum(h["buffer_bytes"] for i in httpx.get(f"{address}/v1/islands", headers={
            "Authorization": f"Bearer {token}"}).json() for h in i["hosts"])
        assert row["buffer_pool_free_bytes"] == 8 * MIB - pool  # the four hosts' pool
        sharded.delete()
        replicated.delete()
        c.buffers()  # the releases have gone
        assert host_row(address, token, host)["buffer_bytes"] == before


def test_a_released_buffer_counts_until_the_work_reading_it_has_run(server):
    """Its host frees a released buffer only once the queued work reading it has run: the
    server counts it until then (before, a client could place uploads faster than a slow
    computation let them go, uncounted, past the machine's budget)."""
    address, token = server
    with isthmus.connect(address, token=token, name="behind") as c:
        s = c.slice({"x": 4})
        [host] = s.hosts
        slow = c.jit(lambda v: jax.lax.fori_loop(0, 400_000, lambda i, a: jnp.tanh(a @ a),
                                                 jnp.ones((64, 64)) * v[0]).sum(), slice=s)
        use = c.jit(lambda b, w: b[:4] + 0 * w, slice=s)
        v = c.put(np.ones(4, np.float32), s)
        w = slow(v)  # seconds of work on the host
        before = host_row(address, token, host)["buffer_bytes"]
        x = c.put(np.ones(64 * 1024, np.float32), s)  # 1 MiB on the host, replicated
        out = use(x, w)  # queued behind the slow computation
        x.delete()
        c.buffers()  # the release has gone
        assert host_row(address, token, host)["buffer_bytes"] == before + MIB + 64  # x, and out's 4 floats
        np.testing.assert_array_equal(out.numpy(), np.ones(4, np.float32))
        until(lambda: host_row(address, token, host)["buffer_bytes"] == before + 64, 30, "x uncounted")


def test_a_refused_call_leaves_its_donated_arguments_to_the_caller(server):
    """A training step donating its state, refused for want of room, does not take the
    state with it: the caller still has it, and the same step runs once there is room."""
    address, token = server
    value = np.arange(192 * 1024, dtype=np.float32)  # 3 MiB replicated over a 4-device host
    state = np.arange(96 * 1024, dtype=np.float32)  # 1.5 MiB so; its update 1.5 MiB more
    with (isthmus.connect(address, token=token, name="fill1") as f1,
          isthmus.connect(address, token=token, name="fill2") as f2):
        kept = [f1.put(value, f1.slice({"x": 4})), f2.put(value, f2.slice({"x": 4}))]
        with isthmus.connect(address, token=token, name="trainer") as c:
            s = c.slice({"x": 4})
            p = c.put(state, s)
            step = c.jit(lambda v: v + 1, slice=s, donate_argnums=0)
            with pytest.raises(isthmus.OverQuota, match="host memory"):
                step(p).result()
            assert not p.is_deleted()
            np.testing.assert_array_equal(p.numpy(), state)
            kept.pop().delete()
            f2.close()  # its buffer freed, and its claim on the machine gone with it
            p2 = step(p)
            np.testing.assert_array_equal(p2.numpy(), state + 1)
            assert p.is_deleted()
            with pytest.raises(isthmus.NotFound, match="donated"):
                p.numpy()
