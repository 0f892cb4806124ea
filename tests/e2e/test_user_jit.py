"""`c.jit` takes what `jax.jit` takes, and refuses what it refuses, each against `jax.jit`
of the same function run here: keyword, static and donated arguments, shardings by name,
results without arrays, float0 gradients, the slice as the context mesh, explicit axes,
64-bit, weakly typed and float8 values; host callbacks and transformations refused by name."""


import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from trees import assert_trees_close, fetched

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def test_keyword_arguments_as_jax_jit_takes_them(c):
    s = c.slice({"x": 4})
    scale = c.jit(lambda x, *, by, shift=0.0: x * by + shift, slice=s, in_specs=(P("x"),), out_specs=P("x"))
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(scale(x, by=np.float32(3)).numpy(), x * 3)
    y = scale(x, by=np.float32(2), shift=np.float32(1))  # another signature: another export
    assert y.sharding.spec == P("x")
    np.testing.assert_array_equal(y.numpy(), x * 2 + 1)

    @c.program
    def twice(x, *, by):
        return scale(scale(x, by=by), by=by)

    np.testing.assert_array_equal(twice(x, by=np.float32(2)).numpy(), x * 4)


def test_a_host_callback_is_refused_by_name_and_the_client_goes_on(c):
    s = c.slice({"x": 2})

    def noisy(x):
        jax.debug.print("x = {x}", x=x)
        return x * 2

    def called_back(x):
        return jax.pure_callback(np.sin, jax.ShapeDtypeStruct(x.shape, x.dtype), x)

    for fn, primitive in ((noisy, "debug_print"), (called_back, "pure_callback")):
        refused = rf"{fn.__name__}: its host callbacks \({primitive}\)"
        with pytest.raises(isthmus.InvalidArgument, match=refused):
            c.jit(fn, slice=s)(np.ones(2, np.float32))
    np.testing.assert_array_equal(c.jit(lambda x: x * 2, slice=s)(np.ones(2, np.float32)).numpy(), [2, 2])


def test_static_arguments_as_jax_jit_takes_them(c):
    s = c.slice({"x": 2})

    def tile(x, reps, *, how="add"):  # reps is a shape, how picks the code path: both static
        tiled = jnp.tile(x, reps)
        return tiled + 1 if how == "add" else tiled * 2

    f = c.jit(tile, slice=s, static_argnums=1, static_argnames="how", in_specs=P("x"), out_specs=P("x"))
    x = np.arange(4, dtype=np.float32)
    for reps, how in ((2, "add"), (3, "add"), (2, "mul")):  # one export per static value
        want = jax.jit(tile, static_argnums=1, static_argnames="how")(x, reps, how=how)
        np.testing.assert_array_equal(f(x, reps, how=how).numpy(), want)
    with pytest.raises(isthmus.InvalidArgument, match="static argument 1: a list is not hashable"):
        f(x, [2])

    @c.program
    def twice(x):
        return f(f(x, 2), 1, how="mul")

    np.testing.assert_array_equal(twice(x).numpy(), (np.tile(x, 2) + 1) * 2)


def test_shardings_by_jax_jit_names_and_as_named_shardings(c):
    s = c.slice({"data": 2})
    rows = NamedSharding(s.abstract_mesh, P("data"))

    def scale(x, w):
        return x * w

    f = c.jit(scale, slice=s, in_shardings=(rows, NamedSharding(s.abstract_mesh, P())), out_shardings=rows)
    x, w = np.arange(8, dtype=np.float32).reshape(4, 2), np.float32(3.0)
    y = f(c.put(x, s, rows), w)
    assert y.sharding.spec == P("data")
    np.testing.assert_array_equal(y.numpy(), x * w)
    listed = c.jit(scale, slice=s, in_specs=[P("data"), P()])  # a list, as jax.jit takes it
    np.testing.assert_array_equal(listed(x, w).numpy(), x * w)
    with pytest.raises(isthmus.InvalidArgument, match=r"in_shardings is in_specs by jax\.jit's name"):
        c.jit(scale, slice=s, in_specs=P(), in_shardings=rows)
    other = NamedSharding(jax.sharding.AbstractMesh((2,), ("model",)), P("model"))
    with pytest.raises(isthmus.InvalidArgument, match="model"):  # an axis the slice lacks
        c.jit(scale, slice=s, in_shardings=other)(x, w)


