"""The client does not wait: calls issued back to back are queued and travel together, in
order, and compute what `jax.jit` computes here."""

import base64
import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
XDIST_GROUP = "window_1"  # its server's tests together under pytest-xdist (tests/conftest.py)


def test_back_to_back_calls_travel_in_a_few_requests_and_equal_jax(c):
    s = c.slice({"x": 2})

    def step(v, k):
        return jnp.sin(v) * k + 1.0

    f = c.jit(step, slice=s, in_specs=(P("x"), P()), out_specs=P("x"))
    x = c.put(np.linspace(0, 1, 8, dtype=np.float32), s, P("x"))
    f(x, np.float32(2)).result()  # registered and compiled: from here on, only calls
    sent = c.requests_sent
    y = x
    for k in range(200):
        y = f(y, np.float32(k % 3))  # an array argument: its upload is queued too
    want = np.linspace(0, 1, 8, dtype=np.float32)
    local = jax.jit(step)
    for k in range(200):
        want = local(want, np.float32(k % 3))
    np.testing.assert_array_equal(y.numpy(), np.asarray(want))
    # 200 calls and 200 uploads: a handful of batches and the fetch, never one per call.
    assert c.requests_sent - sent < 40, c.requests_sent - sent


def test_a_chain_waited_for_is_one_request(c):
    s = c.slice({"x": 1})
    inc = c.jit(lambda v: v + 1, slice=s)
    y = inc(c.put(np.zeros(4, np.float32), s)).result()
    for _ in range(5):
        sent = c.requests_sent
        y = inc(y).result()  # the call rides on the wait's request, unless the sender took it first
        assert c.requests_sent - sent in (1, 2)
    np.testing.assert_array_equal(y.numpy(), np.full(4, 6, np.float32))


def test_order_is_kept_across_calls_releases_and_functions(c):
    s = c.slice({"x": 2})
    double = c.jit(lambda a: a * 2, slice=s, in_specs=P("x"), out_specs=P("x"))
    shift = c.jit(lambda a: a - 1, slice=s, in_specs=P("x"), out_specs=P("x"))
    x = np.arange(4, dtype=np.float32)
    y, want = c.put(x, s, P("x")), x
    for i in range(60):
        fn, local = (double, lambda a: a * 2) if i % 3 else (shift, lambda a: a - 1)
        y, want = fn(y), local(want)  # each intermediate dropped: released after its reader
    gc.collect()
    np.testing.assert_array_equal(y.numpy(), want)
    live = {b["id"] for b in c.buffers()}  # a blocking call: every release has been sent
    assert y.id in live and len(live) <= 3, live


def test_programs_and_calls_queue_together(c):
    sa, sb = c.slice({"x": 1}, island="a"), c.slice({"x": 1}, island="b")
    f = c.jit(lambda v: v * 3, slice=sa)
    g = c.jit(lambda v: v + 2, slice=sb)

    @c.program
    def both(v):
        return g(f(v))

    x = c.put(np.arange(4, dtype=np.float32), sa)
    outs = []
    y = x
    for _ in range(10):
        y = both(y)  # a run
        y = f(y)  # a call reading the run's output, on the other island
        outs.append(y)
    want = np.arange(4, dtype=np.float32)
    for _ in range(10):
        want = (want * 3 + 2) * 3
    np.testing.assert_array_equal(outs[-1].numpy(), want)
    assert outs[0].shape == (4,) and outs[0].slice_id == sa.id  # known before anything ran


def test_an_id_released_and_named_again_in_one_batch_holds_its_new_value(c):
    """A release's delete may leave later than the release (coalesced with the turn's), but
    never after a request that writes the same id again."""
    s = c.slice({"x": 1})
    x = f"{c.id}.{'ab' * 16}"

    def put(value):
        data = base64.b64encode(np.full(4, value, np.float32).tobytes()).decode()
        return {"op": "put", "id": x, "slice_id": s.id, "dtype": "float32", "shape": [4], "spec": [],
                "data": data}

    ops = [put(1.0), {"op": "release", "ids": [x]}, put(2.0)]
    assert c.raw_json("POST", "/v1/batch", json={"ops": ops, "wait": x})["failed"] == []
    data = c.raw_request("GET", f"/v1/buffers/{x}/data").content
    np.testing.assert_array_equal(np.frombuffer(data, np.float32), np.full(4, 2.0, np.float32))


