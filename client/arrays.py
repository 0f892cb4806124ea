"""Arguments as the client sends them: leaves as canonical numpy arrays, one spec per leaf."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import PartitionSpec

from ir import InvalidArgument, Spec


def _is_spec(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec)


def leaf_specs(specs: Any, tree: Any, what: str) -> list[Spec]:
    """One `Spec` per leaf of `tree`, from one spec or a pytree prefix of specs."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if _is_spec(specs):
        return [Spec.of(specs)] * len(paths)
    spec_leaves, spec_tree = jax.tree_util.tree_flatten(specs, is_leaf=_is_spec)
    try:
        subtrees = spec_tree.flatten_up_to(tree)
    except (ValueError, TypeError) as e:
        raise InvalidArgument(f"{what}: not a prefix of the structure {what[:-6]}: {e}") from None
    out: list[Spec] = []
    for spec, sub in zip(spec_leaves, subtrees, strict=True):
        out += [Spec.of(spec)] * len(jax.tree_util.tree_leaves(sub))
    return out


def as_array(x: Any) -> tuple[np.ndarray, bool]:
    """A leaf as a numpy array of JAX's canonical dtype, and whether it is weakly typed."""
    weak = type(x) in (int, float, complex)  # np.float64 subclasses float but is not weak
    array = np.asarray(x)
    return array.astype(jax.dtypes.canonicalize_dtype(array.dtype), copy=False), weak