def test_a_function_without_array_results_returns_its_structure(c):
    # jax.jit of such a function returns its Python structure: there is nothing to run, and
    # with its inputs unused jax.export would name no devices for it
    s = c.slice({"data": 2})
    x = np.ones(3, np.float32)
    assert c.jit(lambda v: None, slice=s)(x) is None
    assert c.jit(lambda v: ((), {"n": None}), slice=s)(x) == ((), {"n": None})
    check = c.jit(lambda v: None, slice=s)
    double = c.jit(lambda v: v * 2, slice=s)

    @c.program
    def prog(v):
        check(v)
        return double(v)

    np.testing.assert_array_equal(prog(x).numpy(), x * 2)


def test_the_gradient_of_an_integer_input_is_float0_as_jax_jit_makes_it(c):
    # jax.grad(..., allow_int=True): an integer input's cotangent has dtype float0, no data
    s = c.slice({"data": 2})
    grad = jax.grad(lambda x, n: jnp.sum(x) * n, argnums=(0, 1), allow_int=True)
    x, n = np.arange(4, dtype=np.float32), np.arange(6, dtype=np.int32).reshape(2, 3)
    want = jax.jit(grad)(x, np.int32(3))
    dx, dn = c.jit(grad, slice=s, in_specs=(P("data"), P()), out_specs=(P("data"), P()))(x, np.int32(3))
    np.testing.assert_array_equal(dx.numpy(), want[0])
    assert dn.dtype == want[1].dtype == jax.dtypes.float0 and dn.shape == ()
    both = c.jit(lambda x, n: (jnp.sum(x), jax.grad(lambda m: jnp.sum(x) * 2.0, allow_int=True)(n)), slice=s)
    total, dm = both(x, n)
    assert float(total) == 6.0 and dm.dtype == jax.dtypes.float0 and dm.shape == (2, 3)
    only = c.jit(lambda n: jax.grad(lambda m: 1.0, allow_int=True)(n), slice=s)
    assert only(n).shape == (2, 3)  # nothing to compute
    pair = c.jit(grad, slice=s)  # inside a program, its float0 result is a constant
    np.testing.assert_array_equal(c.program(lambda x, n: pair(x, n)[0])(x, np.int32(3)).numpy(), want[0])
    dx, dn = c.program(lambda x, n: pair(x, n))(x, np.int32(3))  # and a program's result
    np.testing.assert_array_equal(dx.numpy(), want[0])
    assert dn.dtype == jax.dtypes.float0 and dn.shape == ()


def test_the_slice_is_the_context_mesh_of_its_functions(c):
    # as under `jax.set_mesh(mesh)`: bare PartitionSpecs and shard_map without `mesh=`
    s = c.slice({"x": 4})
    local = Mesh(np.array(jax.devices()[:4]), ("x",), axis_types=(AxisType.Auto,))

    def f(v):
        total = jax.shard_map(lambda b: jax.lax.psum(b.sum(), "x"), in_specs=P("x"), out_specs=P())(v)
        return jax.lax.with_sharding_constraint(v * total, P("x")), jax.sharding.get_abstract_mesh().size

    x = np.arange(8, dtype=np.float32)
    got = c.jit(f, slice=s, in_specs=P("x"))(x)
    with jax.set_mesh(local):
        want = jax.jit(f)(jax.device_put(x, P("x")))
    assert_trees_close(fetched(got), want)

    # a function naming a concrete mesh of its own, which JAX refuses under another context
    def own(v):
        scaled = jax.shard_map(lambda b: b * jax.lax.axis_index("x"), mesh=local,
                               in_specs=P("x"), out_specs=P("x"))
        return scaled(v)

    got = c.jit(own, slice=s, in_specs=P("x"), out_specs=P("x"))(x)
    np.testing.assert_array_equal(got.numpy(), jax.jit(own)(x))


