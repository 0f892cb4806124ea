"""Models and optimizers written the way flax, optax and JAX's own documentation write them,
through the client as the README shows it, each against `jax.jit` of the same function run
here: parameters, train states and optimizer states as pytrees of buffers, typed PRNG keys
(`jax.random.key`, nnx's `Rngs`) in and out of computations and programs, donation."""


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
from trees import MLP, assert_trees_close, fetched, same_keys

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(features=8, kernel_size=(3, 3))(x))
        x = nn.avg_pool(x, window_shape=(2, 2), strides=(2, 2))
        return nn.Dense(features=10)(x.reshape((x.shape[0], -1)))


class Dropped(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(4, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)  # its Rngs state holds a typed key and a count
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(nnx.relu(self.hidden(x))))


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
