"""What an in-graph loop costs the server, and how it fails: a 1000-iteration run sends the
executors as many messages as a 1-iteration run, and a failure in iteration k fails the
results with a cause naming the iteration, leaves no state on any host, and the next run
succeeds; so does a failure in the backward loop of a loop's gradient, its stacks freed."""

from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hosts_settled import host_rows
from servers import HEALING

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
XDIST_GROUP = "healing"  # its server's tests together under pytest-xdist (tests/conftest.py)
XDIST_EARLY = True  # a long module: handed out first under pytest-xdist (tests/conftest.py)


@pytest.fixture(scope="module")
def roomy(shared_servers) -> Iterator[isthmus.Client]:
    """A client of a server whose hosts let a computation take 8 TiB of temporaries
    (`servers.HEALING`): one asking for 4 TiB compiles, and fails only when it runs."""
    with isthmus.connect(*shared_servers(HEALING), name="roomy") as c:
        yield c


def counters(c):
    return {name: (h["requests"], h["dispatch_messages"]) for name, h in host_rows(c).items()}


def test_a_1000_iteration_run_costs_the_messages_of_a_1_iteration_run(c):
    sa, sb = c.slice({"x": 1}, island="a"), c.slice({"x": 1}, island="b")
    f = c.jit(lambda v: v * 0.5 + 1.0, slice=sa)
    g = c.jit(lambda v: v - 0.25, slice=sb)

    @c.program
    def loop(x, n):
        return isthmus.fori_loop(0, n, lambda i, v: g(f(v)), x)

    x = c.put(np.zeros(4, np.float32), sa)
    runs = {k: c.put(np.int32(k), sa) for k in (1, 1000)}
    loop(x, runs[1]).result()  # traced, registered, compiled, plans on the hosts
    deltas, outs = {}, {}
    for k, n in runs.items():
        before = counters(c)
        outs[k] = loop(x, n)
        outs[k].result()
        after = counters(c)
        deltas[k] = {h: (after[h][0] - before[h][0], after[h][1] - before[h][1]) for h in after}
    assert deltas[1000] == deltas[1], deltas
    assert {h: d for h, d in deltas[1].items() if d != (0, 0)} == {h: (1, 1) for h in (*sa.hosts, *sb.hosts)}
    want = np.zeros(4, np.float32)
    for _ in range(1000):
        want = (want * np.float32(0.5) + np.float32(1.0)) - np.float32(0.25)
    np.testing.assert_allclose(outs[1000].numpy(), want, rtol=1e-6)


def out_of_memory(v):
    """Compiles (on a server that lets it), and fails when it runs: it asks for 4 TiB."""
    return jnp.sort(jnp.arange(2**40, dtype=jnp.float32) * v[0])[:4] + v


@pytest.mark.parametrize("parallel", [1, 8])
def test_a_failure_in_iteration_k_names_it_frees_every_frame_and_the_next_run_succeeds(roomy, parallel):
    c = roomy
    sa, sb = c.slice({"x": 1}, island="a"), c.slice({"x": 1}, island="b")
    f = c.jit(lambda v: v + 1.0, slice=sa)
    g = c.jit(lambda v: v * 2.0, slice=sb)
    boom = c.jit(out_of_memory, slice=sb)
    is_k = c.jit(lambda i, k: i == k, slice=sa)

    @c.program(parallel_iterations=parallel)
    def loop(x, k):
        def body(i, v):
            return isthmus.cond(is_k(i, k), boom, g, f(v))
        return isthmus.fori_loop(0, 6, body, x)

    x = c.put(np.zeros(4, np.float32), sa)
    with pytest.raises(isthmus.RemoteError, match="iteration 3 of loop"):
        loop(x, c.put(np.int32(3), sa)).numpy()
    for name, h in host_rows(c).items():
        assert (h["runs"], h["frames"], h["mailboxes"]) == (0, 0, 0), (name, h)
    out = loop(x, c.put(np.int32(-1), sa)).numpy()  # never taken: the next run succeeds
    want = np.zeros(4, np.float32)
    for _ in range(6):
        want = (want + 1) * 2
    np.testing.assert_array_equal(out, want)


@jax.custom_vjp
def fragile(v):
    """Doubles; its gradient fails when it runs (it asks for 4 TiB, as `out_of_memory`)."""
    return v * 2.0


fragile.defvjp(lambda v: (v * 2.0, None), lambda _, ct: (out_of_memory(ct),))


def test_a_failure_in_the_backward_of_a_loop_names_the_iteration_and_frees_every_stack(roomy):
    c = roomy
    sa, sb = c.slice({"x": 1}, island="a"), c.slice({"x": 1}, island="b")
    f = c.jit(lambda v: jnp.sin(v) + 1.0, slice=sa)
    breaks = c.jit(fragile, slice=sb, name="fragile")
    g = c.jit(lambda v: v * 2.0, slice=sb)
    is_k = c.jit(lambda i, k: i == k, slice=sa)
    total = c.jit(jnp.sum, slice=sa)

    def loss(x, k):  # iteration k's branch doubles through `fragile`, whose backward fails
        return total(isthmus.fori_loop(0, 6, lambda i, v: isthmus.cond(is_k(i, k), breaks, g, f(v)), x))

    grad = c.program(isthmus.grad(loss))
    x = c.put(np.linspace(0, 1, 4, dtype=np.float32), sa)
    with pytest.raises(isthmus.RemoteError, match=r"(?s)iteration 2 of loop .*Out of memory"):  # 6 - 1 - 3
        grad(x, c.put(np.int32(3), sa)).numpy()
    for name, h in host_rows(c).items():
        assert (h["runs"], h["frames"], h["mailboxes"], h["stacked"]) == (0, 0, 0, 0), (name, h)
    got = grad(x, c.put(np.int32(-1), sa)).numpy()  # never taken: the next run succeeds

    def local(v):
        for _ in range(6):
            v = jnp.sin(v) + 1.0
            v = v * 2.0
        return jnp.sum(v)

    np.testing.assert_allclose(got, jax.grad(local)(np.linspace(0, 1, 4, dtype=np.float32)), rtol=1e-5)


def test_sequential_dispatch_and_fusion_still_run_a_loop_whole(c):
    sa = c.slice({"x": 1}, island="a")
    f = c.jit(lambda v: v * 2.0, slice=sa)
    h = c.jit(lambda v: v + 1.0, slice=sa)

    def fn(x):
        return h(h(isthmus.fori_loop(0, 4, lambda i, v: h(f(v)), f(x))))

    x = np.ones(4, np.float32)
    want = x * 2
    for _ in range(4):
        want = want * 2 + 1
    for prog in (c.program(fn, dispatch="sequential"), c.program(fn, fuse=True)):
        np.testing.assert_array_equal(prog(x).numpy(), want + 2)


def test_a_malformed_loop_is_a_400_naming_the_node(c):
    sa = c.slice({"x": 1}, island="a")
    f = c.jit(lambda v: v * 2.0, slice=sa)
    small = c.jit(lambda v: v.sum() < 10, slice=sa)
    prog = c.program(lambda x: isthmus.while_loop(small, f, f(x)))
    wire = __import__("ir").to_wire(prog.trace(np.ones(4, np.float32)))
    loop = next(n for n in wire["graph"]["nodes"] if n["op"] == "while")
    loop["attrs"]["cond"]["nodes"][-1]["inputs"] = [loop["attrs"]["cond"]["nodes"][0]["outputs"][0]]
    with pytest.raises(isthmus.InvalidArgument, match=r"while cond results: expected one bool\[\] scalar"):
        c.raw_json("POST", "/v1/programs", json={"program": wire})
