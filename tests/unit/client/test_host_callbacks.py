import jax
import jax.numpy as jnp
import numpy as np
import pytest

from client.jit import host_callbacks

pytestmark = pytest.mark.unit


def test_callbacks_are_found_inside_branches_and_loops():
    def f(x):
        jax.debug.print("x={x}", x=x)
        y = jax.lax.cond(x.sum() > 0,
                         lambda v: jax.pure_callback(np.sin, jax.ShapeDtypeStruct(v.shape, v.dtype), v),
                         lambda v: v, x)
        return jax.lax.scan(lambda c, v: (c, jax.debug.callback(print, v)), 0.0, y)

    found = host_callbacks(jax.make_jaxpr(f)(jnp.ones(3)))
    assert found == {"debug_print", "pure_callback", "debug_callback"}


def test_a_function_without_callbacks_has_none():
    def f(x):
        return jax.lax.fori_loop(0, 3, lambda i, v: jnp.tanh(v) + i, x)

    assert host_callbacks(jax.make_jaxpr(f)(jnp.ones(3))) == set()
