"""Operators and indexing on buffers, outside programs: each runs on the executors as a
computation of one operation on the buffer's slice, as JAX runs an operator on an array op
by op, and returns a `Buffer` there (`loss < best`, `total + loss`, `-x`, `x * 2`, `x[0]`).

Contract:
- The operands are the buffer and the other side: another buffer of the same slice, or a
  local value JAX takes as an operand (a Python number, weakly typed as in JAX; a numpy
  array or scalar; a `jax.Array`), uploaded with the call. A buffer of another slice is
  refused, naming both (JAX refuses arrays committed to different devices). Anything else
  gets `NotImplemented`, so Python asks the other side, or raises its `TypeError`. A
  Python int exponent (`x ** 2`) is static, as JAX takes it (`Buffer.__pow__`).
- Each operator is a `client.jit.Function` of the slice, kept per (operator, slice, specs):
  its signatures are exported, registered and cached as any jitted function's. A buffer
  keeps its spec; the result takes the spec of a buffer operand of its shape (an
  elementwise operation keeps the layout), else it is replicated. On a slice with Explicit
  axes the result's type decides, as in `c.jit`.
- Some of `jax.Array`'s methods and properties (`Buffer.astype`, `.reshape`, `.sum`, `.T`,
  `.real`: `client.buffer.METHODS`, `PROPERTIES`) run likewise: buffers and arrays among
  their arguments are operands (`x.clip(lo, hi)`, `x.dot(w)`), the others static (so
  hashable: axes, shapes, dtypes); the result keeps the spec only where it is elementwise.
- Indexing passes the index's integers and arrays as arguments, so one computation serves
  every `x[i]`; its slices, `None` and `...` are part of the computation. An integer past
  its dimension is clamped, as JAX clamps it. A boolean mask (an array or a buffer, fetched)
  is its true places' indices, and a slice's bounds are ints (an integer array or buffer
  fetched), as JAX reads both op by op: the result's shape depends on them. The result is
  replicated.
- `round(x)` / `round(x, n)` and `divmod(x, y)` run as `jax.Array`'s do (`round(x)` to an
  integer dtype).
- The newest `KEPT` operators' functions are kept; an older one is let go of (its
  computations with it) and made again when used again.
- Inside `@c.program` an operation on a buffer is refused as on any of its values: it would
  run outside the program, at trace time.
"""

from __future__ import annotations

import operator
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import jax
import numpy as np
from jax.sharding import PartitionSpec

from client.buffer import Buffer
from client.jit import Calls, Function
from client.slices import Slice
from ir import InvalidArgument


class Operating(Calls, Protocol):
    """What the operators ask of their session: its calls, and its slices by id."""

    slices: dict[str, Slice]


KEPT = 64
LOCAL = (int, float, complex, np.ndarray, np.generic, jax.Array)  # what JAX takes beside an array
TAKEN = object()  # (in an index's layout) a part passed as an argument: an integer or an array
# the methods whose result keeps the buffer's spec
ELEMENTWISE = frozenset({".astype", ".clip", ".round", ".conj", ".real", ".imag", ".copy", ".__pow__",
                         ".__round__"})


