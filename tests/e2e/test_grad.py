"""`isthmus.value_and_grad` / `grad` inside `@c.program`: a model whose layers live on islands
a and b, differentiated on the hosts in the same run, equal to `jax.value_and_grad` of the
same composition run locally (loops unrolled there with the same trip count, branches as
`jax.lax.cond`); pytrees, argnums, has_aux, an optimizer step in the same program; an
integer input's float0 gradient (allow_int); branches, loops (a zero-trip one, a
data-dependent count, an invariant read by every iteration), nested loops and a branch in a
loop and a loop in a branch, across islands, with nothing left on the hosts after; what
cannot be differentiated is named."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hosts_settled import host_rows

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
TOL = {"rtol": 1e-5, "atol": 1e-6}  # forward-with-residuals artifacts and summation order: an ulp


def layer(w, x):
    return jnp.tanh(x @ w["kernel"] + w["bias"])


def head(v, h, y):
    return jnp.mean((h @ v - y) ** 2)


def loss_of(params, x, y):
    return head(params["head"], layer(params["layer"], x), y)


def data():
    rng = np.random.default_rng(0)
    params = {"layer": {"kernel": rng.standard_normal((8, 16)).astype(np.float32) * 0.3,
                        "bias": np.zeros(16, np.float32)},
              "head": rng.standard_normal((16, 2)).astype(np.float32) * 0.3}
    x, y = rng.standard_normal((4, 8)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    return params, x, y


@pytest.fixture
def model(c):
    sa, sb = c.slice({"x": 2}, island="a"), c.slice({"y": 2}, island="b")
    f = c.jit(layer, slice=sa, name="layer")
    g = c.jit(head, slice=sb, name="head")

    def loss(params, x, y):  # layer on island a, its activations moved to island b for the head
        return g(params["head"], f(params["layer"], x), y)

    return loss


def assert_trees_close(got, want):
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)


def assert_equals_jax(step, local, argnums, *args):
    """`step(*args)`'s value and gradients equal `jax.value_and_grad(local, argnums)` here."""
    value, grads = step(*args)
    want_value, want_grads = jax.value_and_grad(local, argnums=argnums)(*args)
    np.testing.assert_allclose(value.numpy(), want_value, **TOL)
    assert_trees_close(jax.device_get(grads), want_grads)


def test_value_and_grad_across_islands_equals_jax(c, model):
    params, x, y = data()
    step = c.program(lambda p, x, y: isthmus.value_and_grad(model)(p, x, y))
    assert_equals_jax(step, loss_of, 0, params, x, y)


def test_grad_in_two_arguments_with_aux_and_an_sgd_step_in_one_program(c, model):
    params, x, y = data()

    def with_aux(p, x, y):
        return model(p, x, y), x

    @c.program
    def step(p, x, y):
        (grads_p, grads_x), aux = isthmus.grad(with_aux, argnums=(0, 1), has_aux=True)(p, x, y)
        return grads_p, grads_x, aux

    grads_p, grads_x, aux = step(params, x, y)
    want_p, want_x = jax.grad(loss_of, argnums=(0, 1))(params, x, y)
    assert_trees_close(jax.device_get(grads_p), want_p)
    np.testing.assert_allclose(grads_x.numpy(), want_x, **TOL)
    np.testing.assert_array_equal(aux.numpy(), x)


def test_an_integer_input_has_a_float0_gradient_with_allow_int(c):
    s = c.slice({"x": 1}, island="b")
    scaled = c.jit(lambda w, k: jnp.sum(jnp.sin(w) * k), slice=s)
    w, k = np.linspace(0, 1, 5, dtype=np.float32), np.int32(3)
    step = c.program(lambda w, k: isthmus.value_and_grad(scaled, argnums=(0, 1), allow_int=True)(w, k))
    value, (grad_w, grad_k) = step(w, k)
    want_value, (want_w, want_k) = jax.value_and_grad(lambda w, k: jnp.sum(jnp.sin(w) * k), argnums=(0, 1),
                                                      allow_int=True)(w, k)
    np.testing.assert_allclose(value.numpy(), want_value, **TOL)
    np.testing.assert_allclose(grad_w.numpy(), want_w, **TOL)
    assert grad_k.dtype == want_k.dtype == jax.dtypes.float0 and grad_k.shape == ()


def branches(c, jit=None):
    """A loss through a cond whose branches run on islands a and b, the true one holding a
    cond of its own; with `jit=None`, the same functions run locally under `jax.lax.cond`."""
    sa, sb = (None, None) if jit is None else (c.slice({"x": 2}, island="a"), c.slice({"y": 2}, island="b"))
    on = (lambda fn, s, name: fn) if jit is None else (lambda fn, s, name: jit(fn, slice=s, name=name))
    cond = jax.lax.cond if jit is None else isthmus.cond
    positive = on(lambda w, x: jnp.sum(x @ w) > 0, sa, "positive")
    big = on(lambda h: jnp.max(h) > 0.5, sb, "big")
    left = on(lambda w, x: jnp.sin(x @ w), sa, "left")
    right = on(lambda w, x: jnp.tanh(x @ w) * 2.0, sb, "right")
    square = on(lambda h: h * h, sb, "square")
    total = on(lambda h, w: jnp.sum(h ** 2) + jnp.sum(w), sa, "total")

    def taken(w, x):
        h = right(w, x)
        return cond(big(h), square, lambda h: h, h)

    def loss(w, x):
        return total(cond(positive(w, x), taken, left, w, x), w)

    return loss


