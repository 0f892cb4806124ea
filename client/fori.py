"""`fori_loop`: `jax.lax.fori_loop` in the graph, a `while_loop` (`client/control_flow.py`)
over a counter on the slice of the carry's first typed leaf. With an integer counter the loop
is counted (`WhileAttrs.counted`): its trip count is computed once as it is entered, and each
host counts its iterations; a counter the body does not read is an invariant, with no
increment (`control_flow._unread_counter`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from client.arrays import PLAIN, is_key
from client.control_flow import _computed, _flatten, _is_traced, _trace, _while_loop
from client.jit import Function
from client.slices import Slice
from client.trace import Trace, tracing
from ir import Aval, InvalidArgument, Spec, parse_dtype


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any, Any], Any], init_val: Any,
              parallel_iterations: int | None = None, swap: bool = True, remat: bool = False) -> Any:
    """`jax.lax.fori_loop` in the graph: `for i in range(lower, upper): val = body_fun(i, val)`.
    The counter lives on the slice of the carry's first typed leaf (with none typed yet, of
    the first jitted function the program, or else the body, calls). Its type is
    `jax.lax.fori_loop`'s: the bounds' dtype, equal or a Python int's promoted to the other
    bound's signed integer type (else refused); with both bounds constants, `int()` of each
    and a weakly typed int counter, as `jax.lax.fori_loop` counts a loop of known length.
    `parallel_iterations`, `swap` and `remat` as in `while_loop`. With an integer counter,
    the trip count, `upper - lower` (none where not positive), is computed once, on the
    counter's slice, as the loop is entered: each host of the loop then counts its
    iterations itself, with no predicate computed or sent per iteration
    (`WhileAttrs.counted`)."""
    trace = _trace("fori_loop")
    dtype = _counter_dtype(trace, lower, upper)
    leaves, treedef, _ = _flatten(trace, init_val)
    typed = [t for v in leaves if (t := trace.values[v].type) is not None]
    if not typed and not trace.slices:  # the slice of the body's first jitted function, then
        _probe(trace, body_fun, leaves, treedef)
    if not typed and not trace.slices:
        raise InvalidArgument("fori_loop: the counter needs a slice: carry a value computed by a "
                              "jitted function")
    where = trace.slices[typed[0].slice] if typed else next(iter(trace.slices.values()))
    inc = Function(None, lambda i: i + 1, where, in_specs=None, out_specs=None, name="fori_next")
    # An integer counter's loop is counted: the cond gives its trip count, once; a float
    # counter's (as jax.lax.fori_loop allows) is tested each iteration.
    counted = np.issubdtype(dtype, np.integer)
    test, what = (_trips, "trips") if counted else (lambda i, u: i < u, "below")
    if not _computed(lower) and not _computed(upper):  # a known trip count
        start, bound = _constant_bound(lower, "lower"), _constant_bound(upper, "upper")
        to = Function(None, lambda i: test(i, bound), where, name=f"fori_{what}_{bound}")
        cond: Callable[[Any], Any] = lambda c: to(c[0])  # noqa: E731
    else:
        start = _as(where, lower, dtype)
        if _computed(upper):
            up = Function(None, lambda i, u: test(i, jax.lax.convert_element_type(u, dtype)), where,
                          name=f"fori_{what}")
            cond = lambda c: up(c[0], upper)  # noqa: E731
        else:
            limit = np.asarray(upper, dtype)
            to = Function(None, lambda i: test(i, limit), where, name=f"fori_{what}_{limit}")
            cond = lambda c: to(c[0])  # noqa: E731
    counter = trace.use(trace.leaf(start), where, Spec(()))

    def step(c: tuple[Any, Any]) -> tuple[Any, Any]:
        out = body_fun(c[0], c[1])
        _check_returned(out, treedef)
        return inc(c[0]), out

    _, carry = _while_loop(cond, step, (trace.traced(counter), init_val), parallel_iterations,
                           "fori_loop", carried="[1]", swap=swap, counted=counted, remat=remat)
    return carry


def _trips(i: Any, upper: Any) -> Any:
    """How many iterations `range(i, upper)` has: `upper - i`, or 0."""
    return jax.numpy.where(i < upper, upper - i, jax.numpy.zeros_like(i))


def _counter_dtype(trace: Trace, lower: Any, upper: Any) -> np.dtype:
    """`jax.lax.fori_loop`'s counter type: the bounds' dtype if equal; a weakly typed (Python)
    int takes the other bound's signed integer type; any other pair is refused."""
    low, low_weak = _bound_type(trace, lower, "lower")
    up, up_weak = _bound_type(trace, upper, "upper")
    if low == up:
        return low
    if np.issubdtype(low, np.signedinteger) and np.issubdtype(up, np.signedinteger) and low_weak != up_weak:
        return up if low_weak else low
    raise InvalidArgument(f"fori_loop: lower and upper must have equal types, as for jax.lax.fori_loop; "
                          f"got {low.name} and {up.name}")


