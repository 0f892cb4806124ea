"""Many clients issue collective calls back to back on overlapping slices of both islands:
the executors overlap them (several computations in flight per host) and nothing deadlocks.

Each of 4 clients chains `CALLS` calls, three on a 4-device slice for every one on an
8-device slice spanning both hosts of the other island (an all-reduce over gloo), issuing
them without waiting; its slices overlap the other clients' on the same devices. Every
chain's end equals the same chain run with `jax.jit` in this process. `ISTHMUS_STRESS_CALLS`
and `ISTHMUS_STRESS_ROUNDS` make it larger outside CI (CI runs one round: 8 000 calls, 2 000
of them cross-host all-reduces; `tests/integration/test_overlap_stress.py` stresses the
executor's overlap itself).
"""

import os
import threading

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from servers import GROUPED, shared_server

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
XDIST_GROUP = "grouped"  # its server's tests together under pytest-xdist (tests/conftest.py)

grouped = shared_server(GROUPED)  # multi-host islands as JAX distributed groups

CLIENTS = 4
CALLS = int(os.environ.get("ISTHMUS_STRESS_CALLS", "2000"))  # per client
ROUNDS = int(os.environ.get("ISTHMUS_STRESS_ROUNDS", "1"))
EVERY = 4  # one call in EVERY is on the 8-device slice


def step(mesh):
    """v/2 + psum(v)/(2n) + 1 over the mesh's one axis: the mean grows by one per call."""
    n = mesh.shape["x"]

    def body(b):
        return b * 0.5 + jax.lax.psum(b, "x") * (0.5 / n) + 1.0

    return jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))


def oracle(x4, x8, calls):
    """The same chains with `jax.jit` here, on 4 and 8 of this process's CPU devices."""
    out = []
    for x, n, count in ((x4, 4, calls - calls // EVERY), (x8, 8, calls // EVERY)):
        mesh = jax.make_mesh((n,), ("x",), devices=jax.devices()[:n])
        sharding = NamedSharding(mesh, P("x"))
        f = jax.jit(step(mesh), in_shardings=sharding, out_shardings=sharding)
        v = jax.device_put(x, sharding)
        for _ in range(count):  # blocking each: this process's XLA pool is not sized for overlap
            v = f(v).block_until_ready()
        out.append(np.asarray(v))
    return out


def chains(c, k):
    """Client k: a 4-device slice on one island, an 8-device one filling the other."""
    island4, island8 = ("a", "b") if k % 2 == 0 else ("b", "a")
    s4, s8 = c.slice({"x": 4}, island=island4), c.slice({"x": 8}, island=island8)
    assert len(s8.hosts) == 2
    f4 = c.jit(step(s4.abstract_mesh), slice=s4, in_specs=P("x"), out_specs=P("x"), name="step4")
    f8 = c.jit(step(s8.abstract_mesh), slice=s8, in_specs=P("x"), out_specs=P("x"), name="step8")
    x4 = np.arange(8, dtype=np.float32) + k
    x8 = np.arange(16, dtype=np.float32) - k
    return (f4, c.put(x4, s4, P("x")), x4), (f8, c.put(x8, s8, P("x")), x8)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_clients_chain_collective_calls_back_to_back_without_deadlock(grouped, round_):
    import client as isthmus

    address, token = grouped
    clients = [isthmus.connect(address, token=token, name=f"stress{k}") for k in range(CLIENTS)]
    try:
        setups = [chains(c, k) for k, c in enumerate(clients)]
        ends: list[list[np.ndarray]] = [[] for _ in clients]
        errors: list[BaseException] = []

        def run(k):
            try:
                (f4, y4, _), (f8, y8, _) = setups[k]
                for i in range(CALLS):
                    if i % EVERY == EVERY - 1:
                        y8 = f8(y8)
                    else:
                        y4 = f4(y4)
                ends[k] = [y4.numpy(), y8.numpy()]
            except BaseException as e:  # reported below, with the client that raised it
                errors.append(e)

        threads = [threading.Thread(target=run, args=(k,)) for k in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=540)
        assert not any(t.is_alive() for t in threads), "a client is still waiting: deadlock"
        assert not errors, errors
        for k, ((_, _, x4), (_, _, x8)) in enumerate(setups):
            want4, want8 = oracle(x4, x8, CALLS)
            np.testing.assert_array_equal(ends[k][0], want4)
            # Across hosts the all-reduce is gloo's, whose summation order may differ in the
            # last bit from one process's; v/2 halves any such difference at every step.
            np.testing.assert_allclose(ends[k][1], want8, rtol=1e-6)
    finally:
        for c in clients:
            c.close()