def test_a_cond_s_gradient_is_the_taken_branch_s_across_islands_and_nested(c):
    loss, local = branches(c, c.jit), branches(c)
    step = c.program(lambda w, x: isthmus.value_and_grad(loss)(w, x))
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    seen = set()
    for scale in (1.0, -1.0, 0.01):  # the true branch with its inner one each way, the false one
        x = (scale * np.abs(rng.standard_normal((2, 8)))).astype(np.float32) * np.sign(w.sum(1))
        assert_equals_jax(step, local, 0, w, x)
        positive = bool(jnp.sum(x @ w) > 0)
        seen.add((positive, positive and bool(jnp.max(jnp.tanh(x @ w) * 2.0) > 0.5)))
    assert seen == {(True, True), (True, False), (False, False)}


@pytest.mark.parametrize("remat", [False, True])
def test_a_fori_loop_rnn_s_gradient_runs_its_steps_backwards_across_islands(c, remat):
    """With `remat`, each iteration saves its carry, and the backward computes the cell's
    residuals again from it: the same gradient."""
    sa, sb = c.slice({"x": 2}, island="a"), c.slice({"y": 2}, island="b")
    cell = lambda w, h: jnp.tanh(h @ w["kernel"] + w["bias"])  # noqa: E731
    head = lambda v, h: jnp.sum((h @ v) ** 2)  # noqa: E731
    on_a, on_b = c.jit(cell, slice=sa, name="cell"), c.jit(head, slice=sb, name="head")

    def loss(w, v, h):  # the recurrence on island a, its last state's loss on island b
        return on_b(v, isthmus.fori_loop(0, 6, lambda i, h: on_a(w, h), h, remat=remat))

    def local(w, v, h):
        for _ in range(6):
            h = cell(w, h)
        return head(v, h)

    rng = np.random.default_rng(2)
    w = {"kernel": rng.standard_normal((8, 8)).astype(np.float32) * 0.5, "bias": np.zeros(8, np.float32)}
    v, h = rng.standard_normal((8, 3)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)
    step = c.program(lambda w, v, h: isthmus.value_and_grad(loss, argnums=(0, 1, 2))(w, v, h))
    assert_equals_jax(step, local, (0, 1, 2), w, v, h)
    assert_nothing_held(c)


def assert_nothing_held(c):
    """No run, frame or stacked value left on any host once the runs have ended."""
    for name, h in host_rows(c).items():
        assert (h["runs"], h["frames"], h["stacked"], h["stack_bytes"]) == (0, 0, 0, 0), (name, h)


def test_a_while_loop_s_gradient_follows_its_data_dependent_trip_count(c):
    s, t = c.slice({"x": 2}, island="a"), c.slice({"y": 2}, island="b")
    tilt, squash = (lambda w, y: y * w), (lambda y: jnp.tanh(y) * 0.9)
    shrink = lambda w, y: squash(tilt(w, y))  # noqa: E731
    big = c.jit(lambda y: jnp.sum(y ** 2) > 1.0, slice=s, name="big")
    on_s, on_t = c.jit(tilt, slice=s, name="tilt"), c.jit(squash, slice=t, name="squash")
    total = c.jit(lambda y: jnp.sum(jnp.sin(y)), slice=s)

    def loss(w, y):  # an iteration crosses a -> b -> a; w, read by each, sums their gradients
        return total(isthmus.while_loop(big, lambda y: on_t(on_s(w, y)), y))

    step = c.program(lambda w, y: isthmus.value_and_grad(loss, argnums=(0, 1))(w, y))
    rng, counts = np.random.default_rng(3), []
    for scale in (3.0, 0.1):  # several trips, and none
        w = rng.uniform(0.8, 1.2, 6).astype(np.float32)
        y = (scale * rng.standard_normal(6)).astype(np.float32)
        trips, z = 0, y
        while np.sum(z ** 2) > 1.0:
            z, trips = np.asarray(shrink(w, z)), trips + 1

        def local(w, y, trips=trips):
            for _ in range(trips):
                y = shrink(w, y)
            return jnp.sum(jnp.sin(y))

        assert_equals_jax(step, local, (0, 1), w, y)
        counts.append(trips)
    assert counts[0] > 2 and counts[1] == 0, counts  # several trips, and a zero-trip loop
    assert_nothing_held(c)


