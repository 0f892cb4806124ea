"""Programs written the way flax, optax and JAX's own documentation write them, through the
client as the README shows it, each against `jax.jit` of the same function run here: models
and optimizer states as pytrees, typed PRNG keys (`jax.random.key`, nnx's `Rngs`) in and out
of computations and programs, keyword arguments, and host callbacks refused with a clear
error."""

import copy
import pickle

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.training import train_state
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def fetched(tree):
    return jax.tree_util.tree_map(lambda b: b.numpy() if isinstance(b, isthmus.Buffer) else b, tree)


def assert_trees_close(got, want, tol=1e-6):
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=tol, atol=tol)


def same_keys(got, want):
    np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(want))


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.LayerNorm()(nn.relu(nn.Dense(32)(x)))
        return nn.Dense(1)(x)


def test_flax_linen_model_trains_with_optax_adam_as_jax_jit_does(c):
    s = c.slice({"data": 2})
    model, tx = MLP(), optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-2))
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 8), dtype=np.float32)
    y = rng.standard_normal((16, 1), dtype=np.float32)
    params = model.init(jax.random.key(0), x)
    opt = tx.init(params)  # namedtuples, an EmptyState, a scalar count: one pytree

    def train_step(params, opt, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    specs = (P(), P(), P("data"), P("data"))
    step = c.jit(train_step, slice=s, in_specs=specs, out_specs=P())
    mesh = jax.make_mesh((2,), ("data",), devices=jax.devices()[:2])
    oracle = jax.jit(train_step, in_shardings=tuple(NamedSharding(mesh, p) for p in specs),
                     out_shardings=NamedSharding(mesh, P()))
    rp, ro = c.put(params, s), c.put(opt, s)  # the state stays on the executors between steps
    losses = []
    for _ in range(4):
        rp, ro, loss = step(rp, ro, x, y)
        params, opt, want = oracle(params, opt, x, y)
        losses.append(float(loss.numpy()))
        assert losses[-1] == pytest.approx(float(want), rel=1e-6)
    assert losses[-1] < losses[0]
    assert_trees_close(fetched((rp, ro)), (params, opt))


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(features=8, kernel_size=(3, 3))(x))
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        return nn.Dense(features=10)(x.reshape((x.shape[0], -1)))


def test_a_flax_train_state_is_one_argument_and_one_result(c):
    s = c.slice({"data": 2})
    cnn = CNN()
    rng = np.random.default_rng(2)
    batch = {"image": rng.standard_normal((8, 8, 8, 1), dtype=np.float32),
             "label": np.arange(8, dtype=np.int32)}
    params = cnn.init(jax.random.key(0), batch["image"])["params"]
    # apply_fn and tx are static fields of the pytree: they stay in the tree's structure
    state = train_state.TrainState.create(apply_fn=cnn.apply, params=params, tx=optax.sgd(0.1, 0.9))

    def train_step(state, batch):
        def loss_fn(params):
            logits = state.apply_fn({"params": params}, batch["image"])
            return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"]).mean()
        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    step = c.jit(train_step, slice=s)
    remote = c.put(state, s)
    for _ in range(3):
        remote, loss = step(remote, batch)
        state, want = jax.jit(train_step)(state, batch)
        assert float(loss) == pytest.approx(float(want), rel=1e-6)
    assert isinstance(remote, train_state.TrainState) and int(remote.step) == 3
    assert_trees_close(fetched(remote.params), state.params)


def test_typed_keys_go_in_come_out_and_feed_on(c):
    s = c.slice({"x": 2})
    key = jax.random.key(3)
    split = c.jit(lambda k: jax.random.split(k), slice=s)
    keys = split(key)  # typed keys out: a Buffer of their key data, shown as keys
    assert keys.shape == (2,) and keys.dtype == key.dtype and keys.ndim == 1 and keys.size == 2
    assert repr(keys).startswith(f"Buffer({keys.id}, key<fry>[2] keys=threefry2x32 as uint32[2,2]")
    same_keys(keys.keys(), jax.random.split(key))
    with pytest.raises(TypeError, match=r"PRNG keys .*\.keys\(\)"):
        keys.numpy()  # as np.asarray of a key array raises in JAX

    draw = c.jit(lambda ks, shape_of: jax.random.normal(ks[1], shape_of.shape), slice=s)
    like = np.zeros(6, np.float32)
    np.testing.assert_array_equal(draw(keys, like).numpy(), jax.random.normal(jax.random.split(key)[1], (6,)))
    np.testing.assert_array_equal(draw(jax.random.split(key), like).numpy(),  # keys from here
                                  jax.random.normal(jax.random.split(key)[1], (6,)))

    rbg = jax.random.key(5, impl="rbg")  # another implementation: other key data
    uploaded = c.put(rbg, s)
    bits = c.jit(lambda k: jax.random.bits(k, (4,)), slice=s)
    np.testing.assert_array_equal(bits(uploaded).numpy(), jax.random.bits(rbg, (4,)))
    same_keys(uploaded.keys(), rbg)