class Operators:
    """One session's operators on buffers."""

    def __init__(self, session: Operating) -> None:
        self._session = session
        self._kept: OrderedDict[tuple[Any, ...], Function] = OrderedDict()
        self._lock = threading.Lock()

    def index(self, buffer: Buffer, key: Any) -> Buffer:
        """`buffer[key]` on the executors: integers and arrays in the index are arguments
        (one computation serves every `x[i]`), slices, `None` and `...` part of the
        computation. An integer past the dimension it indexes is clamped, as JAX clamps it."""
        parts = key if isinstance(key, tuple) else (key,)
        layout: list[Any] = []
        taken: list[Any] = []
        for p in parts:
            if isinstance(p, int | np.integer) and not isinstance(p, bool | np.bool_):
                layout.append(TAKEN)
                taken.append(np.int32(p) if -2**31 <= int(p) < 2**31 else np.int64(p))
            elif _is_mask(p):  # concrete, as JAX takes it op by op: its true places' indices
                where = np.nonzero(np.asarray(p))
                layout += [TAKEN] * len(where)
                taken += [w.astype(np.int32) for w in where]
            elif isinstance(p, Buffer | np.ndarray | jax.Array):
                layout.append(TAKEN)
                taken.append(p)
            elif isinstance(p, slice):
                layout.append(("slice", *(_bound(buffer, v) for v in (p.start, p.stop, p.step))))
            elif p is None or p is Ellipsis:
                layout.append(p)
            else:
                raise InvalidArgument(f"buffer {buffer.id}: indexing with a {type(p).__name__} ({p!r}); "
                                      "an index is integers, slices, None, ... and arrays")
        shape = tuple(layout)

        def take(x: Any, *args: Any) -> Any:
            given = iter(args)
            return x[tuple(next(given) if p is TAKEN else slice(*p[1:]) if isinstance(p, tuple) else p
                           for p in shape)]

        return self.apply("indexing", take, (buffer, *taken), layout=shape)

    def method(self, buffer: Buffer, name: str, args: tuple[Any, ...] | None,
               kwargs: dict[str, Any]) -> Buffer:
        """`buffer.name(*args, **kwargs)` (or the property, `args` None) on the executors:
        buffers and arrays among the arguments are its operands (`x.clip(lo, hi)`,
        `x.dot(w)`); the other arguments are part of the computation, so they must hash
        (axes, shapes, dtypes)."""
        taken: list[Any] = []

        def mark(a: Any) -> Any:
            if isinstance(a, Buffer | np.ndarray | jax.Array):
                taken.append(a)
                return TAKEN
            return tuple(a) if isinstance(a, list) else a  # (`x.reshape([2, 3])`, `x.sum(axis=[0, 1])`)

        fixed = None if args is None else tuple(mark(a) for a in args)
        named = tuple((k, mark(v)) for k, v in sorted(kwargs.items()))
        static = (name, fixed, named)
        try:
            hash(static)
        except TypeError:
            raise InvalidArgument(f"buffer {buffer.id}.{name}: its arguments other than arrays are part of "
                                  f"the computation, so they must be hashable (axes, shapes, dtypes); got "
                                  f"{args!r} {kwargs!r}: do it in a jitted function") from None

        def call(x: Any, *operands: Any) -> Any:
            given = iter(operands)
            attribute = getattr(x, name)
            if fixed is None:
                return attribute
            return attribute(*(next(given) if a is TAKEN else a for a in fixed),
                             **{k: next(given) if v is TAKEN else v for k, v in named})

        return self.apply(f".{name}", call, (buffer, *taken), layout=static)

    def apply(self, symbol: str, op: Callable[..., Any], operands: tuple[Any, ...],
              layout: tuple[Any, ...] = ()) -> Any:
        """`op` of the operands (one of them a buffer) on the executors, or `NotImplemented`
        for an operand JAX would not take. `layout` tells apart the ops of one symbol."""
        if not all(isinstance(x, (Buffer, *LOCAL)) for x in operands):
            return NotImplemented
        buffers = [x for x in operands if isinstance(x, Buffer)]
        slice_ids = {b.slice_id for b in buffers}
        if len(slice_ids) > 1:
            a, b = buffers[0], next(b for b in buffers if b.slice_id != buffers[0].slice_id)
            raise InvalidArgument(
                f"{symbol}: buffer {a.id} is on slice {a.slice_id} and buffer {b.id} on slice "
                f"{b.slice_id}; an operator runs on one slice: put one on the other's (c.put), or "
                "do it in a jitted function of one slice")
        s = self._session.slices.get(buffers[0].slice_id)
        if s is None:
            raise InvalidArgument(f"{symbol}: buffer {buffers[0].id} is on slice {buffers[0].slice_id}, "
                                  "which is not one of this client's (deleted)")
        in_specs = tuple(PartitionSpec(*x.spec.entries) if isinstance(x, Buffer) else PartitionSpec()
                         for x in operands)
        out_spec = None if s.explicit else _result_spec(symbol, operands, in_specs)
        key = (symbol, layout, s.id, in_specs, out_spec)
        with self._lock:
            fn = self._kept.get(key)
            if fn is None:
                fn = self._kept[key] = Function(self._session, op, s, in_specs, out_spec,
                                                name=f"operator {symbol}")
                if len(self._kept) > KEPT:
                    self._kept.popitem(last=False)
            else:
                self._kept.move_to_end(key)
        return fn(*operands)


def _is_mask(p: Any) -> bool:
    """A boolean array of at least one dimension (a 0-d one adds an axis, as in JAX)."""
    return (isinstance(p, Buffer | np.ndarray | jax.Array) and np.ndim(p) > 0
            and np.dtype(p.dtype) == np.bool_)


def _bound(buffer: Buffer, v: Any) -> int | None:
    """A slice's start, stop or step as an int (a slice is part of the computation): an
    integer scalar, a buffer or array of one included (fetched), as JAX takes it op by op."""
    if v is None:
        return None
    try:
        return operator.index(v)
    except TypeError:
        raise InvalidArgument(f"buffer {buffer.id}: a slice's bounds are integers, got {v!r} in an "
                              "index") from None


def _result_spec(symbol: str, operands: tuple[Any, ...], specs: tuple[PartitionSpec, ...]) -> PartitionSpec:
    """The spec of a buffer operand whose shape the result has (elementwise), else replicated."""
    if symbol in ("@", "indexing") or (symbol.startswith(".") and symbol not in ELEMENTWISE):
        return PartitionSpec()
    try:
        shape = np.broadcast_shapes(*(np.shape(x) for x in operands))
    except ValueError:  # JAX says why, when the operation is traced
        return PartitionSpec()
    for x, spec in zip(operands, specs, strict=True):
        if isinstance(x, Buffer) and tuple(x.shape) == shape:
            return spec
    return PartitionSpec()
