"""Buffers are futures: returned before the work is done, chained without being fetched,
freed when dropped, failed (never hung) when their producer fails."""

import base64
import gc

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from polling import until

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_a_future_feeds_a_second_call_without_being_fetched(c):
    s = c.slice({"x": 2})
    double = c.jit(lambda a: a * 2, slice=s, in_specs=P("x"), out_specs=P("x"))
    shift = c.jit(lambda a: a - 1, slice=s, in_specs=P("x"), out_specs=P("x"))
    x = np.arange(6, dtype=np.float32)
    y = double(x)
    assert y.shape == (6,) and y.dtype == np.float32  # known before any fetch
    z = shift(y)
    np.testing.assert_array_equal(z.numpy(), x * 2 - 1)
    assert y.ready() and z.result() is z


def test_a_chain_of_100_collective_calls(c):
    """Back-to-back sharded programs with a collective each: the executor's dispatch keeps
    XLA's CPU collectives from overlapping, so this neither deadlocks nor drifts."""
    s = c.slice({"x": 4})

    def step(v):
        return v + jnp.mean(v) * 0 + 1.0  # the mean is an all-reduce over the slice

    f = c.jit(step, slice=s, in_specs=P("x"), out_specs=P("x"))
    y = c.put(np.zeros(8, np.float32), s, P("x"))
    for _ in range(100):
        y = f(y)
    np.testing.assert_array_equal(y.numpy(), np.full(8, 100, np.float32))
    oracle = jax.jit(step)
    want = np.zeros(8, np.float32)
    for _ in range(100):
        want = oracle(want)
    np.testing.assert_array_equal(y.numpy(), np.asarray(want))


def test_a_future_moves_between_slices_on_different_islands(c):
    sa = c.slice({"x": 2}, island="a")
    sb = c.slice({"x": 4}, island="b")
    produce = c.jit(lambda a: a + 1, slice=sa, in_specs=P("x"), out_specs=P("x"))
    consume = c.jit(lambda a: a * 3, slice=sb, in_specs=P("x"), out_specs=P())
    y = produce(np.arange(8, dtype=np.float32))
    z = consume(y)  # y travels host to host through Ray's object store, not through the server
    np.testing.assert_array_equal(z.numpy(), (np.arange(8) + 1) * 3)


def test_dropped_buffers_are_freed_and_close_frees_everything(connect):
    c = connect()
    s = c.slice({"x": 1})
    inc = c.jit(lambda a: a + 1, slice=s)
    kept = c.put(np.float32(0), s)
    y = kept
    for _ in range(10):
        y = inc(y)
    gc.collect()
    inc(y)  # any call carries the releases of the futures dropped so far
    live = {b["id"] for b in c.buffers()}
    assert kept.id in live and y.id in live
    assert len(live) <= 4, live  # not the 10 dropped intermediates
    c.close()
    other = connect()
    with pytest.raises(isthmus.NotFound):
        other.raw_json("GET", f"/v1/buffers/{kept.id}")


MISSING_KERNEL = "tpu_custom_call"  # a stable custom-call target with no handler on CPU hosts


def missing_kernel_artifact(mesh, shape) -> bytes:
    """An artifact the server accepts (its custom call is one of jax.export's stable targets)
    but no CPU host can compile: the kernel has no handler there."""
    rep = jax.NamedSharding(mesh, P())

    def fn(a):
        return (jax.ffi.ffi_call(MISSING_KERNEL, jax.ShapeDtypeStruct(a.shape, a.dtype))(a),)

    jitted = jax.jit(fn, in_shardings=(rep,), out_shardings=(rep,))
    exported = jax.export.export(jitted, platforms=["cpu"])
    return exported(jax.ShapeDtypeStruct(shape, jnp.float32)).serialize()


