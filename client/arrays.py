"""Arguments as the client sends them: leaves as canonical numpy arrays, one spec per leaf.

Below the client every value is plain data: an aval (shape, dtype) and bytes. A leaf's
`View` says how the client shows it to the user's functions: weakly typed (a Python
scalar, as JAX types it), or as typed PRNG keys (`jax.random.key`), which travel and are
stored as their key data (`jax.random.key_data`: uint32, the key's shape plus the
implementation's trailing dimensions) and are wrapped again inside each computation.
`Shaped` is what every array-like value of the client (a `Buffer`, a traced value) shows of
its aval and view.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from ir import Aval, InvalidArgument, Spec, parse_dtype


@dataclass(frozen=True, slots=True)
class View:
    """How the client shows one leaf's data: weakly typed, or as PRNG keys of `key`'s
    implementation (e.g. "threefry2x32")."""

    weak: bool = False
    key: str | None = None


PLAIN = View()
WEAK = View(weak=True)


def _is_spec(x: Any) -> bool:
    return x is None or isinstance(x, PartitionSpec | NamedSharding)


def _spec(x: Any, what: str) -> Spec:
    """A `PartitionSpec`, or a `NamedSharding`'s (`NamedSharding(s.abstract_mesh, P(...))`,
    as `jax.jit`'s shardings are written): the slice is the mesh, so only the spec counts,
    and its axis names are checked against the slice's where the spec is used. Anything
    else (a bare axis name, say) is refused, as `jax.jit` refuses it."""
    if not _is_spec(x):
        shown = repr(str(x)[:40])
        raise InvalidArgument(f"{what}: expected a PartitionSpec, a NamedSharding or None for each leaf, "
                              f"got {type(x).__name__} {shown} (an axis is written P({shown}))")
    return Spec.of(x.spec if isinstance(x, NamedSharding) else x)


def leaf_specs(specs: Any, tree: Any, what: str) -> list[Spec]:
    """One `Spec` per leaf of `tree`, from one spec or a pytree prefix of specs."""
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
    if _is_spec(specs):
        return [_spec(specs, what)] * len(paths)
    spec_leaves, spec_tree = jax.tree_util.tree_flatten(specs, is_leaf=_is_spec)
    try:
        # (jaxlib's PyTreeDef has it; the type JAX declares for it here does not say so)
        subtrees = spec_tree.flatten_up_to(tree)  # type: ignore[attr-defined]
    except (ValueError, TypeError) as e:
        raise InvalidArgument(f"{what}: not a prefix of the structure {what[:-6]}: {e}") from None
    out: list[Spec] = []
    for spec, sub in zip(spec_leaves, subtrees, strict=True):
        out += [_spec(spec, what)] * len(jax.tree_util.tree_leaves(sub))
    return out


def call_specs(specs: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Spec]:
    """One `Spec` per leaf of `(args, kwargs)`: `specs` is one spec for every leaf, or a
    prefix of the positional arguments, keyword arguments then being replicated (as
    `jax.jit`'s `in_shardings` cover the positional ones; a list of them is taken as the
    tuple of the arguments, as there)."""
    if isinstance(specs, list):
        specs = tuple(specs)
    if _is_spec(specs):
        return leaf_specs(specs, (args, kwargs), "in_specs")
    return leaf_specs(specs, args, "in_specs") + leaf_specs(None, kwargs, "in_specs")


def is_key(x: Any) -> bool:
    """Whether `x` is an array of typed PRNG keys."""
    dtype = getattr(x, "dtype", None)
    return dtype is not None and not isinstance(dtype, np.dtype) and jax.dtypes.issubdtype(
        dtype, jax.dtypes.prng_key)


def as_array(x: Any) -> tuple[np.ndarray, View]:
    """A leaf as a numpy array of JAX's canonical dtype, and how the client shows it: weakly
    typed (a Python scalar, or a JAX array typed so), typed keys (sent as their key data), or
    plainly."""
    if isinstance(x, jax.core.Tracer):
        raise InvalidArgument(
            f"an argument is a JAX tracer ({x.aval.str_short()}): an Isthmus function or upload runs on the "
            "server, outside JAX's transformations (jax.jit, grad, vmap, eval_shape); call it from plain "
            "Python, or transform the function itself before c.jit")
    if is_key(x):
        data, view = _key_data(x)
        return np.asarray(data), view
    weak = _weak_scalar(x) or (isinstance(x, jax.Array) and x.weak_type)  # (jnp.asarray(2.0) is weak)
    if weak and isinstance(x, int):  # out of range: refused, as jax.jit refuses it, not wrapped
        wanted = jax.dtypes.canonicalize_dtype(np.int64)
        if not np.iinfo(wanted).min <= x <= np.iinfo(wanted).max:
            raise OverflowError(f"Python int {x} too large to convert to {wanted.name}")
    array = np.asarray(x)
    if array.dtype.kind in "OSU" or array.dtype == jax.dtypes.float0:  # (ml_dtypes' are kind V too)
        raise NotAnArray(_not_an_array(x, array))
    return array.astype(jax.dtypes.canonicalize_dtype(array.dtype), copy=False), WEAK if weak else PLAIN


FLOAT0 = "float0"  # a signature's dtype for a float0 leaf, which is not sent


def is_float0(x: Any) -> bool:
    """An integer input's gradient: an array of JAX's float0, which holds no data."""
    return getattr(x, "dtype", None) == jax.dtypes.float0


class NotAnArray(InvalidArgument):
    """A leaf that is no array: the caller says which argument it is (`leaf_path`)."""


def _not_an_array(x: Any, array: np.ndarray) -> str:
    if array.dtype == jax.dtypes.float0:
        return ("is a float0 array (an integer input's gradient), which holds no data: it is "
                "taken by a c.jit function's call, not uploaded (c.put) or bound to a program")
    shown = repr(x)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    return (f"is a {type(x).__name__} ({shown}), not an array: an argument that is not an array "
            "must be static, as in jax.jit (c.jit(..., static_argnums=... or static_argnames=...))")


def leaf_path(tree: tuple[tuple[Any, ...], dict[str, Any]], i: int) -> str:
    """How the user wrote leaf `i` of `(args, kwargs)`: `args[1]`, `kwargs['mode'][0]`, ..."""
    path = jax.tree_util.tree_flatten_with_path(tree)[0][i][0]
    return ("args" if path[0].idx == 0 else "kwargs") + jax.tree_util.keystr(path[1:])


def leaf_array(x: Any, tree: tuple[tuple[Any, ...], dict[str, Any]], i: int, who: str
               ) -> tuple[np.ndarray, View]:
    """`as_array` of leaf `i` of `(args, kwargs)`; a leaf that is no array is named."""
    try:
        return as_array(x)
    except NotAnArray as e:
        raise InvalidArgument(f"{who}: argument {leaf_path(tree, i)} {e}") from None


def _key_data(keys: Any) -> tuple[Any, View]:
    """Typed keys as their key data, and the view that names their implementation."""
    return jax.random.key_data(keys), View(key=str(jax.random.key_impl(keys)))


@functools.lru_cache(maxsize=16)
def key_type(impl: str) -> tuple[int, np.dtype]:
    """How many trailing dimensions an implementation's key data adds, and its key dtype."""
    key = jax.random.key(0, impl=impl)
    return jax.random.key_data(key).ndim, key.dtype


