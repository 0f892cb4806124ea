"""One signature of a jitted function, exported: the artifact, and what it reads and returns.

A leaf below `client.jit` and the tracer (`client.trace`), which both take an `Export`
(a call queues its outputs, a program records its node), and `client.program`, which puts
back the leaves a trace knew already (`with_fixed`, `split_float0`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

from client.arrays import View, is_float0
from client.slices import Output
from ir import Aval, Spec

__all__ = ["Export", "split_float0", "with_fixed"]


@dataclass(frozen=True)
class Export:
    """One signature of a `Function`, exported: the artifact and what it reads and returns."""

    artifact: bytes
    in_specs: list[Spec]
    out_specs: list[Spec]
    out_avals: list[Aval]
    out_views: list[View]
    out_tree: Any
    outputs: list[Output]
    fixed: tuple[tuple[int, np.ndarray], ...] = ()  # leaves known when traced (float0), by position
    # the function over its data leaves and their avals, as exported (for its VJP: `client.vjp`)
    source: Any = field(default=None, compare=False, repr=False)

    def tree(self, outs: Sequence[Any]) -> Any:
        """The results' pytree: `outs`, one per computed leaf, with the fixed leaves put back."""
        return with_fixed(self.out_tree, self.fixed, outs)


def with_fixed(treedef: Any, fixed: Sequence[tuple[int, np.ndarray]], outs: Sequence[Any]) -> Any:
    """The pytree of `outs` with the `fixed` leaves put back at their positions."""
    leaves = list(outs)
    for i, value in fixed:  # (in increasing position)
        leaves.insert(i, value)
    return jax.tree_util.tree_unflatten(treedef, leaves)


def split_float0(leaves: Sequence[Any]) -> tuple[list[Any], list[tuple[int, np.ndarray]]]:
    """The leaves that hold data, and the float0 ones (an integer input's gradient, which has
    none) as numpy arrays by position, as jax.jit returns them."""
    kept, fixed = [], []
    for i, x in enumerate(leaves):
        if is_float0(x):
            fixed.append((i, np.zeros(np.shape(x), jax.dtypes.float0)))
        else:
            kept.append(x)
    return kept, fixed