@pytest.mark.parametrize("remat", [False, True])
def test_nested_loops_and_a_branch_in_a_loop_across_islands(c, remat):
    """With `remat` on the outer loop, its backward runs the branch's and the inner loop's
    forward again (their saves pushed and popped within one backward iteration)."""
    sa, sb = c.slice({"x": 2}, island="a"), c.slice({"y": 2}, island="b")
    fa = lambda w, h: jnp.tanh(h @ w)  # noqa: E731
    fb = lambda w, h: jnp.sin(h @ w) * 0.8  # noqa: E731
    on_a, on_b = c.jit(fa, slice=sa, name="fa"), c.jit(fb, slice=sb, name="fb")
    positive = c.jit(lambda h: jnp.sum(h) > 0, slice=sa, name="positive")
    total = c.jit(lambda h: jnp.sum(h ** 2), slice=sa, name="total")
    inc = c.jit(lambda i: i + 1, slice=sa, name="inc")

    def loss(wa, wb, h):  # per outer step: a branch on island a or b, then i + 1 inner steps
        def outer(i, h):
            h = isthmus.cond(positive(h), lambda h: on_b(wb, h), lambda h: on_a(wa, h), h)
            return isthmus.fori_loop(0, inc(i), lambda j, h: on_a(wa, h), h)

        return total(isthmus.fori_loop(0, 3, outer, h, remat=remat))

    def local(wa, wb, h):
        for i in range(3):
            h = jax.lax.cond(jnp.sum(h) > 0, lambda h: fb(wb, h), lambda h: fa(wa, h), h)
            for _ in range(i + 1):
                h = fa(wa, h)
        return jnp.sum(h ** 2)

    rng = np.random.default_rng(4)
    wa, wb = (rng.standard_normal((5, 5)).astype(np.float32) * 0.6 for _ in range(2))
    step = c.program(lambda wa, wb, h: isthmus.value_and_grad(loss, argnums=(0, 1, 2))(wa, wb, h))
    for sign in (1.0, -1.0):
        h = sign * np.abs(rng.standard_normal((2, 5))).astype(np.float32)
        assert_equals_jax(step, local, (0, 1, 2), wa, wb, h)
    assert_nothing_held(c)


def test_a_loop_in_a_branch_is_differentiated_when_taken_and_leaves_nothing_when_not(c):
    sa, sb = c.slice({"x": 2}, island="a"), c.slice({"y": 2}, island="b")
    fa = lambda w, h: jnp.tanh(h * w)  # noqa: E731
    on_a, on_b = c.jit(fa, slice=sa, name="fa"), c.jit(lambda h: jnp.sin(h) * 0.5, slice=sb, name="fb")
    positive = c.jit(lambda h: jnp.sum(h) > 0, slice=sa, name="positive")
    total = c.jit(jnp.sum, slice=sa, name="total")

    def loss(w, h):  # the taken branch loops 3 times on island a; the other calls island b
        return total(isthmus.cond(positive(h), lambda h: isthmus.fori_loop(0, 3, lambda i, h: on_a(w, h), h),
                                  on_b, h))

    def local(w, h):
        def looped(h):
            for _ in range(3):
                h = fa(w, h)
            return h

        return jnp.sum(jax.lax.cond(jnp.sum(h) > 0, looped, lambda h: jnp.sin(h) * 0.5, h))

    step = c.program(lambda w, h: isthmus.value_and_grad(loss, argnums=(0, 1))(w, h))
    w = np.linspace(0.5, 1.5, 6, dtype=np.float32)
    for sign in (1.0, -1.0):
        h = sign * np.linspace(0.1, 1.0, 6, dtype=np.float32)
        assert_equals_jax(step, local, (0, 1), w, h)
    assert_nothing_held(c)


def test_what_cannot_be_differentiated_is_named(c, model):
    s = c.slice({"x": 1}, island="a")
    twice = c.jit(lambda v: v * 2, slice=s)
    with pytest.raises(isthmus.InvalidArgument, match=r"the loss must be a scalar.*float32\[3\]"):
        c.program(lambda v: isthmus.grad(lambda u: twice(u))(v))(np.ones(3, np.float32))
    with pytest.raises(isthmus.InvalidArgument, match="must return one scalar"):
        c.program(lambda v: isthmus.grad(lambda u: (twice(u), twice(u)))(v))(np.ones(3, np.float32))
    with pytest.raises(isthmus.InvalidArgument, match=r"requires real- or complex-valued inputs.*allow_int"):
        c.program(lambda n: isthmus.grad(lambda k: c.jit(lambda m: (m * 1.0).sum(), slice=s)(k))(n))(
            np.arange(3, dtype=np.int32))
    # JAX's own while_loop inside a jitted function has no reverse mode (isthmus.while_loop has)
    halving = c.jit(lambda v: jax.lax.while_loop(lambda u: u.sum() > 1.0, lambda u: u / 2, v), slice=s,
                    name="halving")
    total = c.jit(jnp.sum, slice=s)
    with pytest.raises(isthmus.InvalidArgument, match=r"halving cannot be differentiated: ValueError: "
                                                       r"Reverse-mode differentiation does not work for "
                                                       r"lax.while_loop"):
        c.program(lambda v: isthmus.grad(lambda u: total(halving(u)))(v))(np.ones(3, np.float32))
    with pytest.raises(isthmus.InvalidArgument, match=r"call it inside a @c\.program"):
        isthmus.grad(lambda u: u)(np.ones(3, np.float32))
