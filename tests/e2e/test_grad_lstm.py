"""A small flax LSTM language model trained through `isthmus.fori_loop` over sequences of a
different length each step, its gradients computed on the hosts (`isthmus.value_and_grad`),
with optax Adam: the embedding and the LSTM cell on island a, the output layer and the loss on
island b, a hidden state crossing islands every time step. After 20 steps its parameters equal
the same training run in this process with `jax.lax.scan` (over the longest length, the steps
past each step's length masked)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]
VOCAB, EMBED, HIDDEN, BATCH, LONGEST, STEPS = 12, 8, 16, 4, 9, 20
TOL = {"rtol": 1e-4, "atol": 1e-5}  # 20 Adam steps of forward-with-residuals artifacts: ulps add up

embed, lstm, out = nn.Embed(VOCAB, EMBED), nn.LSTMCell(HIDDEN), nn.Dense(VOCAB)
adam = optax.adam(1e-2)


def read(pa, carry, tokens, i):
    """Island a: token i of each sequence into the LSTM; its new carry and output."""
    x = embed.apply(pa["embed"], jax.lax.dynamic_index_in_dim(tokens, i, axis=1, keepdims=False))
    return lstm.apply(pa["lstm"], carry, x)


def predict(pb, h, tokens, i, total):
    """Island b: the loss of predicting token i + 1, added to the running total."""
    target = jax.lax.dynamic_index_in_dim(tokens, i + 1, axis=1, keepdims=False)
    return total + optax.softmax_cross_entropy_with_integer_labels(out.apply(pb, h), target).mean()


def update(p, state, g):
    updates, state = adam.update(g, state, p)
    return optax.apply_updates(p, updates), state


def init():
    ka, kb, kc = jax.random.split(jax.random.PRNGKey(0), 3)
    carry = lstm.initialize_carry(kc, (BATCH, EMBED))
    pa = {"embed": embed.init(ka, jnp.zeros((BATCH,), jnp.int32)),
          "lstm": lstm.init(kb, carry, jnp.zeros((BATCH, EMBED)))}
    pb = out.init(kc, jnp.zeros((BATCH, HIDDEN)))
    return jax.device_get((pa, pb)), jax.device_get(carry)


def local_step(pa, pb, sa, sb, carry, tokens, n):
    """The oracle: `jax.lax.scan` over the longest length, the steps past `n` masked (they
    leave the carry and the total as they were, so the value and the gradients are those of
    a scan of `n` steps), so that it compiles once for every length."""
    def loss(pa, pb):
        def step(state, i):
            carry, total = state
            moved, h = read(pa, carry, tokens, i)
            kept = i < n
            carry = jax.tree_util.tree_map(lambda new, old: jnp.where(kept, new, old), moved, carry)
            return (carry, jnp.where(kept, predict(pb, h, tokens, i, total), total)), None

        (_, total), _ = jax.lax.scan(step, (carry, jnp.float32(0)), jnp.arange(LONGEST - 1))
        return total / n

    value, (ga, gb) = jax.value_and_grad(loss, argnums=(0, 1))(pa, pb)
    (pa, sa), (pb, sb) = update(pa, sa, ga), update(pb, sb, gb)
    return pa, pb, sa, sb, value


def test_a_flax_lstm_trains_through_a_loop_over_sequences_of_varying_length_as_scan_does(c):
    a, b = c.slice({"x": 1}, island="a"), c.slice({"y": 1}, island="b")
    read_a, predict_b = c.jit(read, slice=a, name="read"), c.jit(predict, slice=b, name="predict")
    update_a, update_b = c.jit(update, slice=a, name="adam_a"), c.jit(update, slice=b, name="adam_b")
    mean_b = c.jit(lambda total, n: total / n, slice=b, name="mean")

    @c.program
    def train(pa, pb, sa, sb, carry, tokens, n):
        def loss(pa, pb):
            def step(i, state):
                carry, total = state
                carry, h = read_a(pa, carry, tokens, i)
                return carry, predict_b(pb, h, tokens, i, total)

            _, total = isthmus.fori_loop(0, n, step, (carry, np.float32(0)))
            return mean_b(total, n)

        value, (ga, gb) = isthmus.value_and_grad(loss, argnums=(0, 1))(pa, pb)
        (pa, sa), (pb, sb) = update_a(pa, sa, ga), update_b(pb, sb, gb)
        return pa, pb, sa, sb, value

    (pa, pb), carry = init()
    sa, sb = adam.init(pa), adam.init(pb)
    local = (pa, pb, sa, sb)
    rng = np.random.default_rng(5)
    lengths = rng.integers(2, LONGEST, STEPS)  # tokens 0..n predicted from those before
    oracle = jax.jit(local_step)
    for n in lengths:
        tokens = rng.integers(0, VOCAB, (BATCH, LONGEST)).astype(np.int32)
        pa, pb, sa, sb, value = train(pa, pb, sa, sb, carry, tokens, np.int32(n))
        *local, want = oracle(*local, carry, tokens, np.int32(n))
        np.testing.assert_allclose(value.numpy(), want, **TOL)
    got = jax.tree_util.tree_map(lambda v: v.numpy(), (pa, pb))
    for x, y in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(local[:2]), strict=True):
        np.testing.assert_allclose(x, np.asarray(y), **TOL)
    assert len(set(lengths.tolist())) > 3
