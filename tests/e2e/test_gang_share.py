"""Proportional share: clients at weights 1:2:4:8 keeping an island busy (a loose CI check;
`bench/multitenancy.py` gives the exact figure)."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from polling import until
from servers import WINDOW_1, shared_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

WEIGHTS = (1, 2, 4, 8)
RUNS = 24


# A server scheduling by proportional share (the default policy), one submission at a time
# per island; shared with other modules.
shared = shared_server(WINDOW_1)


def test_clients_get_the_island_in_proportion_to_their_weights(shared):
    import client as isthmus

    address, token = shared
    clients = [isthmus.connect(address, token=token, name=f"w{w}", weight=w) for w in WEIGHTS]
    blocker_client = isthmus.connect(address, token=token, name="blocker")

    def island_a() -> dict:  # as the admin sees it: every client's admitted cost
        islands = clients[0]._json("GET", "/v1/islands", credential=token)
        return next(i for i in islands if i["name"] == "a")

    try:
        def busy(v):  # a few milliseconds of work per run
            return jax.lax.fori_loop(0, 8, lambda _, a: jnp.tanh(a @ a) * 0.5, v)

        slices = [c.slice({"x": 1}, island="a") for c in clients]
        fns = [c.jit(busy, slice=s) for c, s in zip(clients, slices, strict=True)]
        progs = [c.program(lambda v, f=f: f(v)) for c, f in zip(clients, fns, strict=True)]
        xs = [c.put(np.eye(128, dtype=np.float32), s) for c, s in zip(clients, slices, strict=True)]
        for p, x in zip(progs, xs, strict=True):
            p(x).result()  # trace, compile

        # The island is kept busy while every client queues its runs: they all start backlogged.
        # The blocker is a loop that ends only when its client is closed (at its next test),
        # so however slowly the runs are queued (a loaded machine), none is admitted first.
        s = blocker_client.slice({"x": 1}, island="a")
        below = blocker_client.jit(lambda i, n: i < n, slice=s)
        step = blocker_client.jit(lambda i: i + 1, slice=s)
        hold = blocker_client.program(lambda i, n: isthmus.while_loop(lambda j: below(j, n), step, i))
        hold(np.int32(0), np.int32(2**30))
        blocker_client.flush()  # on the island before any client's runs (calls do not wait)
        outs: list[list] = [[] for _ in WEIGHTS]

        # The heaviest client's last submission holds the island as the blocker did: once it
        # is admitted nothing else is until it ends, so the counts read meanwhile are those at
        # its admission, however late the test reads them (a loaded machine).
        # (about 2 s here, a tenth of that per 1500 steps)
        tail = clients[-1].jit(lambda v: jax.lax.fori_loop(0, 20000, lambda _, a: jnp.tanh(a @ a), v),
                               slice=slices[-1])
        heavy_eye = clients[-1].put(np.eye(256, dtype=np.float32), slices[-1])

        def submit(k: int) -> None:
            outs[k] = [progs[k](xs[k]) for _ in range(RUNS)]
            if k == len(WEIGHTS) - 1:
                outs[k].append(tail(heavy_eye))
            clients[k].flush()  # every run on the server's queue before it is counted

        threads = [threading.Thread(target=submit, args=(k,)) for k in range(len(WEIGHTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        island = island_a()
        assert island["queued"] == len(WEIGHTS) * RUNS + 1, island  # all backlogged behind the blocker
        # The blocker's host says so, and for how long (the admin sees what it is running).
        busy = [h for h in island["hosts"] if h["running"]]
        assert busy and all(h["running_s"] >= 0 and h["collective_error"] is None for h in busy), island
        before = dict(island["admitted"])
        blocker_client.close()  # its loop ends: the backlog goes
        outs[-1][-2].result()  # the heaviest client's last run is done...

        def at_tail() -> list[int] | None:  # ... and its tail admitted (then nothing else is)
            admitted = island_a()["admitted"]
            done = [admitted.get(c.id, 0) - before.get(c.id, 0) for c in clients]
            return done if done[-1] == RUNS + 1 else None

        done = until(at_tail, 60, "the heaviest client's tail admitted")
        assert not outs[-1][-1].ready(), "the tail ended before the counts were read"
        # By then the others have had about weight/8 of its runs.
        expected = [RUNS * w / WEIGHTS[-1] for w in WEIGHTS]
        for got, want in zip(done[:-1], expected[:-1], strict=True):
            assert abs(got - want) <= max(2.0, 0.25 * want), (done, expected)
        assert done == sorted(done), done
    finally:
        for c in [*clients, blocker_client]:
            c.close()


def test_by_default_one_client_s_backlog_does_not_hold_another_s_work_behind_all_of_it(shared):
    """The default policy is proportional share: bob's one call, queued after 10 of eve's on
    the same island (one admitted at a time here), runs second, not eleventh. A FIFO
    island would finish every call of eve's first."""
    import client as isthmus

    address, token = shared
    with isthmus.connect(address, token=token, name="eve") as eve, \
            isthmus.connect(address, token=token, name="bob") as bob:
        slow = eve.jit(lambda v: jax.lax.fori_loop(0, 300, lambda _, a: jnp.tanh(a @ a), v),
                       slice=eve.slice({"x": 1}, island="a"))
        quick = bob.jit(lambda v: v + 1, slice=bob.slice({"x": 1}, island="a"))
        x = eve.put(np.eye(128, dtype=np.float32), slow.slice)
        y = bob.put(np.zeros(4, np.float32), quick.slice)
        slow(x).result()
        quick(y).result()  # compiled: from here on, calls only
        backlog = [slow(x) for _ in range(10)]
        eve.flush()
        np.testing.assert_array_equal(quick(y).numpy(), np.ones(4))
        assert not backlog[-1].ready(), "bob's call waited for eve's whole backlog"
        jax.block_until_ready(backlog)


def test_a_backlog_on_one_host_keeps_no_call_on_another_host_of_the_island_waiting(connect):
    """Eve's long calls fill one host of island a (the window is bounded in seconds per
    host); bob's call on the island's other host is admitted at once and done before eve's
    first. Measured per island, bob's call waited for one of eve's to finish."""
    import client as isthmus

    eve, bob = connect(name="eve"), connect(name="bob")
    se, sb = eve.slice({"x": 4}, island="a"), bob.slice({"x": 4}, island="a")  # a host each
    assert set(se.hosts).isdisjoint(sb.hosts)
    # about a second a call on the 2-core CI machine: over the window's 0.5 s, so two are in
    # flight at a time, and bob's call is done long before the first (compiled, it takes ms)
    slow = eve.jit(lambda v: jax.lax.fori_loop(0, 12000, lambda _, a: jnp.tanh(a @ a), v), slice=se)
    quick = bob.jit(lambda v: v + 1, slice=sb)
    x, y = eve.put(np.eye(128, dtype=np.float32), se), bob.put(np.zeros(4, np.float32), sb)
    slow(x).result()
    quick(y).result()  # compiled, and timed: from here on, calls only
    t0 = time.monotonic()
    slow(x).result()
    took = time.monotonic() - t0
    backlog = [slow(x) for _ in range(4)]
    eve.flush()
    np.testing.assert_array_equal(quick(y).numpy(), np.ones(4))
    assert not backlog[0].ready(), f"bob's call on an idle host waited for eve's work ({took:.2f} s a call)"
    jax.block_until_ready(backlog)
    assert isinstance(backlog[-1], isthmus.Buffer)