def test_explicit_axes_trace_in_jax_explicit_sharding_mode(c):
    # JAX's documentation's explicit mode: shardings in the types, reshard and out_sharding
    s = c.slice({"X": 2, "Y": 2}, axis_types=AxisType.Explicit)
    local = jax.make_mesh((2, 2), ("X", "Y"), axis_types=(AxisType.Explicit,) * 2)

    def f(x, w):
        assert jax.typeof(x).sharding.spec == P("X", "Y")
        y = jnp.dot(x, w, out_sharding=P("X", None))
        return jnp.tanh(jax.sharding.reshard(y, P(None, "Y"))), y * 2

    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 4), dtype=np.float32), rng.standard_normal((4, 4), dtype=np.float32)
    layer = c.jit(f, slice=s, in_specs=(P("X", "Y"), P("Y", None)))
    got = layer(x, w)
    with jax.set_mesh(local):
        want = jax.jit(f)(jax.device_put(x, P("X", "Y")), jax.device_put(w, P("Y", None)))
    assert_trees_close(fetched(got), want, tol=1e-5)
    # results keep their types' shardings, as jax.jit's do in this mode
    assert [b.sharding.spec for b in got] == [o.sharding.spec for o in want] == [P(None, "Y"), P("X", None)]
    # without in_specs, buffers on the slice come in with their own shardings, as committed
    # arrays come into jax.jit without in_shardings; a local array comes in replicated
    xb, wb = c.put(x, s, P("X", "Y")), c.put(w, s, P("Y", None))
    assert_trees_close(fetched(c.jit(f, slice=s)(xb, wb)), want, tol=1e-5)
    grads = c.jit(jax.grad(lambda v, u: (v @ u).sum()), slice=s)(xb, w)
    with jax.set_mesh(local):
        want_grads = jax.jit(jax.grad(lambda v, u: (v @ u).sum()))(jax.device_put(x, P("X", "Y")), w)
    assert grads.sharding.spec == want_grads.sharding.spec == P("X", "Y")
    np.testing.assert_allclose(grads.numpy(), np.asarray(want_grads), rtol=1e-5)
    total = c.jit(lambda v: v.sum(axis=0), slice=s)

    @c.program(fuse=True)
    def both(x, w):
        return total(layer(x, w)[1])

    np.testing.assert_allclose(both(x, w).numpy(), (x @ w * 2).sum(axis=0), rtol=1e-5, atol=1e-5)
    with pytest.raises(isthmus.InvalidArgument, match="axis_types"):
        c.slice({"X": 2}, axis_types=(AxisType.Manual,))

    # one axis Explicit, one Auto: results keep their types' shardings over the Explicit one
    mixed = (AxisType.Explicit, AxisType.Auto)
    m = c.slice({"X": 2, "Y": 2}, axis_types=mixed)
    local = jax.make_mesh((2, 2), ("X", "Y"), axis_types=mixed)
    double = c.jit(lambda v: v * 2, slice=m, in_specs=P("X", None))
    with jax.set_mesh(local):
        want = jax.jit(lambda v: v * 2)(jax.device_put(x, P("X", None)))
    got = double(x)
    assert got.sharding.spec == want.sharding.spec == P("X", None)
    np.testing.assert_array_equal(got.numpy(), np.asarray(want))


