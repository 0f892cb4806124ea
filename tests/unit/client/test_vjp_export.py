"""client.vjp: a computation's forward-with-residuals and backward, exported from JAX and
run back here through `jax.export.deserialize`, equal `jax.vjp` of the function: outputs,
and the cotangents of the inputs asked for, with the outputs' cotangents given or zero. A
residual that is an input or an output itself is read from there, not computed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh

from client.vjp import export_vjp
from ir import Spec

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

MESH = AbstractMesh((1,), ("x",))
R = Spec.of(())


def layer(x, w, b):
    h = jnp.tanh(x @ w + b)
    return h, jnp.sum(h * h)


def run(serialized: bytes, *args):
    return jax.export.deserialize(bytearray(serialized)).call(*args)


@pytest.mark.parametrize(("wrt", "cts"), [((False, True, True), (True, True)),
                                          ((True, True, False), (False, True))])
def test_forward_and_backward_equal_jax_vjp(wrt, cts):
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((4, 8), (8, 3), (3,)))
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype) for a in (x, w, b)]
    made = export_vjp(layer, avals, [R, R, R], [R, R], wrt, cts, MESH, "cpu")
    out = run(made.fwd, x, w, b)
    h, total = layer(x, w, b)
    np.testing.assert_allclose(out[0], h, rtol=1e-5, atol=1e-6)  # (jitted against op by op: an ulp)
    np.testing.assert_allclose(out[1], total, rtol=1e-5, atol=1e-6)
    made_here = iter(out[2:])  # the residuals the forward computes; the others are x, w, b or its outputs
    of_source = {"in": (x, w, b), "out": out[:2]}
    residuals = [next(made_here) if kind == "res" else of_source[kind][i] for kind, i in made.sources]
    assert next(made_here, None) is None
    assert [(tuple(np.shape(r)), str(np.asarray(r).dtype)) for r in residuals] == [
        (a.shape, a.dtype) for a, _ in made.residuals]
    assert any(kind == "in" for kind, _ in made.sources)  # x or w, which x @ w's pullback reads
    ct_h, ct_total = np.ones((4, 3), np.float32) * 0.5, np.float32(2.0)
    given = [c for c, on in zip((ct_h, ct_total), cts, strict=True) if on]
    grads = run(made.bwd, *residuals, *given)
    which = [i for i, on in enumerate(wrt) if on]
    values = (x, w, b)

    def of(*d):
        return layer(*[d[which.index(i)] if i in which else v for i, v in enumerate(values)])

    _, pullback = jax.vjp(of, *(values[i] for i in which))
    zeros_or = [c if on else jnp.zeros_like(c) for c, on in zip((ct_h, ct_total), cts, strict=True)]
    want = pullback(tuple(zeros_or))
    assert len(grads) == len(which)
    for got, expected in zip(grads, want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_a_mask_with_nothing_to_differentiate_is_refused():
    avals = [jax.ShapeDtypeStruct((3,), np.float32)]
    with pytest.raises(Exception, match="wrt mask over the 1 inputs"):
        export_vjp(lambda v: (v * 2,), avals, [R], [R], [False], [True], MESH, "cpu")