def wrap(data: Any, view: View) -> Any:
    """Inside a computation: the leaf as the user's function sees it."""
    return data if view.key is None else jax.random.wrap_key_data(data, impl=view.key)


def unwrap(value: Any) -> tuple[Any, View]:
    """Inside a computation: a result leaf as data, and how the client shows it."""
    if is_key(value):
        return _key_data(value)
    return value, WEAK if getattr(value, "weak_type", _weak_scalar(value)) else PLAIN


def _weak_scalar(x: Any) -> bool:
    """A Python scalar, which JAX types weakly (np.float64 subclasses float but is not one)."""
    return type(x) in (int, float, complex)


class Shaped:
    """Shape, dtype and rank from an `aval` (its data) and how it is `shown` (`client.arrays`): what
    every array-like value of the client shows. Typed keys show the keys' shape and dtype."""

    __slots__ = ()

    @property
    def aval(self) -> Aval:
        """The aval of its data (for typed keys, of their key data)."""
        raise NotImplementedError

    @property
    def shown(self) -> View:
        """How the client shows its value: weakly typed, typed PRNG keys, or plainly."""
        raise NotImplementedError

    @property
    def shape(self) -> tuple[int, ...]:
        if self.shown.key is None:
            return self.aval.shape
        trailing, _ = key_type(self.shown.key)
        return self.aval.shape[:len(self.aval.shape) - trailing]

    @property
    def dtype(self) -> Any:
        return parse_dtype(self.aval.dtype) if self.shown.key is None else key_type(self.shown.key)[1]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        """The number of elements (of keys, for typed keys), as `jax.Array.size`."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes its value takes (its key data's, for typed keys)."""
        return self.aval.nbytes

    def __len__(self) -> int:
        """The first dimension, as `len` of a `jax.Array` (no data needed)."""
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]
