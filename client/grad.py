"""`isthmus.grad` and `isthmus.value_and_grad` inside `@c.program`, shaped like JAX's.

`fun` composes `c.jit` functions on any slices and islands; its arguments and results are
pytrees. It is traced into a sub-graph of the program (as a branch of `cond` is), which
`ir.autodiff.reverse` turns into the forward pass and then the cotangents, each
computation's VJP exported from JAX (`client.vjp`: its forward with residuals, its
backward); the result is inlined into the program, so the gradients are computed on the
hosts, across islands, in the same run as everything else.

- The loss (`fun`'s result, or its first with `has_aux`) must be a real or complex scalar,
  and the arguments differentiated in (`argnums`) of inexact dtypes, as for `jax.grad`
  (with `allow_int`, an integer input's gradient is float0 zeros, made in the client).
- Branches (`cond`) and loops (`while_loop`, `fori_loop`) are differentiated on the
  hosts (`ir.autodiff`): the backward takes the branch the forward took, and runs a loop's
  trip count backwards, popping the forward values each iteration saved on its hosts.
- Outside a program there is nothing to differentiate: `InvalidArgument`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from client.context import tracing
from client.control_flow import _captured, _emit, _flatten, _slice_of, _trace
from client.slices import Slice
from client.trace import Names, Trace
from client.vjp import export_add, export_fill
from ir import (
    Artifact,
    ComputeAttrs,
    InvalidArgument,
    MeshAxes,
    Program,
    ProgramBuilder,
    Sig,
    Spec,
    Type,
    value_types,
)
from ir.autodiff import Vjp, inexact, reverse

__all__ = ["grad", "value_and_grad"]


def value_and_grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False,
                   allow_int: bool = False) -> Callable[..., Any]:
    """`fun`'s value and its gradient in the arguments `argnums`, as `jax.value_and_grad`:
    `(value, grads)`, or with `has_aux` `((value, aux), grads)`; grads in `argnums`'s shape
    (with `allow_int`, an integer or boolean input's is float0 zeros, as in JAX)."""
    positions = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not positions or not all(isinstance(k, int) for k in positions):
        raise InvalidArgument(f"value_and_grad: argnums: expected an int or a tuple of ints, got {argnums!r}")

    def wrapped(*args: Any) -> Any:
        trace = _trace("value_and_grad")
        if any(not -len(args) <= k < len(args) for k in positions):
            raise InvalidArgument(f"value_and_grad: argnums {argnums!r} for a function given {len(args)} "
                                  "arguments")
        chosen = [k % len(args) for k in positions]
        value, aux, grads = _differentiate(trace, fun, args, chosen, has_aux, allow_int)
        grads_out = grads[0] if isinstance(argnums, int) else tuple(grads)
        return ((value, aux) if has_aux else value), grads_out

    return wrapped


def grad(fun: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False,
         allow_int: bool = False) -> Callable[..., Any]:
    """`fun`'s gradient in the arguments `argnums`, as `jax.grad` (with `has_aux`: `(grads, aux)`)."""
    both = value_and_grad(fun, argnums, has_aux, allow_int)

    def wrapped(*args: Any) -> Any:
        value, grads = both(*args)
        return (grads, value[1]) if has_aux else grads

    return wrapped


@dataclass
class _Inline:
    """The differentiated sub-graph, its arguments bound to values of the enclosing trace."""

    program: Program
    inputs: list[int]
    outputs: list[int]

    def emit(self, trace: Trace, b: ProgramBuilder, names: Names) -> None:
        made = b.inline(self.program, [names[v] for v in self.inputs])
        names.update(zip(self.outputs, made, strict=True))


def _differentiate(trace: Trace, fun: Callable[..., Any], args: tuple[Any, ...], chosen: Sequence[int],
                   has_aux: bool, allow_int: bool) -> tuple[Any, Any, list[Any]]:
    """Trace `fun` in a child trace, differentiate it, inline it; its value, aux and grads."""
    per_arg = [_flatten(trace, a) for a in args]
    ops = [trace.local(v) if trace.typed(v) is not None else v for leaves, _, _ in per_arg for v in leaves]
    starts = np.cumsum([0] + [len(leaves) for leaves, _, _ in per_arg]).tolist()
    child = trace.child()
    cargs = [child.new_arg(trace.values[v].aval, trace.values[v].view, trace.typed(v)) for v in ops]
    inputs = [jax.tree_util.tree_unflatten(treedef, [child.traced(v) for v in cargs[starts[i]:starts[i + 1]]])
              for i, (_, treedef, _) in enumerate(per_arg)]
    with tracing(child):
        out = fun(*inputs)
    aux: Any = None
    if has_aux:
        if not (isinstance(out, tuple) and len(out) == 2):
            raise InvalidArgument("value_and_grad: with has_aux, the function must return a (loss, aux) pair")
        out, aux = out
    loss_leaves, _, _ = _flatten(child, out)
    if len(loss_leaves) != 1:
        raise InvalidArgument("value_and_grad: the function must return one scalar (the loss), as for "
                              f"jax.grad; it returned {len(loss_leaves)} values")
    loss_aval = child.values[loss_leaves[0]].aval
    if loss_aval.shape != ():
        raise InvalidArgument(f"value_and_grad: the loss must be a scalar, as for jax.grad; the function "
                              f"returned {loss_aval}")
    for i, v in enumerate(ops):  # an argument untyped here: as its first consumer wants it
        want = child.typed(cargs[i])
        if want is not None and trace.typed(v) != want:
            ops[i] = trace.use(v, trace.slices[want.slice], want.spec)
    where = _slice_of(trace, ops, "value_and_grad")
    for i, v in enumerate(ops):  # read by nothing in `fun`
        if trace.typed(v) is None:
            ops[i] = trace.use(v, where, Spec(()))
        if child.values[cargs[i]].type is None:
            child.values[cargs[i]].type = trace.typed(ops[i])
    leaves = [j for k in chosen for j in range(starts[k], starts[k + 1])]
    wrt = [j for j in leaves if inexact(_typed(child, cargs[j]))]
    if not allow_int and len(wrt) < len(leaves):
        j = next(j for j in leaves if j not in wrt)
        raise InvalidArgument(f"value_and_grad: argument leaf {j} is {_typed(child, cargs[j]).aval}: grad "
                              "requires real- or complex-valued inputs, as jax.grad does (allow_int=True "
                              "gives an integer input a float0 gradient)")
    aux_leaves, aux_def, _ = _flatten(child, aux) if has_aux else ([], None, [])
    results = [_settled(child, v, where) for v in (loss_leaves[0], *aux_leaves)]
    captured = _captured([child], [])
    cargs += [child.captures[v] for v in captured]
    differentiated = reverse(_program(trace, child, cargs, results), wrt, _Rules(trace),
                             stacks=f"g{next(trace.grads)}")
    types = [value_types(differentiated)[r] for r in differentiated.graph.results]
    views = [child.values[v].view for v in results] + [child.values[cargs[j]].view for j in wrt]
    outputs = [trace.new_value(t.aval, view, t) for t, view in zip(types, views, strict=True)]
    trace.add(_Inline(differentiated, ops + captured, outputs))
    aux_out = None if aux_def is None else jax.tree_util.tree_unflatten(
        aux_def, [trace.traced(v) for v in outputs[1:len(results)]])
    computed = iter(outputs[len(results):])
    grads_flat = [trace.traced(next(computed)) if j in wrt
                  else np.zeros(_typed(child, cargs[j]).aval.shape, jax.dtypes.float0) for j in leaves]
    grads, at = [], 0
    for k in chosen:
        n = starts[k + 1] - starts[k]
        grads.append(jax.tree_util.tree_unflatten(per_arg[k][1], grads_flat[at:at + n]))
        at += n
    return trace.traced(outputs[0]), aux_out, grads


def _typed(child: Trace, value: int) -> Type:
    t = child.typed(value)
    assert t is not None, "every argument of the sub-graph is typed by then"
    return t


def _settled(child: Trace, value: int, where: Slice) -> int:
    """A result of `fun` as a value of its sub-graph (a constant placed where it runs)."""
    return child.local(value) if child.typed(value) is not None else child.use(value, where, Spec(()))


def _program(trace: Trace, child: Trace, args: Sequence[int], results: Sequence[int]) -> Program:
    """`child`'s ops as a program of its own, over every slice the trace knows."""
    b = ProgramBuilder()
    for s in trace.slices.values():
        b.slice(s.id, MeshAxes.of(s.mesh), s.island)
    _emit(child, b, args, results, {})
    return b.build()


class _Rules:
    """`ir.autodiff.Rules` from JAX: each computation's VJP exported from the function it was
    traced from (`Trace.sources`), and the small computations the pass adds."""

    def __init__(self, trace: Trace) -> None:
        self._trace = trace
        self._vjps: dict[tuple[str, tuple[bool, ...], tuple[bool, ...], tuple[bool, ...]], Vjp] = {}

    def vjp(self, node: ComputeAttrs, wrt: tuple[bool, ...], cts: tuple[bool, ...],
            acc: tuple[bool, ...] = ()) -> Vjp:
        key = (node.artifact, wrt, cts, acc)
        if key not in self._vjps:
            found = self._trace.sources.get(node.artifact)
            if found is None:
                raise InvalidArgument(f"value_and_grad: {node.name} was not traced from a JAX function here")
            ref, exported = found
            fn = ref()
            if fn is None:  # (held by the function being differentiated while it is traced)
                raise InvalidArgument(f"value_and_grad: {node.name}'s function is gone")
            try:
                made = fn.vjp(exported, wrt, cts, acc)
            except InvalidArgument:
                raise
            except Exception as e:  # JAX's own refusal (a lax.while_loop inside, say): by name
                reason = str(e).strip().split("\n", 1)[0]
                raise InvalidArgument(f"value_and_grad: {node.name} cannot be differentiated: "
                                      f"{type(e).__name__}: {reason}") from None
            self._vjps[key] = Vjp(Artifact.of(made.fwd), tuple(Sig(a, s) for a, s in made.residuals),
                                  Artifact.of(made.bwd), made.sources)
        return self._vjps[key]

    def zeros(self, t: Type) -> Artifact:
        return Artifact.of(export_fill(t.aval, t.spec, 0, *self._where(t)))

    def ones(self, t: Type) -> Artifact:
        return Artifact.of(export_fill(t.aval, t.spec, 1, *self._where(t)))

    def add(self, t: Type, n: int) -> Artifact:
        return Artifact.of(export_add(t.aval, t.spec, n, *self._where(t)))

    def _where(self, t: Type) -> tuple[Any, str]:
        s = self._trace.slices[t.slice]
        return s.abstract_mesh, s.export_platform