def test_a_client_chooses_ids_only_in_its_own_part_of_the_namespace(connect):
    """An id in use answers 409 only for the chooser's own buffer: another tenant's id is
    refused for its form, the same whether that tenant holds it or not, and what it holds
    is untouched."""
    alice, bob = connect("alice"), connect("bob")
    sa, sb = alice.slice({"x": 1}), bob.slice({"x": 1})
    xa = alice.put(np.arange(4, dtype=np.float32), sa).result()
    xb = bob.put(np.ones(4, np.float32), sb).result()
    assert xa.id.startswith(f"{alice.id}.") and xb.id.startswith(f"{bob.id}.")

    def put(who, s, ident):
        data = base64.b64encode(np.zeros(4, np.float32).tobytes()).decode()
        op = {"op": "put", "id": ident, "slice_id": s.id, "dtype": "float32", "shape": [4], "spec": [],
              "data": data}
        return who.raw_json("POST", "/v1/batch", json={"ops": [op]})["failed"]

    unheld = f"{alice.id}.{'cd' * 16}"
    held, free = put(bob, sb, xa.id), put(bob, sb, unheld)
    assert [f["status"] for f in held] == [400] and f"'{bob.id}.'; got '{xa.id}'" in held[0]["detail"]
    assert [f["status"] for f in free] == [400]
    assert held[0]["detail"].replace(xa.id, "ID") == free[0]["detail"].replace(unheld, "ID")
    [mine] = put(bob, sb, xb.id)
    assert mine["status"] == 409 and xb.id in mine["detail"]
    np.testing.assert_array_equal(xa.numpy(), np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(xb.numpy(), np.ones(4, np.float32))


def test_refusals_and_the_causes_kept_for_their_ids_stay_short(c):
    """A put refused for a spec of 100 000 names, then 300 calls each reading the previous
    one's refused output: every failure names its cause, and neither the answer nor what the
    server keeps per id grows with the spec or along the chain."""
    s = c.slice({"x": 1})
    inc = c.jit(lambda v: v + 1, slice=s)
    inc(np.zeros(4, np.float32)).result()
    comp = inc.registrations[0]
    ids = [f"{c.id}.chain-{k:06d}" for k in range(301)]
    ops = [{"op": "put", "id": ids[0], "slice_id": s.id, "dtype": "float32", "shape": [4],
            "spec": [["x"] * 100_000], "data": base64.b64encode(bytes(16)).decode()}]
    ops += [{"op": "call", "computation_id": comp, "inputs": [ids[k]], "ids": [ids[k + 1]]}
            for k in range(300)]
    answer = c.raw_request("POST", "/v1/batch", json={"ops": ops})
    failed = answer.json()["failed"]
    assert [f["index"] for f in failed] == list(range(301))
    assert "spec" in failed[0]["detail"] and "characters left out" in failed[0]["detail"]
    assert f"buffer {ids[-2]} was never made" in failed[-1]["detail"]
    assert len(answer.content) < 2_000_000, len(answer.content)
    assert max(len(f["detail"]) for f in failed) <= 8100


def test_an_id_released_while_queued_work_reads_it_is_not_chosen_again_until_that_work_has_run(
        shared_servers):
    """Its delete waits for the work queued on it: a new value under the same id would be
    queued among that work, and freed by the delete numbered after it. So the id is refused
    (409) until then, and holds a new value after (one submission in flight per island)."""
    from servers import WINDOW_1

    import client as isthmus

    address, token = shared_servers(WINDOW_1)
    with isthmus.connect(address, token=token, name="reuse") as c:
        s = c.slice({"x": 1})
        slow = c.jit(lambda m: jnp.tanh(m @ m) @ m, slice=s)
        m = c.put(np.full((256, 256), 1e-3, np.float32), s)
        slow(m).result()
        (computation,) = slow.registrations
        x = f"{c.id}.reused_id_0001"

        def put(value):
            data = base64.b64encode(np.full((256, 256), value, np.float32).tobytes()).decode()
            return {"op": "put", "id": x, "slice_id": s.id, "dtype": "float32", "shape": [256, 256],
                    "spec": [], "data": data}

        def call(inputs, out):
            return {"op": "call", "computation_id": computation, "inputs": inputs, "ids": [f"{c.id}.{out}"]}

        ops = [put(1.0), *(call([m.id], f"filler{i:04d}") for i in range(8)), call([x], "reads_old"),
               {"op": "release", "ids": [x]}, put(2.0)]
        failed = c.raw_json("POST", "/v1/batch", json={"ops": ops})["failed"]
        assert [f["index"] for f in failed] == [len(ops) - 1] and "was released" in str(failed), failed
        old = c.raw_request("GET", f"/v1/buffers/{c.id}.reads_old/data").content
        want = jax.jit(lambda v: jnp.tanh(v @ v) @ v)(np.ones((256, 256), np.float32))
        np.testing.assert_allclose(np.frombuffer(old, np.float32).reshape(256, 256), want, rtol=1e-5)
        assert c.raw_json("POST", "/v1/batch", json={"ops": [put(3.0)], "wait": x})["failed"] == []
        data = c.raw_request("GET", f"/v1/buffers/{x}/data").content
        np.testing.assert_array_equal(np.frombuffer(data, np.float32), np.full(256 * 256, 3.0, np.float32))


def test_a_pytree_is_waited_for_and_fetched_in_a_few_requests(c):
    """`jax.block_until_ready(tree)` waits leaf by leaf, and `jax.device_get(tree)` asks
    every leaf to copy itself to the host before reading any: the session answers the rest
    of the leaves from one wait that asks their states, and fetches them together."""
    s = c.slice({"x": 2})
    tree = {f"layer{i}": {"w": np.full(3, i, np.float32), "b": np.int32(i)} for i in range(300)}
    sent = c.requests_sent
    t = jax.block_until_ready(c.put(tree, s))
    assert c.requests_sent - sent < 10, c.requests_sent - sent
    f = c.jit(lambda t: jax.tree.map(lambda v: v * 2 + 1, t), slice=s)
    jax.block_until_ready(f(t))  # registered and compiled
    sent = c.requests_sent
    y = jax.block_until_ready(f(t))
    got = jax.device_get(y)
    assert c.requests_sent - sent < 10, c.requests_sent - sent
    want = jax.device_get(jax.jit(lambda t: jax.tree.map(lambda v: v * 2 + 1, t))(tree))
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype
    # a leaf freed with its slice among those asked for raises its own error; the rest read
    gone = c.slice({"x": 1})
    lost, kept = c.put(np.ones(2, np.float32), gone), f(t)
    gone.delete()
    jax.block_until_ready(kept)
    for leaf in [lost, *jax.tree.leaves(kept)]:
        leaf.copy_to_host_async()
    with pytest.raises(isthmus.NotFound, match="freed with its slice"):
        lost.numpy()
    np.testing.assert_array_equal(jax.device_get(kept)["layer7"]["w"], np.full(3, 15, np.float32))