def test_a_program_carries_a_typed_key_through_a_loop(c):
    a, b = c.slice({"x": 2}, island="a"), c.slice({"y": 2}, island="b")
    split = c.jit(lambda k: tuple(jax.random.split(k)), slice=a)
    draw = c.jit(lambda k, acc: acc + jax.random.normal(k, acc.shape), slice=b)  # the key crosses islands
    below = c.jit(lambda i: i < 5, slice=a)
    inc = c.jit(lambda i: i + 1, slice=a)
    zero = c.put(np.int32(0), a)

    @c.program
    def sample(key, acc):
        def body(state):
            i, k, acc = state
            k, sub = split(k)
            return inc(i), k, draw(sub, acc)
        return isthmus.while_loop(lambda state: below(state[0]), body, (zero, key, acc))

    key, acc = jax.random.key(11), np.zeros(4, np.float32)
    _, got_key, got = sample(key, acc)
    for _ in range(5):
        key, sub = jax.random.split(key)
        acc = acc + jax.random.normal(sub, (4,))
    np.testing.assert_allclose(got.numpy(), acc, rtol=1e-6)
    same_keys(got_key.keys(), key)


class Dropped(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(4, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)  # its Rngs state holds a typed key and a count
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(nnx.relu(self.hidden(x))))


def test_flax_nnx_state_with_rngs_round_trips_through_training_steps(c):
    s = c.slice({"data": 2})
    graphdef, state = nnx.split(Dropped(nnx.Rngs(0)))
    tx = optax.sgd(0.1)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 4), dtype=np.float32)
    y = rng.standard_normal((8, 1), dtype=np.float32)

    def step(state, x, y):
        model = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
        params = nnx.state(model, nnx.Param)
        updates, _ = tx.update(grads, tx.init(params), params)
        nnx.update(model, optax.apply_updates(params, updates))
        return nnx.split(model)[1], loss  # the dropout key's count has moved on

    f = c.jit(step, slice=s)
    remote, local = c.put(state, s), state
    for _ in range(3):
        remote, loss = f(remote, x, y)
        local, want = jax.jit(step)(local, x, y)
        assert float(loss.numpy()) == pytest.approx(float(want), rel=1e-6)
    got_leaves = jax.tree_util.tree_leaves(remote)
    for g, w in zip(got_leaves, jax.tree_util.tree_leaves(local), strict=True):
        if g.key is not None:
            same_keys(g.keys(), w)
        else:
            np.testing.assert_allclose(g.numpy(), np.asarray(w), rtol=1e-6, atol=1e-6)
    assert any(g.key is not None for g in got_leaves)
    fetched_state = jax.device_get(remote)  # as from jax.device_get: keys as key arrays
    for g, w in zip(jax.tree_util.tree_leaves(fetched_state), jax.tree_util.tree_leaves(local), strict=True):
        if jax.dtypes.issubdtype(w.dtype, jax.dtypes.prng_key):
            same_keys(g, w)
        else:
            np.testing.assert_allclose(g, np.asarray(w), rtol=1e-6, atol=1e-6)


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


