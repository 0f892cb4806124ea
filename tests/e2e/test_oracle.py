"""Every computation through Isthmus equals `jax.jit` of the same function run locally."""

import gc

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from client.demo import adam_step, init_mlp, init_state
from ir import InvalidArgument

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def local_mesh(shape, names):
    return jax.make_mesh(shape, names, devices=jax.devices()[: int(np.prod(shape))])


def test_matmul_tanh_on_a_2x2_slice_is_bit_exact(c):
    s = c.slice({"data": 2, "model": 2})

    def layer(w, x):
        return jnp.tanh(x @ w)

    in_specs, out_specs = (P(None, "model"), P("data", None)), P("data", None)
    f = c.jit(layer, slice=s, in_specs=in_specs, out_specs=out_specs)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((16, 8), dtype=np.float32)
    x = rng.standard_normal((8, 16), dtype=np.float32)
    y = f(w, x)
    assert y.shape == (8, 8) and y.dtype == np.float32 and y.sharding.spec == P("data", None)

    mesh = local_mesh((2, 2), ("data", "model"))
    oracle = jax.jit(layer, in_shardings=tuple(NamedSharding(mesh, s) for s in in_specs),
                     out_shardings=NamedSharding(mesh, out_specs))
    np.testing.assert_array_equal(y.numpy(), np.asarray(oracle(w, x)))


def test_reduction_with_a_collective_over_4_devices(c):
    s = c.slice({"x": 4})

    def total(v):
        return jnp.sum(v * v, axis=0), jnp.max(v)

    f = c.jit(total, slice=s, in_specs=P("x"), out_specs=P())
    v = np.arange(64, dtype=np.float32).reshape(16, 4) / 7
    got = f(v)
    mesh = local_mesh((4,), ("x",))
    want = jax.jit(total, in_shardings=NamedSharding(mesh, P("x")),
                   out_shardings=NamedSharding(mesh, P()))(v)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g.numpy(), np.asarray(w))


def test_explicit_psum_in_shard_map(c):
    s = c.slice({"x": 4})

    def summed(mesh):
        return jax.shard_map(lambda b: jax.lax.psum(b, "x"), mesh=mesh, in_specs=P("x"),
                             out_specs=P())

    g = c.jit(summed(s.abstract_mesh), slice=s, in_specs=P("x"), out_specs=P())
    v = np.arange(8, dtype=np.float32)
    mesh = local_mesh((4,), ("x",))
    want = jax.jit(summed(mesh))(jax.device_put(v, NamedSharding(mesh, P("x"))))
    np.testing.assert_array_equal(g(v).numpy(), np.asarray(want))


def test_mlp_training_step_with_value_and_grad_and_nested_state(c):
    rng = np.random.default_rng(1)
    state = init_state(init_mlp(rng, [8, 16, 1]))
    x = rng.standard_normal((32, 8), dtype=np.float32)
    y = np.sin(x.sum(axis=1, keepdims=True))

    s = c.slice({"data": 2})
    step = c.jit(adam_step, slice=s, in_specs=(P(), P("data"), P("data")), out_specs=P())
    local = jax.jit(adam_step)
    remote_state, local_state = state, state
    for _ in range(3):
        remote_state, remote_loss = step(remote_state, x, y)
        local_state, local_loss = local(local_state, x, y)
        np.testing.assert_allclose(remote_loss.numpy(), np.asarray(local_loss), rtol=1e-6)
    got = jax.tree.map(lambda b: b.numpy(), remote_state)
    jax.tree.map(lambda g, w: np.testing.assert_allclose(g, np.asarray(w), rtol=1e-5, atol=1e-6),
                 got, local_state)


def test_while_loop_and_cond_inside_a_computation(c):
    s = c.slice({"x": 2})

    def collatz_steps(n):
        def body(carry):
            k, steps = carry
            k = jax.lax.cond(k % 2 == 0, lambda k: k // 2, lambda k: 3 * k + 1, k)
            return k, steps + 1

        return jax.lax.while_loop(lambda c: c[0] > 1, body, (n, jnp.int32(0)))[1]

    f = c.jit(jax.vmap(collatz_steps), slice=s, in_specs=P("x"), out_specs=P("x"))
    n = np.array([6, 7, 27, 97], dtype=np.int32)
    np.testing.assert_array_equal(f(n).numpy(), np.asarray(jax.jit(jax.vmap(collatz_steps))(n)))


def test_zero_size_values_free_cleanly_and_compute_as_in_jax(c):
    """A client holding only zero-size buffers frees two: the second free found no entry
    left for the client in the machine's pool, and the batch carrying the releases failed
    with a 500, calls in it too. Then zero-size arrays in and out, as `jax.jit` gives them."""
    s = c.slice({"x": 1})
    empties = [c.put(np.zeros((0, 3), np.float32), s) for _ in range(2)]  # all the client holds
    for e in empties:
        assert e.numpy().shape == (0, 3)
    del empties, e
    gc.collect()
    c.flush()  # the releases reach the server (the batch failed here)
    assert c.buffers() == []

    f = c.jit(lambda e: (e * 2).sum(axis=0), slice=s)
    want = jax.jit(lambda e: (e * 2).sum(axis=0))(np.zeros((0, 3), np.float32))
    got = f(np.zeros((0, 3), np.float32)).numpy()
    np.testing.assert_array_equal(got, np.asarray(want))
    assert got.dtype == want.dtype and got.shape == want.shape == (3,)
    np.testing.assert_array_equal(f(np.ones((2, 3), np.float32)).numpy(), np.full(3, 4.0, np.float32))


def test_an_integer_input_s_gradient_feeds_another_function_as_in_jax(c):
    """A float0 gradient (no data) passed on, directly and inside a program, as `jax.jit`
    takes it; a string that is no static argument is named, as `jax.jit` names it."""
    s = c.slice({"x": 1})

    def grads(v, n):
        return jax.grad(lambda v, n: (v * n).sum(), argnums=(0, 1), allow_int=True)(v, n)

    def use(gr):
        return gr[0] * 2 + gr[1].size

    g, h = c.jit(grads, slice=s), c.jit(use, slice=s)
    x = np.arange(4, dtype=np.float32)
    want = np.asarray(jax.jit(use)(jax.jit(grads)(x, np.int32(2))))
    gr = g(x, np.int32(2))
    assert gr[1].dtype == jax.dtypes.float0
    np.testing.assert_array_equal(h(gr).numpy(), want)
    np.testing.assert_array_equal(c.program(lambda v, n: h(g(v, n)))(x, np.int32(2)).numpy(), want)
    with pytest.raises(InvalidArgument, match=r"argument args\[1\] is a str \('abc'\), not an array"):
        c.jit(lambda v, mode: v, slice=s)(x, "abc")
