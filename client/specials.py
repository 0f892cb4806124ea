"""JAX's `jax_debug_nans` and `jax_debug_infs` for calls: with either on in the client, a
call whose results hold a NaN (or an infinity) raises `FloatingPointError` naming the
function, as `jax.jit` does.

Contract:
- Read from `jax.config` at each call, as JAX reads them at each dispatch; off (the
  default), a call is not checked and costs nothing more.
- On, a call of a `c.jit` function, an operator or a method on a buffer waits for its
  results, as JAX's check makes each jitted call wait: one more computation on the
  function's slice reduces its floating results (complex ones included) to two flags, and
  only those are fetched. The error is JAX's: "invalid value (nan) encountered in NAME".
  The results are not returned; their buffers are released.
- JAX then runs the function again op by op to name the operation at fault; here the error
  names the function only. A program's computations (`@c.program`) are not checked: they
  run on the executors, and only the run's results come back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from client.buffer import Buffer
from client.slices import Slice
from ir import parse_dtype

__all__ = ["Specials", "checking"]

# `_flags` jitted for a slice, under a name (the session's `client.jit.Function`)
Jit = Callable[[Callable[..., Any], Slice, str], Callable[..., Any]]


def checking() -> tuple[bool, bool]:
    """Whether NaNs, and whether infinities, are to be looked for (JAX's flags, now)."""
    config = jax.config
    return bool(getattr(config, "jax_debug_nans", False)), bool(getattr(config, "jax_debug_infs", False))


def _flags(*values: jax.Array) -> jax.Array:
    """[any NaN, any infinity] over every value."""
    return jnp.stack([jnp.any(jnp.stack([jnp.isnan(v).any() for v in values])),
                      jnp.any(jnp.stack([jnp.isinf(v).any() for v in values]))])


class Specials:
    """One session's checks, a jitted `_flags` per slice (made by `jit`)."""

    def __init__(self, jit: Jit) -> None:
        self._jit = jit
        self._checks: dict[str, Callable[..., Any]] = {}

    def check(self, name: str, slice: Slice, outs: Sequence[Buffer], nans: bool, infs: bool) -> None:
        """Raise FloatingPointError if `outs`, the results of `name` on `slice`, hold what
        is looked for."""
        floating = [b for b in outs if b.key is None and np.issubdtype(parse_dtype(b.aval.dtype), np.inexact)]
        if not floating:
            return
        fn = self._checks.get(slice.id)
        if fn is None:
            fn = self._checks[slice.id] = self._jit(_flags, slice, "debug_nans")
        has_nan, has_inf = fn(*floating).numpy()
        for found, wanted, what in ((has_nan, nans, "nan"), (has_inf, infs, "inf")):
            if found and wanted:
                for b in outs:
                    b.delete()
                raise FloatingPointError(f"invalid value ({what}) encountered in {name}")