def test_64_bit_values_under_jax_enable_x64(c):
    """A client with `jax_enable_x64` sends and gets back float64, int64, uint64 and
    complex128 as `jax.jit` computes them, in calls, uploads and programs; 32-bit values
    beside them stay 32-bit."""
    s = c.slice({"x": 4})
    f = c.jit(lambda v: v * 3 + 1, slice=s, in_specs=P("x"), out_specs=P("x"))
    with jax.enable_x64(True):
        for x in (np.linspace(0, 1, 8) + 1e-12, np.arange(8, dtype=np.int64) + 2**40,
                  np.arange(8, dtype=np.uint64), np.ones(8, np.complex128) * (1 + 1e-13j),
                  np.arange(8, dtype=np.float32)):
            want = jax.jit(lambda v: v * 3 + 1)(x)
            for got in (f(x), f(c.put(x, s, P("x")))):
                assert got.dtype == want.dtype == x.dtype
                np.testing.assert_array_equal(got.numpy(), np.asarray(want))
        loop = c.program(lambda v: isthmus.fori_loop(0, 3, lambda i, u: f(u), v))
        x = np.linspace(0, 1, 8) + 1e-12
        want = jax.lax.fori_loop(0, 3, lambda i, u: u * 3 + 1, x)
        np.testing.assert_array_equal(loop(x).numpy(), np.asarray(want))
    assert f(np.ones(8, np.float64)).dtype == np.float32  # x64 off: canonicalized as by jax.jit


def test_weakly_typed_values_stay_weak_through_buffers(c):
    """A Python scalar uploaded (`c.put(2.0)`, as `jax.device_put(2.0)`) or returned by a
    function is weakly typed, as in JAX: multiplying bfloat16 values by it keeps bfloat16,
    called directly and inside a program."""
    s = c.slice({"x": 2})
    x = jnp.arange(4, dtype=jnp.bfloat16)
    mul = c.jit(lambda v, k: v * k, slice=s)
    two = c.jit(lambda: 2.0, slice=s)
    want = jax.jit(lambda v, k: v * k)(x, jax.jit(lambda: 2.0)())
    assert want.dtype == jnp.bfloat16
    for k in (two(), c.put(2.0, s)):
        got = mul(x, k)
        assert got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(got.numpy(), np.asarray(want))
    assert mul(x, c.put(np.float32(2.0), s)).dtype == jnp.float32  # a numpy scalar is not weak
    program = c.program(lambda v: mul(v, two()))
    assert program(x).dtype == jnp.bfloat16
    np.testing.assert_array_equal(program(x).numpy(), np.asarray(want))


def test_float8_values_in_and_out(c):
    """JAX's float8 types go in, come out and are uploaded as `jax.jit` computes them."""
    s = c.slice({"x": 2})
    f = c.jit(lambda v: ((v.astype(jnp.float32) * 2).astype(v.dtype), v.astype(jnp.float32)), slice=s)
    for dtype in (jnp.float8_e4m3fn, jnp.float8_e5m2):
        x = np.arange(1, 5).astype(dtype)
        want = jax.jit(f.fn)(x)
        for got in (f(x), f(c.put(x, s))):
            assert [g.dtype for g in got] == [w.dtype for w in want]
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g.numpy().astype(np.float32), np.asarray(w, np.float32))
    program = c.program(lambda v: f(v)[1])  # traced once per dtype, as jax.jit retraces
    for dtype in (jnp.float8_e4m3fn, jnp.float8_e3m4, jnp.float8_e5m2):  # (their dtype.str is one)
        x = np.arange(1, 5).astype(dtype)
        np.testing.assert_array_equal(program(x).numpy(), x.astype(np.float32))


def test_python_ints_past_int32_are_refused_as_jax_jit_refuses_them(c):
    s = c.slice({"x": 1})
    add = c.jit(lambda x, n: x + n, slice=s)
    x = np.zeros(2, np.int32)
    np.testing.assert_array_equal(add(x, 2**31 - 1).numpy(), np.asarray(jax.jit(add.fn)(x, 2**31 - 1)))
    for n in (2**31, -2**31 - 1, 2**40 + 5):
        with pytest.raises(OverflowError):
            jax.jit(add.fn)(x, n)
        with pytest.raises(OverflowError, match=f"Python int {n} too large to convert to int32"):
            add(x, n)
        with pytest.raises(OverflowError, match=f"Python int {n} too large"):
            c.program(lambda v, n=n: add(v, n))(x)


