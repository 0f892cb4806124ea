"""The gang scheduler's promises to clients, read from its own counts (`GET /v1/islands`,
the admitted submissions per client as the admin sees them), never from how long anything
took: proportional share by weight (a loose CI check; `bench/multitenancy.py` gives the
exact figure), a backlog that does not hold another client's call behind all of it, and a
busy host that keeps no call on another host waiting.

Where a test must read the counts at one moment, the island is held still then
(`tests/e2e/holds.py`): a loop that ends only when its client is closed is admitted, and
with one submission in flight per island (`servers.WINDOW_1`) nothing else is until it
ends."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from holds import holding, island_row
from polling import until
from servers import WINDOW_1, shared_server

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
XDIST_GROUP = "window_1"  # its server's tests together under pytest-xdist (tests/conftest.py)

WEIGHTS = (1, 2, 4, 8)
RUNS = 24

# A server scheduling by proportional share (the default policy), one submission at a time
# per island; shared with other modules.
shared = shared_server(WINDOW_1)


def test_clients_get_the_island_in_proportion_to_their_weights(shared):
    address, token = shared
    clients = [isthmus.connect(address, token=token, name=f"w{w}", weight=w) for w in WEIGHTS]
    blocker_client = isthmus.connect(address, token=token, name="blocker")
    try:
        def busy(v):  # a few milliseconds of work per run
            return jax.lax.fori_loop(0, 8, lambda _, a: jnp.tanh(a @ a) * 0.5, v)

        slices = [c.slice({"x": 1}, island="a") for c in clients]
        fns = [c.jit(busy, slice=s) for c, s in zip(clients, slices, strict=True)]
        progs = [c.program(lambda v, f=f: f(v)) for c, f in zip(clients, fns, strict=True)]
        xs = [c.put(np.eye(128, dtype=np.float32), s) for c, s in zip(clients, slices, strict=True)]
        for p, x in zip(progs, xs, strict=True):
            p(x).result()  # trace, compile
        tail_slice = clients[-1].slice({"x": 1}, island="a")
        tail = holding(clients[-1], "a", tail_slice)

        # The island is held while every client queues its runs: they all start backlogged,
        # however slowly the runs are queued (a loaded machine).
        holding(blocker_client, "a")()
        blocker_client.flush()  # on the island before any client's runs (calls do not wait)
        outs = [[p(x) for _ in range(RUNS)] for p, x in zip(progs, xs, strict=True)]
        # The heaviest client's last submission holds the island as the blocker did: once it
        # is admitted nothing else is, so the counts read then are those at its admission.
        outs[-1].append(tail())
        for c in clients:
            c.flush()  # every run on the server's queue before the blocker goes
        until(lambda: island_row(address, token, "a")["queued"] == len(WEIGHTS) * RUNS + 1, 60,
              "every run backlogged behind the blocker")
        row = island_row(address, token, "a")
        # The blocker's host says so (the admin sees what it is running).
        busy_hosts = [h for h in row["hosts"] if h["running"]]
        assert busy_hosts and all(h["running_s"] >= 0 and h["collective_error"] is None
                                  for h in busy_hosts), row
        before = dict(row["admitted"])
        blocker_client.close()  # its loop ends: the backlog goes

        def at_tail() -> list[int] | None:  # the heaviest client's tail admitted: all frozen
            admitted = island_row(address, token, "a")["admitted"]
            done = [admitted.get(c.id, 0) - before.get(c.id, 0) for c in clients]
            return done if done[-1] == RUNS + 1 else None

        done = until(at_tail, 120, "the heaviest client's tail admitted")
        # By then the others have had about weight/8 of its runs.
        expected = [RUNS * w / WEIGHTS[-1] for w in WEIGHTS]
        for got, want in zip(done[:-1], expected[:-1], strict=True):
            assert abs(got - want) <= max(2.0, 0.25 * want), (done, expected)
        assert done == sorted(done), done
        tail_slice.delete()  # its tail ends with its slice: the island runs the rest
        want = jax.jit(busy)(np.eye(128, dtype=np.float32))
        np.testing.assert_allclose(outs[0][-1].numpy(), np.asarray(want), rtol=1e-6)
    finally:
        for c in [*clients, blocker_client]:
            c.close()


def test_by_default_one_client_s_backlog_does_not_hold_another_s_work_behind_all_of_it(shared):
    """The default policy is proportional share: bob's one call, queued after 10 of eve's
    on the same island (one admitted at a time here), is admitted after a few of them (their
    clocks start level, eve's first), not after all ten as a FIFO island would. All are
    queued behind a blocker first, so the order is the policy's alone; bob's call is
    followed by a loop of his that freezes the island once admitted, so the counts are read
    at that moment."""
    address, token = shared
    with isthmus.connect(address, token=token, name="eve") as eve, \
            isthmus.connect(address, token=token, name="bob") as bob, \
            isthmus.connect(address, token=token, name="blocker") as blocker:
        def work(v):
            return jax.lax.fori_loop(0, 30, lambda _, a: jnp.tanh(a @ a), v)

        slow = eve.jit(work, slice=eve.slice({"x": 1}, island="a"))
        quick = bob.jit(lambda v: v + 1, slice=bob.slice({"x": 1}, island="a"))
        x = eve.put(np.eye(128, dtype=np.float32), slow.slice)
        y = bob.put(np.zeros(4, np.float32), quick.slice)
        slow(x).result()
        quick(y).result()  # compiled: from here on, calls only
        frozen = bob.slice({"x": 1}, island="a")
        freeze = holding(bob, "a", frozen)
        holding(blocker, "a")()
        blocker.flush()
        backlog = [slow(x) for _ in range(10)]
        eve.flush()
        mine = quick(y)
        freeze()
        bob.flush()
        until(lambda: island_row(address, token, "a")["queued"] == 12, 60,
              "eve's and bob's work behind the blocker")
        before = dict(island_row(address, token, "a")["admitted"])
        blocker.close()
        admitted = until(lambda: (a := island_row(address, token, "a")["admitted"]).get(bob.id, 0)
                         - before.get(bob.id, 0) == 2 and a, 60, "bob's call and loop admitted")
        assert admitted.get(eve.id, 0) - before.get(eve.id, 0) <= 3, (before, admitted)
        assert mine.ready() and not backlog[-1].ready()  # behind bob's loop, which holds the island
        frozen.delete()  # bob's loop ends with its slice (a value is read off a host no loop holds)
        np.testing.assert_array_equal(mine.numpy(), np.ones(4))
        want = jax.jit(work)(np.eye(128, dtype=np.float32))
        np.testing.assert_allclose(backlog[-1].numpy(), np.asarray(want), rtol=1e-6)


def test_a_backlog_on_one_host_keeps_no_call_on_another_host_of_the_island_waiting(connect):
    """Eve's work fills one host of island a for good (two loops of hers: past two in
    flight, the window is bounded in seconds per host); bob's call on the island's other
    host is admitted at once and done while they run. Were the window the island's, bob's
    call would wait for one of eve's to end, and neither does until she closes."""
    eve, bob = connect(name="eve"), connect(name="bob")
    se, sb = eve.slice({"x": 4}, island="a"), bob.slice({"x": 4}, island="a")  # a host each
    assert set(se.hosts).isdisjoint(sb.hosts)
    quick = bob.jit(lambda v: v + 1, slice=sb)
    y = bob.put(np.zeros(4, np.float32), sb)
    quick(y).result()  # compiled: from here on, calls only
    hold = holding(eve, "a", se)
    loops = [hold(), hold()]
    eve.flush()
    np.testing.assert_array_equal(quick(y).numpy(), np.ones(4))
    assert not any(b.ready() for b in loops)  # eve's host still held
    eve.close()
