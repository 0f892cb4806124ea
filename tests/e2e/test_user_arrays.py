"""A buffer answers what a `jax.Array` answers, as JAX's users use arrays, each against the
same thing done with JAX here: its properties, copies, operators, indexing, `round` and
`divmod`, `jax.numpy` taking its value, and `jax_debug_nans` on its results."""

import copy
import pickle

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from trees import same_keys

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_buffers_answer_what_jax_arrays_answer(c):
    s = c.slice({"x": 2})
    stats = c.jit(lambda v: {"mean": v.mean(), "count": jnp.int32(v.size), "v": v}, slice=s)
    out = stats(np.arange(4, dtype=np.float32))
    assert jax.block_until_ready(out) is out  # waits on each buffer, as on JAX arrays
    assert float(out["mean"]) == 1.5 and int(out["count"]) == 4 and out["mean"].item() == 1.5
    assert f"loss {out['mean']:.2f}" == "loss 1.50" and out["v"].tolist() == [0.0, 1.0, 2.0, 3.0]
    want = jnp.arange(4, dtype=jnp.float32)
    assert str(out["v"]) == str(want) and f"{out['v']}" == f"{want}"  # print(buffer) shows the value
    assert repr(out["v"]).startswith(f"Buffer({out['v'].id}, float32[4]")  # repr fetches nothing
    assert out["v"].size == 4 and out["mean"].size == 1 and out["mean"].ndim == 0
    assert sum(leaf.size for leaf in jax.tree_util.tree_leaves(out)) == 6  # as counting parameters does
    got = jax.device_get(out)
    assert isinstance(got["v"], np.ndarray) and got["v"].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert len(out["v"]) == 4  # its first dimension, nothing fetched
    with pytest.raises(TypeError, match="unsized"):
        len(out["mean"])
    assert bool(out["count"]) and not bool(c.put(np.float32(0), s))  # fetched, as for JAX arrays
    with pytest.raises(ValueError, match="ambiguous"):
        bool(out["v"])


def test_a_buffer_is_read_by_a_jitted_function_only_as_an_argument(c):
    s = c.slice({"x": 2})
    w = c.put(np.arange(4, dtype=np.float32), s)
    x = np.ones(4, np.float32)
    for closes_over in (lambda v: v * w, lambda v: jnp.dot(v, w), lambda v: v + jnp.asarray(w)):
        with pytest.raises(isthmus.InvalidArgument, match=f"closes over buffer {w.id}.*pass it as one"):
            c.jit(closes_over, slice=s)(x)
    assert not w.has_value  # nothing fetched to say so
    np.testing.assert_array_equal(c.jit(lambda v, u: v * u, slice=s)(x, w).numpy(), np.arange(4))
    with pytest.raises(isthmus.InvalidArgument, match=r"buffer .*: iteration is not done on a buffer.*numpy"):
        list(w)
    assert {w: 1}[w] == 1 and w in {w}  # a key by identity
    assert np.asarray(w).tolist() == [0.0, 1.0, 2.0, 3.0]  # fetched on purpose


def test_big_endian_arrays_keep_their_values(c):
    s = c.slice({"x": 2})
    x, i = np.arange(4, dtype=">f4"), np.arange(4, dtype=">i4")  # as read from a file, say
    doubled, incremented = c.jit(lambda v, w: (v * 2, w + 1), slice=s)(x, i)
    assert doubled.numpy().tolist() == [0.0, 2.0, 4.0, 6.0] and incremented.numpy().tolist() == [1, 2, 3, 4]
    assert c.put(x, s, P("x")).numpy().tolist() == [0.0, 1.0, 2.0, 3.0]