def test_donated_arguments_are_freed_by_the_call_and_refused_after_it(c):
    s = c.slice({"data": 2})
    model, tx = MLP(), optax.sgd(0.1)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((8, 8), dtype=np.float32)
    y = rng.standard_normal((8, 1), dtype=np.float32)
    params = model.init(jax.random.key(1), x)
    opt = tx.init(params)

    def train_step(params, opt, x, y):
        loss, grads = jax.value_and_grad(lambda p: jnp.mean((model.apply(p, x) - y) ** 2))(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt, loss

    # as flax's examples jit a training step: the old state is given up to the new one
    step = c.jit(train_step, slice=s, donate_argnums=(0, 1))
    remote, remote_opt = c.put(params, s), c.put(opt, s)
    held = len(c.buffers())
    first = remote
    for _ in range(4):
        remote, remote_opt, loss = step(remote, remote_opt, x, y)
        params, opt, want = jax.jit(train_step)(params, opt, x, y)
        assert float(loss) == pytest.approx(float(want), rel=1e-6)
    assert_trees_close(fetched(remote), params)
    # the donated buffers went with the calls: the state `first` still names is gone too
    assert len(c.buffers()) == held + 1  # the newest state, and the last loss
    leaf = jax.tree_util.tree_leaves(first)[0]
    assert leaf.is_deleted()
    with pytest.raises(isthmus.NotFound, match="has been deleted"):
        step(first, remote_opt, x, y)
    with pytest.raises(isthmus.NotFound, match="has been deleted"):
        leaf.numpy()
    with pytest.raises(isthmus.InvalidArgument, match="argument 'x' is static"):
        c.jit(train_step, slice=s, static_argnames="x", donate_argnames="x")


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


def test_nnx_variables_made_sharded_inside_a_computation_as_flax_documents(c):
    # flax's sharding guide: a variable annotated with a sharding is made under a context mesh
    s = c.slice({"data": 2, "model": 2})
    local = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"),
                 axis_types=(AxisType.Auto,) * 2)

    class DotReluDot(nnx.Module):
        def __init__(self, depth, rngs):
            init = nnx.with_partitioning(nnx.initializers.lecun_normal(), (None, "model"))
            self.dot1 = nnx.Linear(depth, depth, kernel_init=init, use_bias=False, rngs=rngs)

        def __call__(self, x):
            return jax.lax.with_sharding_constraint(jax.nn.relu(self.dot1(x)), P("data", "model"))

    def init():
        return nnx.state(DotReluDot(8, rngs=nnx.Rngs(0)))

    with jax.set_mesh(local):
        graph = nnx.graphdef(nnx.eval_shape(lambda: DotReluDot(8, rngs=nnx.Rngs(0))))

    def forward(state, x):
        return nnx.merge(graph, state)(x)

    x = np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32)
    state = c.jit(init, slice=s)()
    got = c.jit(forward, slice=s)(state, x)
    with jax.set_mesh(local):
        want = jax.jit(forward)(jax.jit(init)(), x)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


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


def test_round_and_index_take_a_buffer_as_they_take_a_jax_array(c):
    s = c.slice({"x": 2})
    n, v = c.put(np.int32(3), s), c.put(np.float32(2.6), s)
    assert list(range(n)) == [0, 1, 2] and [10, 11, 12, 13][n] == 13
    assert round(v) == round(jnp.asarray(2.6)) == 3 and round(v, 1) == round(jnp.float32(2.6), 1)


def test_an_optimizer_state_is_made_from_parameters_held_as_buffers(c):
    """`params = init(...)` by a jitted call, then `tx.init(params)` as optax users write it:
    `jnp.zeros_like` of a buffer reads its sharding (a `NamedSharding` over the slice's
    mesh, as `jax.Array.sharding` is) and makes local zeros; the training step takes them."""
    s = c.slice({"x": 2})
    model, tx = MLP(), optax.adam(1e-2)
    x = np.random.default_rng(1).standard_normal((4, 8), dtype=np.float32)
    params = c.jit(model.init, slice=s)(jax.random.key(0), x)
    leaf = jax.tree_util.tree_leaves(params)[0]
    assert leaf.sharding == NamedSharding(s.abstract_mesh, P()) and leaf.sharding.spec == P()
    opt = tx.init(params)
    want_params = model.init(jax.random.key(0), x)
    assert_trees_close(opt, tx.init(want_params))

    def step(params, opt, x):
        grads = jax.grad(lambda p: jnp.mean(model.apply(p, x) ** 2))(params)
        updates, opt = tx.update(grads, opt, params)
        return optax.apply_updates(params, updates), opt

    got = c.jit(step, slice=s)(params, opt, x)
    assert_trees_close(fetched(got), jax.jit(step)(want_params, tx.init(want_params), x), tol=1e-5)


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
