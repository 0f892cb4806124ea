"""Helpers of the user-program tests: trees of buffers fetched and compared, typed keys
compared, and a small flax model."""

import flax.linen as nn
import jax
import numpy as np

import client as isthmus


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