def _bound_type(trace: Trace, x: Any, what: str) -> tuple[np.dtype, bool]:
    """A bound's dtype and whether it is weakly typed; a bound is a scalar."""
    if _computed(x):
        value = trace.values[trace.leaf(x)]
        aval, weak, key = value.aval, value.view.weak, value.view.key
        if aval.shape == () and key is None:
            return parse_dtype(aval.dtype), weak
        raise InvalidArgument(f"fori_loop: {what} must be a scalar, as for jax.lax.fori_loop; found {aval}")
    if np.shape(x) != () or is_key(x):
        raise InvalidArgument(f"fori_loop: {what} must be a scalar, as for jax.lax.fori_loop; found shape "
                              f"{np.shape(x)}{' keys' if is_key(x) else ''}")
    return np.dtype(jax.dtypes.result_type(x)), type(x) in (int, float, complex)


def _constant_bound(x: Any, what: str) -> int:
    """A constant bound as `jax.lax.fori_loop` takes one: `int(x)`, which the counter (a
    weakly typed int) must hold."""
    try:
        bound = int(x)
    except (TypeError, ValueError, OverflowError) as e:
        raise InvalidArgument(f"fori_loop: {what} bound {x!r} is not an integer: {e}") from None
    info = np.iinfo(jax.dtypes.canonicalize_dtype(np.int64))
    if not info.min <= bound <= info.max:
        raise InvalidArgument(f"fori_loop: {what} bound {bound} does not fit the counter's {info.dtype.name} "
                              "(jax_enable_x64 makes it int64)")
    return bound


def _as(where: Slice, x: Any, dtype: np.dtype) -> Any:
    """The loop's first counter: `x` (a bound) as `dtype`, converted as jax.lax.fori_loop
    converts it (a computed one by a jitted function, where its type differs)."""
    if not _computed(x):
        return np.asarray(x, dtype)
    if x.dtype == dtype:
        return x
    return Function(None, lambda v: jax.lax.convert_element_type(v, dtype), where,
                    name=f"fori_as_{dtype.name}")(x)


def _probe(trace: Trace, body_fun: Callable[[Any, Any], Any], leaves: Sequence[int], treedef: Any) -> None:
    """Trace `body_fun` once in a child trace that is then dropped, so the program learns the
    slices it calls (`trace.slices`); the loop itself traces it again."""
    child = trace.child()
    counter = child.new_arg(Aval((), "int32"), PLAIN, None)
    args = [child.new_arg(trace.values[v].aval, trace.values[v].view, trace.typed(v)) for v in leaves]
    carry = jax.tree_util.tree_unflatten(treedef, [child.traced(v) for v in args])
    with tracing(child):
        out = body_fun(child.traced(counter), carry)
    _check_returned(out, treedef)  # (a mistake told before the want of a slice it may cause)


def _check_returned(out: Any, treedef: Any) -> None:
    if (returned := jax.tree_util.tree_structure(out, is_leaf=_is_traced)) != treedef:
        raise InvalidArgument(f"fori_loop: body_fun must return the carry's structure {treedef}; "
                              f"it returned {returned}")