def test_a_function_with_a_long_name_is_jitted_its_name_cut(c):
    s = c.slice({"x": 1})

    def f(v):
        return v + 1

    f.__name__ = "layer_" * 60  # 360 characters: past the 200 the server keeps
    for fn in (c.jit(f, slice=s), c.program(c.jit(f, slice=s))):
        np.testing.assert_array_equal(fn(np.zeros(2, np.float32)).numpy(), np.ones(2, np.float32))
    assert c.jit(f, slice=s).name == ("layer_" * 60)[:200]


def test_one_shard_map_jitted_on_two_slices_is_refused_on_the_second_as_jax_refuses_it(c):
    """A `jax.shard_map` keeps the mesh it was first traced under: on a slice whose mesh
    differs, `jax.jit` refuses it (JAX's ValueError naming both meshes), and so does `c.jit`,
    where it once computed silently with the first slice's axis size."""
    s4, s22 = c.slice({"i": 4}, island="b"), c.slice({"i": 2, "j": 2}, island="a")

    def count(x):
        return x * 0 + jax.lax.psum(1, "i")

    f = jax.shard_map(count, in_specs=P("i"), out_specs=P("i"))
    x = np.zeros(8, np.float32)
    np.testing.assert_array_equal(c.jit(f, slice=s4)(x).numpy(), np.full(8, 4, np.float32))
    with pytest.raises(ValueError, match="should match the mesh passed to shard_map"):
        c.jit(f, slice=s22)(x)
    fresh = jax.shard_map(count, in_specs=P("i"), out_specs=P("i"))  # one of its own: right
    np.testing.assert_array_equal(c.jit(fresh, slice=s22)(x).numpy(), np.full(8, 2, np.float32))


def test_static_values_equal_but_of_other_types_are_other_signatures_as_in_jax_jit(c):
    s = c.slice({"x": 2})

    def divide(x, n):
        return x // n if isinstance(n, int) else x / n

    x = np.array([3.0, 5.0], np.float32)
    mine, theirs = c.jit(divide, slice=s, static_argnums=1), jax.jit(divide, static_argnums=1)
    for n in (2, 2.0):
        np.testing.assert_array_equal(mine(x, n).numpy(), theirs(x, n))
    full = c.jit(lambda n: jnp.full(2, n), slice=s, static_argnums=0)
    for n in (1, 1.0, True):
        want = jax.jit(lambda n: jnp.full(2, n), static_argnums=0)(n)
        got = full(n)
        assert got.dtype == want.dtype, n
        np.testing.assert_array_equal(got.numpy(), np.asarray(want))


def test_a_weakly_typed_jax_array_argument_stays_weak_as_in_jax_jit(c):
    s = c.slice({"x": 2})

    def scale(x, k):
        return x * k

    x, k = jnp.array([1.5, 2.5], jnp.bfloat16), jnp.asarray(2.0)  # k: weakly typed float32
    want = jax.jit(scale)(x, k)
    for got in (c.jit(scale, slice=s)(x, k), c.jit(scale, slice=s)(x, c.put(k, s))):
        assert got.dtype == want.dtype == jnp.bfloat16
        np.testing.assert_array_equal(got.numpy(), np.asarray(want))


def test_a_function_called_inside_a_jax_transformation_is_refused_by_name(c):
    """A `c.jit` function runs on the server: JAX cannot trace through it, and the error says
    so rather than JAX's conversion error deep inside the client."""
    s = c.slice({"x": 2})
    double = c.jit(lambda v: v * 2.0, slice=s)
    x = np.ones(2, np.float32)
    for transformed in (jax.jit(double), jax.vmap(double), lambda v: jax.eval_shape(double, v)):
        with pytest.raises(isthmus.InvalidArgument, match=r"an argument is a JAX tracer .*transformations"):
            transformed(x)
    np.testing.assert_array_equal(double(x).numpy(), x * 2.0)