def test_copies_of_buffers_as_python_makes_them(c):
    s = c.slice({"x": 2})
    params = c.put({"w": np.arange(4, dtype=np.float32), "key": jax.random.key(3)}, s)
    shallow = copy.copy(params["w"])
    assert shallow is params["w"]  # immutable: shared, and dropping the copy frees nothing
    best = copy.deepcopy(params)  # a snapshot whose life is its own
    assert best["w"].id != params["w"].id
    step = c.jit(lambda p: jax.tree.map(lambda v: v + 1 if v.dtype == jnp.float32 else v, p), slice=s,
                 donate_argnums=0)
    params = step(params)  # donated: the originals are deleted
    assert best["w"].numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
    same_keys(best["key"].keys(), jax.random.key(3))
    assert params["w"].numpy().tolist() == [1.0, 2.0, 3.0, 4.0]
    value = pickle.loads(pickle.dumps(best))  # pickled as values: local arrays
    assert isinstance(value["w"], np.ndarray) and value["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    same_keys(value["key"], jax.random.key(3))


def test_round_and_index_take_a_buffer_as_they_take_a_jax_array(c):
    s = c.slice({"x": 2})
    n, v = c.put(np.int32(3), s), c.put(np.float32(2.6), s)
    assert list(range(n)) == [0, 1, 2] and [10, 11, 12, 13][n] == 13
    assert round(v) == round(jnp.asarray(2.6)) == 3 and round(v, 1) == round(jnp.float32(2.6), 1)


def test_jax_numpy_takes_a_buffer_s_value_where_it_takes_any_array_like(c):
    """`jnp.asarray(buffer)`, `jnp.stack`, a local array's operators: the value, fetched
    (`__jax_array__`), computed on here. A jitted `jax.numpy` function or a local `jax.jit`
    refuses a buffer with JAX's own message, which fetches nothing."""
    s = c.slice({"x": 2})
    x = c.put(np.arange(4, dtype=np.float32), s, P("x"))
    np.testing.assert_array_equal(jnp.stack([x, x]), np.stack([np.arange(4)] * 2))
    np.testing.assert_array_equal(jnp.float32(2) * x, np.arange(4) * 2)
    assert isinstance(jnp.asarray(x), jax.Array) and x.sharding.spec == P("x")
    y = c.put(np.ones(3, np.float32), s)
    for local in (jnp.sum, jax.jit(lambda v: v * 2)):
        with pytest.raises(ValueError, match=r"jax\.numpy\.array"):
            local(y)
    assert not y.has_value
    keys = c.put(jax.random.key(3), s)
    same_keys(jnp.asarray(keys), jax.random.key(3))


def test_operators_on_buffers_run_on_their_slice_as_jax_runs_them_op_by_op(c):
    """`loss < best`, `total += loss`, `sum(losses)`, `x * 2 + 1`, `np.ones(4) + x`: each a
    computation of one operation on the buffer's slice, its result a buffer there, equal to
    JAX's op by op; a sharded operand's layout kept by an elementwise result."""
    s = c.slice({"x": 2})
    v0, l0 = np.arange(4, dtype=np.float32), np.float32(0.25)
    x, loss = c.put(v0, s, P("x")), c.put(l0, s)
    xj, lj = jnp.asarray(v0), jnp.asarray(l0)
    cases = [
        (lambda a, b: a * 2 + 1, "sharded"), (lambda a, b: 1 - a / 3, "sharded"),
        (lambda a, b: -a ** 2, "sharded"), (lambda a, b: abs(b - 1.0), "scalar"),
        (lambda a, b: a @ a, "scalar"), (lambda a, b: a >= 2, "sharded"),
        (lambda a, b: a == a, "sharded"), (lambda a, b: np.ones(4, np.float32) + a, "sharded"),
        (lambda a, b: a * b, "sharded"), (lambda a, b: b < 1.0, "scalar"),
    ]
    for op, kind in cases:
        got, want = op(x, loss), op(xj, lj)
        assert isinstance(got, isthmus.Buffer) and got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_allclose(got.numpy(), np.asarray(want), rtol=1e-6)
        assert got.sharding.spec == (P("x") if kind == "sharded" else P())
    total, best = 0.0, 1.0
    for _ in range(3):
        total += loss  # as a training loop sums its losses
    assert isinstance(total, isthmus.Buffer) and float(total) == 0.75 and sum([loss, loss]) == 0.5
    assert (loss < best) and min(loss, 3.0) is loss and not (loss == None)  # noqa: E711
    n = c.put(np.int32(7), s)
    assert [int(n // 2), int(n % 3), int(~n), int(n << 1), int(n ** 2)] == [3, 1, -8, 14, 49]
    with pytest.raises(TypeError, match="Integers cannot be raised to negative powers"):
        n ** -1  # a Python int exponent is static, as in JAX

    other = c.put(np.float32(1), c.slice({"y": 1}, island="b"))
    with pytest.raises(isthmus.InvalidArgument, match=rf"buffer {loss.id} is on slice {s.id} and buffer "
                                                      rf"{other.id} on slice"):
        loss + other
    with pytest.raises(TypeError, match="unsupported operand"):
        loss + "a"
    f = c.jit(lambda a: a * 3, slice=s)
    v = c.put(np.arange(24, dtype=np.float32).reshape(4, 6), s, P("x"))
    vj = jnp.arange(24, dtype=jnp.float32).reshape(4, 6)
    for index in (0, -1, (1, 2), (slice(None), 0), (Ellipsis, -1), (None, 2), np.array([0, 2]),
                  (slice(None, None, 2), slice(1, None)), 4, (-9, 7)):  # one computation for every x[i]
        np.testing.assert_array_equal(v[index].numpy(), np.asarray(vj[index]))  # (past the end: clamped)
    lo, hi = c.put(np.float32(2), s), c.put(np.full(6, 9, np.float32), s)
    w = np.arange(12, dtype=np.float32).reshape(6, 2)
    for method in (lambda a: a.astype(jnp.float16), lambda a: a.reshape([3, -1]), lambda a: a.T,
                   lambda a: a.sum(), lambda a: a.mean(axis=0), lambda a: a.max(axis=1, keepdims=True),
                   lambda a: a.clip(2, 9), lambda a: a.argmax(), lambda a: a.real,
                   lambda a: a.view(jnp.int32), lambda a: a.sum(axis=[0, 1]), lambda a: a.dot(w),
                   lambda a: a.sort(axis=0)):
        got, want = method(v), method(vj)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), np.asarray(want))
    got, want = v.clip(lo, hi), vj.clip(jnp.float32(2), jnp.full(6, 9, jnp.float32))  # buffers as operands
    np.testing.assert_array_equal(got.numpy(), np.asarray(want))
    assert v.astype(jnp.float16).sharding.spec == P("x") and v.sum().sharding.spec == P()
    assert v.nbytes == vj.nbytes
    with pytest.raises(isthmus.InvalidArgument, match=r"inside @program has no data yet"):
        c.program(lambda a: f(a) * x)(v0)  # the program's own value refuses it, as before
    with pytest.raises(isthmus.InvalidArgument, match=r"\* on a buffer inside @program would run outside it"):
        c.program(lambda a: f(x * 2))(v0)


@pytest.fixture
def debug_nans():
    """JAX's flag on for one test (read at each call, in the client as in JAX)."""
    jax.config.update("jax_debug_nans", True)
    try:
        yield
    finally:
        jax.config.update("jax_debug_nans", False)
        jax.config.update("jax_debug_infs", False)


def test_jax_debug_nans_raises_on_a_nan_result_as_jax_jit_does(c, debug_nans):
    s = c.slice({"x": 2})
    f = c.jit(jnp.log, slice=s, in_specs=P("x"), out_specs=P("x"), name="log")
    x = np.array([1.0, 2.0, -1.0, 4.0], np.float32)
    with pytest.raises(FloatingPointError, match="nan"):
        jax.jit(jnp.log)(x)
    with pytest.raises(FloatingPointError, match=r"invalid value \(nan\) encountered in log"):
        f(x)
    np.testing.assert_array_equal(f(np.abs(x)).numpy(), np.log(np.abs(x)))  # the client carries on
    b = c.put(x, s, P("x"))
    with pytest.raises(FloatingPointError, match="nan"):
        b * 0.0 / 0.0  # an operator on a buffer is a call too
    assert int(c.jit(lambda i: i // 0, slice=s)(np.int32(3)).numpy()) == jax.jit(lambda i: i // 0)(3)
    jax.config.update("jax_debug_nans", False)
    assert np.isnan(f(x).numpy()[2])  # off: nothing is looked for
    jax.config.update("jax_debug_infs", True)
    with pytest.raises(FloatingPointError, match=r"\(inf\)"):
        f(np.zeros(2, np.float32))


def test_round_divmod_masks_and_array_slice_bounds_on_a_buffer_as_on_a_jax_array(c):
    s = c.slice({"x": 2})
    x = np.arange(6, dtype=np.float32) - 2
    b, j = c.put(x, s, P("x")), jnp.asarray(x)
    for got, want in ((round(b[3]), round(j[3])), (round(b / 3, 2), round(j / 3, 2)),
                      *zip(divmod(b, 3), divmod(j, 3), strict=True),
                      *zip(divmod(7.0, b + 3), divmod(7.0, j + 3), strict=True),
                      (b[x > 0], j[x > 0]), (b[b > 0], j[j > 0]),
                      (b[:c.put(np.int32(4), s)], j[:jnp.int32(4)]), (b[np.int32(1):], j[1:])):
        assert isinstance(got, isthmus.Buffer)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), np.asarray(want))
    m = c.put(np.arange(6, dtype=np.float32).reshape(2, 3), s)
    np.testing.assert_array_equal(m[np.array([[True, False, True], [False, True, False]])].numpy(),
                                  [0.0, 2.0, 4.0])
    with pytest.raises(isthmus.InvalidArgument, match="a slice's bounds are integers"):
        b[:2.5]
