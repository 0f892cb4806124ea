"""`isthmus demo`: train a small MLP through Isthmus, parameters kept on the executors.

The model and the Adam step are plain JAX; the oracle tests check this very step against
`jax.jit` run locally.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from client.connection import Client

Params = dict[str, dict[str, Any]]


def init_mlp(rng: np.random.Generator, sizes: list[int]) -> Params:
    return {
        f"layer{i}": {"w": rng.standard_normal((a, b), dtype=np.float32) / np.sqrt(a),
                      "b": np.zeros((b,), np.float32)}
        for i, (a, b) in enumerate(itertools.pairwise(sizes))
    }


def mlp(params: Params, x: jax.Array) -> jax.Array:
    for i in range(len(params)):
        layer = params[f"layer{i}"]
        x = x @ layer["w"] + layer["b"]
        if i < len(params) - 1:
            x = jax.nn.relu(x)
    return x


def init_state(params: Params) -> dict[str, Any]:
    zeros = jax.tree.map(np.zeros_like, params)
    return {"params": params, "opt": {"t": np.float32(0), "m": zeros, "v": zeros}}


def adam_step(state: dict[str, Any], x: jax.Array, y: jax.Array,
              lr: float = 1e-2) -> tuple[dict[str, Any], jax.Array]:
    """One Adam step on mean squared error; parameters and optimizer state are nested dicts."""
    params, opt = state["params"], state["opt"]
    loss, grads = jax.value_and_grad(lambda p: jnp.mean((mlp(p, x) - y) ** 2))(params)
    t = opt["t"] + 1
    m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, opt["m"], grads)
    v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g * g, opt["v"], grads)
    step = lr * jnp.sqrt(1 - 0.999**t) / (1 - 0.9**t)
    params = jax.tree.map(lambda p, m, v: p - step * m / (jnp.sqrt(v) + 1e-8), params, m, v)
    return {"params": params, "opt": {"t": t, "m": m, "v": v}}, loss


def dataset(rng: np.random.Generator, n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    x = rng.standard_normal((n, d), dtype=np.float32)
    y = np.sin(x @ rng.standard_normal((d, 1), dtype=np.float32)).astype(np.float32)
    return x, y


def run(c: Client, steps: int = 300, log_every: int = 50, print_fn: Any = print) -> list[float]:
    """Train on a 4-device data-parallel slice; return the logged losses."""
    print_fn(c.devices())
    s = c.slice({"data": 4})
    print_fn(f"\nslice {s.id}: mesh {s.mesh} on island {s.island}, devices {s.device_ids}")
    rng = np.random.default_rng(0)
    x, y = dataset(rng, 512, 16)
    state = c.put(init_state(init_mlp(rng, [16, 64, 64, 1])), s, P())
    xb, yb = c.put(x, s, P("data")), c.put(y, s, P("data"))
    step = c.jit(adam_step, slice=s, in_specs=(P(), P("data"), P("data")), out_specs=P())
    state, loss = step(state, xb, yb)  # compile and warm up
    losses = [float(loss.numpy())]
    print_fn(f"step {0:4d}  loss {losses[-1]:.5f}")
    start = time.perf_counter()
    for i in range(1, steps + 1):
        state, loss = step(state, xb, yb)
        if i % log_every == 0 or i == steps:
            losses.append(float(loss.numpy()))
            rate = i / (time.perf_counter() - start)
            print_fn(f"step {i:4d}  loss {losses[-1]:.5f}  {rate:6.1f} steps/s")
    return losses
