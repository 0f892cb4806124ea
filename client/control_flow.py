"""In-graph control flow inside `@c.program`: `while_loop`, `cond`, `fori_loop`, shaped like
`jax.lax`'s.

Contract:
- Values are pytrees of traced values (outputs of jitted functions, program arguments,
  buffers); the functions compose `c.jit` functions on any slices and islands. Each
  function is traced once, in a child trace (`client.trace`), into a closed sub-graph of
  one `WHILE` or `COND` node: the loop or branch then runs on the hosts, with no round trip
  to the client or the server per iteration.
- A loop's carry keeps its type: each leaf's aval is checked at trace time (the error names
  the leaf's path and both avals), and a body result on another slice or spec is moved back
  where its carry lives. A carry leaf not typed yet (an array argument) takes the type its
  first consumer in the loop wants.
- Values captured from outside a loop or branch become extra carried values the body
  returns unchanged (loop invariants: lowering enters them once) or extra operands; they
  are moved where their use wants them before the loop, so once.
- `cond`'s results take the types of `true_fun`'s; the other branch's results are moved
  there inside the branch. `pred` is a bool[] scalar (or an int32[] index into
  `(false_fun, true_fun)`, clamped, as `lax.switch`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from client.trace import Names, Trace, Traced, current_trace, tracing
from ir import Aval, InvalidArgument, ProgramBuilder, Spec, Type
from ir.ops import check_parallel_iterations

__all__ = ["cond", "fori_loop", "while_loop"]

BOOL = Aval((), "bool")


def _trace(what: str) -> Trace:
    trace = current_trace()
    if trace is None:
        raise InvalidArgument(f"isthmus.{what}: call it inside a @c.program function (it runs in the graph)")
    return trace


def _flatten(trace: Trace, tree: Any) -> tuple[list[int], Any, list[str]]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, Traced))
    return [trace.leaf(x) for _, x in flat], treedef, [jax.tree_util.keystr(p) or "(root)" for p, _ in flat]


def _graph(trace: Trace, b: ProgramBuilder, args: Sequence[int], results: Sequence[int],
           names: Names) -> Any:
    sub = b.sub()
    for v in args:
        t = trace.values[v].type
        assert t is not None
        names[v] = sub.arg(t.aval, t.spec, t.slice)
    trace.emit_ops(sub, names)
    sub.result(*(names[v] for v in results))
    return sub.graph()


def _settle(parent: Trace, child: Trace, value: int, want: Type | None) -> int:
    """`value` (a result of `child`) as a value of `child` of type `want` (moved if needed)."""
    value = child.local(value)
    if want is None or child.values[value].type == want:
        return value
    return child.use(value, parent.slices[want.slice], want.spec)


@dataclass
class _While:
    carry: list[int]  # in the enclosing trace: init values, then captured invariants
    cond: Trace
    body: Trace
    cond_args: list[int]
    body_args: list[int]
    pred: int
    results: list[int]  # in body, one per carry
    outputs: list[int]
    parallel_iterations: int

    def emit(self, trace: Trace, b: ProgramBuilder, names: Names) -> None:
        cond = _graph(self.cond, b, self.cond_args, [self.pred], names)
        body = _graph(self.body, b, self.body_args, self.results, names)
        outs = b.while_([names[v] for v in self.carry], cond, body, self.parallel_iterations)
        names.update(zip(self.outputs, outs, strict=True))


@dataclass
class _Cond:
    pred: int
    operands: list[int]
    branches: list[Trace]
    args: list[list[int]]
    results: list[list[int]]
    outputs: list[int]

    def emit(self, trace: Trace, b: ProgramBuilder, names: Names) -> None:
        parts = zip(self.branches, self.args, self.results, strict=True)
        graphs = [_graph(t, b, a, r, names) for t, a, r in parts]
        defined = b.cond(names[self.pred], [names[v] for v in self.operands], graphs)
        names.update(zip(self.outputs, defined, strict=True))


def _captured(children: Sequence[Trace], already: Sequence[int]) -> list[int]:
    """Values of the enclosing trace captured by any child, in first-capture order."""
    seen = dict.fromkeys(v for c in children for v in c.captures if v not in already)
    for child in children:  # every child gets an argument for each, used or not
        for v in seen:
            child.local(v)
    return list(seen)


def while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any], init_val: Any,
               parallel_iterations: int | None = None) -> Any:
    """`jax.lax.while_loop` in the graph: `while cond_fun(val): val = body_fun(val)`.

    `parallel_iterations` (default: the program's, 1 unless `c.program` says otherwise):
    how many iterations each host may run at once. Iteration k + 1 begins on a host once
    iteration k has taken the body, and its steps run as soon as what they read is there,
    so a counter and a predicate can run ahead of a value still crossing hosts. A loop
    whose computations span hosts (an island's JAX group) runs one iteration at a time
    whatever this asks: its hosts must enter those collectives in one order."""
    trace = _trace("while_loop")
    parallel = trace.root.parallel_iterations if parallel_iterations is None else \
        check_parallel_iterations(parallel_iterations)
    init, treedef, paths = _flatten(trace, init_val)
    init = [trace.local(v) for v in init]
    cond, body = trace.child(), trace.child()
    avals = [trace.values[v].aval for v in init]
    views = [trace.values[v].view for v in init]
    cond_args = [cond.new_arg(a, w, trace.typed(v)) for v, a, w in zip(init, avals, views, strict=True)]
    with tracing(cond):
        pred_tree = cond_fun(jax.tree_util.tree_unflatten(treedef, [cond.traced(v) for v in cond_args]))
    pred_leaves, _, _ = _flatten(cond, pred_tree)
    if len(pred_leaves) != 1 or cond.values[pred_leaves[0]].aval != BOOL:
        found = ", ".join(str(cond.values[v].aval) for v in pred_leaves)
        raise InvalidArgument(f"while_loop: cond_fun must return one bool[] scalar; it returned ({found})")
    pred = cond.local(pred_leaves[0])
    types = [cond.typed(v) for v in cond_args]  # the cond may have typed an array argument
    body_args = [body.new_arg(a, w, t) for a, w, t in zip(avals, views, types, strict=True)]
    with tracing(body):
        out = body_fun(jax.tree_util.tree_unflatten(treedef, [body.traced(v) for v in body_args]))
    out_leaves, out_def, _ = _flatten(body, out)
    if out_def != treedef:
        raise InvalidArgument(f"while_loop: body_fun must return the carry's structure {treedef}; "
                              f"it returned {out_def}")
    results = []
    for k, (v, path) in enumerate(zip(out_leaves, paths, strict=True)):
        found = body.values[v].aval
        if found != avals[k] or body.values[v].view.key != views[k].key:
            raise InvalidArgument(f"while_loop: carry leaf {path}: body_fun returns {_shown(body, v)}, "
                                  f"the carry (init_val) is {_shown(trace, init[k])}")
        want = body.typed(body_args[k]) or body.typed(v)
        if want is None:
            raise InvalidArgument(f"while_loop: carry leaf {path} has no slice: pass it through a jitted "
                                  "function before the loop")
        for t, a in ((cond, cond_args[k]), (body, body_args[k])):  # typed where not consumed yet
            if t.values[a].type is None:
                t.values[a].type = want
        results.append(_settle(trace, body, v, want))
    carried = [body.typed(a) for a in body_args]
    init = [trace.use(v, trace.slices[t.slice], t.spec) for v, t in zip(init, carried, strict=True) if t]
    captured = _captured([cond, body], [])
    cond_args += [cond.captures[v] for v in captured]
    body_args += [body.captures[v] for v in captured]
    results += [body.captures[v] for v in captured]  # invariants: returned unchanged
    outputs = [trace.new_value(a, w, t) for a, w, t in zip(avals, views, carried, strict=True)]
    unused = [trace.new_value(trace.values[v].aval, trace.values[v].view, trace.typed(v)) for v in captured]
    trace.add(_While(init + captured, cond, body, cond_args, body_args, pred, results, outputs + unused,
                     parallel))
    return jax.tree_util.tree_unflatten(treedef, [trace.traced(v) for v in outputs])


def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any], *operands: Any) -> Any:
    """`jax.lax.cond` in the graph: `true_fun(*operands) if pred else false_fun(*operands)`;
    only the chosen branch computes, the other's hosts see dead values and finish."""
    trace = _trace("cond")
    p = trace.leaf(pred) if isinstance(pred, Traced) else None
    if p is None or trace.values[p].aval not in (BOOL, Aval((), "int32")):
        raise InvalidArgument("cond: pred must be a traced bool[] (or int32[]) scalar computed by a jitted "
                              f"function; found {pred!r}")
    if trace.values[p].type is None:
        raise InvalidArgument("cond: pred has no slice yet: compute it with a jitted function")
    p = trace.local(p)
    ops, treedef, _ = _flatten(trace, list(operands))
    for v in ops:
        if trace.values[v].type is None:
            raise InvalidArgument("cond: an operand has no slice yet: pass it through a jitted "
                                  "function first")
    ops = [trace.local(v) for v in ops]
    branches, args, outs = [], [], []
    for fn in (false_fun, true_fun):
        child = trace.child()
        a = [child.new_arg(trace.values[v].aval, trace.values[v].view, trace.values[v].type) for v in ops]
        with tracing(child):
            out = fn(*jax.tree_util.tree_unflatten(treedef, [child.traced(v) for v in a]))
        branches.append(child)
        args.append(a)
        outs.append(_flatten(child, out))
    (f_leaves, f_def, _), (t_leaves, t_def, t_paths) = outs
    if f_def != t_def:
        raise InvalidArgument(f"cond: true_fun returns {t_def} but false_fun returns {f_def}")
    results: list[list[int]] = [[], []]
    types = []
    for k, path in enumerate(t_paths):
        t_v, f_v = branches[1].local(t_leaves[k]), branches[0].local(f_leaves[k])
        t_val, f_val = branches[1].values[t_v], branches[0].values[f_v]
        if t_val.aval != f_val.aval or t_val.view.key != f_val.view.key:
            raise InvalidArgument(f"cond: result leaf {path}: true_fun returns {_shown(branches[1], t_v)}, "
                                  f"false_fun {_shown(branches[0], f_v)}")
        want = branches[1].typed(t_v)
        results[1].append(t_v)
        results[0].append(_settle(trace, branches[0], f_v, want))
        types.append(want)
    captured = _captured(branches, [])
    for k, child in enumerate(branches):
        args[k] += [child.captures[v] for v in captured]
    outputs = [trace.new_value(trace.values[r].aval, trace.values[r].view, t)
               for r, t in zip(results[1], types, strict=True)]
    trace.add(_Cond(p, ops + captured, branches, args, results, outputs))
    return jax.tree_util.tree_unflatten(t_def, [trace.traced(v) for v in outputs])


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any, Any], Any], init_val: Any,
              parallel_iterations: int | None = None) -> Any:
    """`jax.lax.fori_loop` in the graph: `for i in range(lower, upper): val = body_fun(i, val)`.
    The counter is an int32[] on the slice of the carry's first typed leaf.
    `parallel_iterations` as in `while_loop`."""
    from client.jit import Function

    trace = _trace("fori_loop")
    leaves, _, _ = _flatten(trace, init_val)
    typed = [trace.values[v].type for v in leaves if trace.values[v].type is not None]
    if not typed and not trace.slices:
        raise InvalidArgument("fori_loop: the counter needs a slice: carry a value computed by a "
                              "jitted function")
    where = trace.slices[typed[0].slice] if typed else next(iter(trace.slices.values()))
    inc = Function(None, lambda i: i + 1, where, in_specs=None, out_specs=None, name="fori_next")
    if isinstance(upper, Traced):
        less = Function(None, lambda i, u: i < u, where, name="fori_less")
        keep_going = lambda c: less(c[0], upper)  # noqa: E731
    else:
        bound = int(upper)
        below = Function(None, lambda i: i < bound, where, name=f"fori_below_{bound}")
        keep_going = lambda c: below(c[0])  # noqa: E731
    start = lower if isinstance(lower, Traced) else np.int32(lower)
    counter = trace.use(trace.leaf(start), where, Spec(()))
    _, carry = while_loop(keep_going, lambda c: (inc(c[0]), body_fun(c[0], c[1])),
                          (trace.traced(counter), init_val), parallel_iterations)
    return carry


def _shown(trace: Trace, value: int) -> str:
    """A value's type as the user's functions see it: its aval, or its typed keys'."""
    v = trace.values[value]
    return str(v.aval) if v.view.key is None else f"key<{v.view.key}> keys of data {v.aval}"