def test_a_failed_computation_fails_its_dependents_with_the_same_cause(c):
    s = c.slice({"x": 2})
    f = c.jit(lambda a: a + 1, slice=s, in_specs=P(), out_specs=P())
    artifact = missing_kernel_artifact(s.abstract_mesh, (4,))
    body = {"slice_id": s.id, "artifact": base64.b64encode(artifact).decode(),
            "in_specs": [[]], "out_specs": [[]], "name": "missing-kernel"}
    bad = c.raw_json("POST", "/v1/computations", json=body)
    x = c.put(np.zeros(4, np.float32), s)
    try:
        out = c.raw_call(bad["id"], [x.id])[0]
    except isthmus.Conflict as e:  # compiling had already failed: the call is refused at once
        assert MISSING_KERNEL in str(e)
        return
    then = f(out)
    with pytest.raises(isthmus.RemoteError, match=MISSING_KERNEL) as first:
        out.result()
    with pytest.raises(isthmus.RemoteError) as second:
        then.numpy()
    cause = str(first.value).split(": ", 1)[1]
    assert str(second.value).split(": ", 1)[1] == cause
    # The compile's own answer reaches the server's record on another path than the run's
    # failure: it may land just after the client has seen the failure.
    until(lambda: c.raw_json("GET", f"/v1/computations/{bad['id']}")["status"] == "failed", 30,
          f"computation {bad['id']} marked failed")


def test_specs_that_contradict_the_artifact_are_refused_by_name(c):
    s = c.slice({"x": 2})
    rep = jax.NamedSharding(s.abstract_mesh, P())
    fn = jax.jit(lambda a: (a + 1,), in_shardings=(rep,), out_shardings=(rep,))
    exported = jax.export.export(fn, platforms=["cpu"])(jax.ShapeDtypeStruct((4,), jnp.float32))
    body = {"slice_id": s.id, "artifact": base64.b64encode(exported.serialize()).decode(),
            "in_specs": [["x"]], "out_specs": [[]], "name": "mis-declared"}
    with pytest.raises(isthmus.InvalidArgument, match=r"in_specs\[0\]: declared P\('x'\), but the artifact"):
        c.raw_json("POST", "/v1/computations", json=body)


def test_an_artifact_exported_by_hand_over_pytrees_runs_on_its_flat_leaves(c):
    """`jax.export` of any jitted function, as the REST API takes it: one array in and out
    (no tuple), or dicts; a call's inputs and outputs are its flat leaves."""
    s = c.slice({"x": 2})
    named = jax.NamedSharding(s.abstract_mesh, P("x"))
    def one(v):
        return jnp.sin(v) * 2

    def two(d):
        return {"a": d["p"] + 1, "b": d["q"] * 2}

    cases = [
        (one, jax.jit(one, in_shardings=named, out_shardings=named),
         [jax.ShapeDtypeStruct((4,), jnp.float32)], [["x"]], [["x"]]),
        (two, jax.jit(two, in_shardings=jax.NamedSharding(s.abstract_mesh, P()),
                      out_shardings=jax.NamedSharding(s.abstract_mesh, P())),
         [{"p": jax.ShapeDtypeStruct((2,), jnp.float32), "q": jax.ShapeDtypeStruct((3,), jnp.float32)}],
         [[], []], [[], []]),
    ]
    for local, fn, args, ins, outs in cases:
        artifact = jax.export.export(fn, platforms=["cpu"])(*args).serialize()
        body = {"slice_id": s.id, "artifact": base64.b64encode(artifact).decode(),
                "in_specs": ins, "out_specs": outs, "name": "by-hand"}
        comp = c.raw_json("POST", "/v1/computations", json=body)
        leaves = [np.arange(a.shape[0], dtype=np.float32) + 1 for a in jax.tree_util.tree_leaves(args)]
        inputs = [c.put(x, s, P(*spec)) for x, spec in zip(leaves, ins, strict=True)]
        got = [b.numpy() for b in c.raw_call(comp["id"], [b.id for b in inputs])]
        tree = jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(args), leaves)
        want = jax.tree_util.tree_leaves(jax.jit(local)(*tree))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, np.asarray(w), rtol=1e-6)


def test_the_server_answers_without_a_client_library(server):
    token = (server.state_dir / "token").read_text().strip()
    r = httpx.get(f"{server.address}/v1/devices", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200 and len(r.json()) == 16


def test_dropping_a_buffer_of_a_deleted_slice_breaks_nothing(c):
    s, t = c.slice({"x": 1}), c.slice({"x": 1})
    x = c.put(np.zeros(2, np.float32), s)
    s.delete()  # frees x on the server
    del x  # its release rides on the next request
    y = c.put(np.ones(2, np.float32), t)
    np.testing.assert_array_equal(y.numpy(), np.ones(2, np.float32))
