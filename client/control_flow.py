"""In-graph control flow inside `@c.program`: `while_loop` and `cond`, shaped like
`jax.lax`'s (`fori_loop`, a `while_loop` over a counter, is `client/fori.py`).

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
  there inside the branch. `pred` is a bool or numeric scalar; a number is true when it is
  not 0, as for `lax.cond`.
- A constant (an array or scalar no jitted function has read yet) may be a carry, a branch
  or body result, or a predicate, at any depth of loops: it takes the type its loop's or
  branch's use gives it (a carry's, else the cond's slice), as `jax.lax` takes constants.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from client.arrays import View
from client.jit import Function
from client.slices import Slice
from client.trace import Names, Trace, Traced, current_trace, tracing
from ir import Aval, Graph, InvalidArgument, Node, Op, ProgramBuilder, Spec, Type, parse_dtype
from ir.ops import ResultAttrs, check_parallel_iterations

__all__ = ["cond", "while_loop"]

BOOL = Aval((), "bool")


def _trace(what: str) -> Trace:
    trace = current_trace()
    if trace is None:
        raise InvalidArgument(f"isthmus.{what}: call it inside a @c.program function (it runs in the graph)")
    return trace


def _flatten(trace: Trace, tree: Any) -> tuple[list[int], Any, list[str]]:
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_traced)
    return [trace.leaf(x) for _, x in flat], treedef, [jax.tree_util.keystr(p) or "(root)" for p, _ in flat]


def _graph(trace: Trace, b: ProgramBuilder, args: Sequence[int], results: Sequence[int],
           names: Names) -> Any:
    sub = b.sub()
    _emit(trace, sub, args, results, names)
    return sub.graph()


def _unread_counter(body: Graph) -> Graph:
    """A counted loop's body whose counter (carry 0) nothing reads but its own increment: the
    increment left out and the counter returned unchanged, an invariant (entered once, no
    computation an iteration). The count was taken from the counter as the loop was entered,
    and the loop's result for it is not the user's."""
    counter = body.args[0]
    chain: set[int] = set()  # the nodes the counter's value flows through
    made = {counter}
    for i, node in enumerate(body.nodes[:-1]):
        if made & set(node.inputs):
            if node.op not in (Op.COMPUTE, Op.TRANSFER):
                return body
            chain.add(i)
            made.update(node.outputs)
    reads = [v for i, n in enumerate(body.nodes[:-1]) if i not in chain for v in n.inputs]
    results = body.results
    if not chain or made & set(reads) or made & set(results[1:]) or results[0] not in made:
        return body  # the body reads it, or returns it elsewhere
    kept = tuple(n for i, n in enumerate(body.nodes[:-1]) if i not in chain)
    return Graph((*kept, Node(Op.RESULT, (counter, *results[1:]), (), ResultAttrs())))


def _emit(trace: Trace, b: ProgramBuilder, args: Sequence[int], results: Sequence[int], names: Names) -> None:
    """`trace`'s arguments, ops and results into `b`."""
    for v in args:
        t = trace.values[v].type
        assert t is not None
        names[v] = b.arg(t.aval, t.spec, t.slice)
    trace.emit_ops(b, names)
    b.result(*(names[v] for v in results))


def _settle(parent: Trace, child: Trace, value: int, want: Type | None) -> int:
    """`value` (a result of `child`) as a value of `child` of type `want` (moved if needed);
    a constant no computation has read yet is placed as `want` says."""
    if want is not None and child.typed(value) is None:
        return child.use(value, parent.slices[want.slice], want.spec)
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
    swap: bool
    counted: bool = False  # `pred` is the trip count, computed once (`WhileAttrs.counted`)
    remat: bool = False  # its gradient computes the body's residuals again (`WhileAttrs.remat`)
    counter: bool = False  # carry 0 is a counted loop's counter, whose result no one reads

    def emit(self, trace: Trace, b: ProgramBuilder, names: Names) -> None:
        cond = _graph(self.cond, b, self.cond_args, [self.pred], names)
        body = _graph(self.body, b, self.body_args, self.results, names)
        if self.counter:
            body = _unread_counter(body)
        outs = b.while_([names[v] for v in self.carry], cond, body, self.parallel_iterations, self.swap,
                        counted=self.counted, remat=self.remat)
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
               parallel_iterations: int | None = None, swap: bool = True, remat: bool = False) -> Any:
    """`jax.lax.while_loop` in the graph: `while cond_fun(val): val = body_fun(val)`.

    `parallel_iterations` (default: the program's, 1 unless `c.program` says otherwise):
    how many iterations each host may run at once. Iteration k + 1 begins on a host once
    iteration k has taken the body, and its steps run as soon as what they read is there,
    so a counter and a predicate can run ahead of a value still crossing hosts. A loop
    whose computations span hosts (an island's JAX group) runs one iteration at a time
    whatever this asks: its hosts must enter those collectives in one order. So does a loop
    `isthmus.grad` differentiates: its hosts count its iterations for its backward.

    `swap`: whether the values its gradient saves per iteration (`isthmus.grad`) may move to
    host memory once a host's stacks pass their budget on its devices (`executor_stack_mb`);
    with False, a run whose stacks do not fit there fails, naming the budget.

    `remat`: its gradient saves only each iteration's carry, and its backward computes the
    body's forward again from it before going back through it (`jax.checkpoint`'s trade:
    less saved per iteration, the body's forward computed twice)."""
    return _while_loop(cond_fun, body_fun, init_val, parallel_iterations, "while_loop", swap=swap,
                       remat=remat)


def _while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any], init_val: Any,
                parallel_iterations: int | None, what: str, carried: str = "", swap: bool = True,
                counted: bool = False, remat: bool = False) -> Any:
    """`while_loop`, for `what` (a `fori_loop` too): errors name the user's function and the
    paths of the carry under `carried` (the path of the user's carry within `init_val`).
    `counted`: `cond_fun` gives the trip count from the carry entered (`fori_loop`'s)."""
    trace = _trace(what)
    for name, flag in (("swap", swap), ("remat", remat)):
        if not isinstance(flag, bool):
            raise InvalidArgument(f"{what}: {name} must be True or False, found {flag!r}")
    parallel = trace.root.parallel_iterations if parallel_iterations is None else \
        check_parallel_iterations(parallel_iterations)
    init, treedef, paths = _flatten(trace, init_val)
    init = [trace.local(v) if trace.typed(v) is not None else v for v in init]  # constants: typed below
    cond, body = trace.child(), trace.child()
    avals = [trace.values[v].aval for v in init]
    views = [trace.values[v].view for v in init]
    cond_args = [cond.new_arg(a, w, trace.typed(v)) for v, a, w in zip(init, avals, views, strict=True)]
    with tracing(cond):
        pred_tree = cond_fun(jax.tree_util.tree_unflatten(treedef, [cond.traced(v) for v in cond_args]))
    pred_leaves, _, _ = _flatten(cond, pred_tree)
    if counted:  # (made here, by fori_loop: always one integer scalar)
        assert len(pred_leaves) == 1 and np.dtype(cond.values[pred_leaves[0]].aval.dtype).kind in "iu"
    elif len(pred_leaves) != 1 or cond.values[pred_leaves[0]].aval != BOOL:
        found = ", ".join(str(cond.values[v].aval) for v in pred_leaves)
        raise InvalidArgument(f"{what}: cond_fun must return one bool[] scalar; it returned ({found})")
    pred = pred_leaves[0]
    if cond.typed(pred) is not None:
        pred = cond.local(pred)
    types = [cond.typed(v) for v in cond_args]  # the cond may have typed an array argument
    body_args = [body.new_arg(a, w, t) for a, w, t in zip(avals, views, types, strict=True)]
    with tracing(body):
        out = body_fun(jax.tree_util.tree_unflatten(treedef, [body.traced(v) for v in body_args]))
    out_leaves, out_def, _ = _flatten(body, out)
    if out_def != treedef:
        raise InvalidArgument(f"{what}: body_fun must return the carry's structure {treedef}; "
                              f"it returned {out_def}")
    promoted = _promoted(trace, init_val, init, [body.values[v].aval for v in out_leaves], views, what)
    if promoted is not None:  # traced again, as jax.lax does, with weak carry leaves promoted
        return _while_loop(cond_fun, body_fun, promoted, parallel_iterations, what, carried, swap, counted,
                           remat)
    results = []
    for k, (v, path) in enumerate(zip(out_leaves, paths, strict=True)):
        if body.values[v].aval != avals[k] or body.values[v].view.key != views[k].key:
            leaf = path.removeprefix(carried) or "(the whole carry)"
            raise InvalidArgument(f"{what}: carry leaf {leaf}: body_fun returns {_shown(body, v)}, "
                                  f"the carry (init_val) is {_shown(trace, init[k])}")
        want = body.typed(body_args[k]) or body.typed(v) or \
            Type(avals[k], Spec(()), _slice_of(trace, init, what).id)  # only carried along
        for t, a in ((cond, cond_args[k]), (body, body_args[k])):  # typed where not consumed yet
            if t.values[a].type is None:
                t.values[a].type = want
        results.append(_settle(trace, body, v, want))
    kept = [body.typed(a) for a in body_args]
    init = [trace.use(v, trace.slices[t.slice], t.spec) for v, t in zip(init, kept, strict=True) if t]
    if cond.typed(pred) is None:  # a constant: where the carry is (now that the body has typed it)
        pred = cond.use(pred, _slice_of(trace, init, what), Spec(()))
    captured = _captured([cond, body], [])
    cond_args += [cond.captures[v] for v in captured]
    body_args += [body.captures[v] for v in captured]
    results += [body.captures[v] for v in captured]  # invariants: returned unchanged
    outputs = [trace.new_value(a, w, t) for a, w, t in zip(avals, views, kept, strict=True)]
    unused = [trace.new_value(trace.values[v].aval, trace.values[v].view, trace.typed(v)) for v in captured]
    trace.add(_While(init + captured, cond, body, cond_args, body_args, pred, results, outputs + unused,
                     parallel, swap, counted, remat, counted))
    return jax.tree_util.tree_unflatten(treedef, [trace.traced(v) for v in outputs])


def _promoted(trace: Trace, init_val: Any, init: Sequence[int], returned: Sequence[Aval],
              views: Sequence[View], what: str) -> Any | None:
    """`init_val` with each weakly typed leaf (a Python scalar's) whose type the body's result
    changes converted to the type the two promote to, as `jax.lax.while_loop` does; None if
    there is none."""
    leaves, treedef = jax.tree_util.tree_flatten(init_val, is_leaf=_is_traced)
    changed = False
    for k, (v, out) in enumerate(zip(init, returned, strict=True)):
        aval = trace.values[v].aval
        weak = views[k].weak and views[k].key is None
        if not weak or out.shape != aval.shape or out.dtype == aval.dtype:
            continue
        dtype = np.dtype(jnp.result_type(_weak_of(aval.dtype), parse_dtype(out.dtype)))
        if dtype.name == aval.dtype:
            continue
        changed = True
        if not _computed(leaves[k]):
            leaves[k] = np.asarray(leaves[k], dtype)
            continue
        t = trace.typed(v)
        on = t is not None and t.slice in trace.slices
        where = trace.slices[t.slice] if t is not None and on else _slice_of(trace, init, what)
        convert = Function(None, lambda x, d=dtype: jax.lax.convert_element_type(x, d), where,
                           name=f"as_{dtype.name}")
        leaves[k] = convert(leaves[k])
    return jax.tree_util.tree_unflatten(treedef, leaves) if changed else None


def _weak_of(dtype: str) -> Any:
    """A Python scalar of `dtype`'s kind: what JAX promotes as a weakly typed value."""
    kind = parse_dtype(dtype).kind
    return 0j if kind == "c" else 0.0 if kind == "f" else 0


def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any], *operands: Any) -> Any:
    """`jax.lax.cond` in the graph: `true_fun(*operands) if pred else false_fun(*operands)`;
    only the chosen branch computes, the other's hosts see dead values and finish. `pred` is a
    bool or numeric scalar (a number is true when it is not 0, as for `lax.cond`): traced, a
    buffer, a program argument or a constant. An operand not typed yet (an array argument)
    takes the type its first consumer in the branches wants."""
    trace = _trace("cond")
    p = trace.leaf(pred)
    p_aval = trace.values[p].aval
    kinds = (jnp.bool_, jnp.integer, jnp.floating)
    if p_aval.shape != () or trace.values[p].view.key is not None or \
            not any(jnp.issubdtype(parse_dtype(p_aval.dtype), k) for k in kinds):
        raise InvalidArgument("cond: pred must be a bool or numeric scalar, as for jax.lax.cond; found "
                              f"{_shown(trace, p)}")
    ops, treedef, _ = _flatten(trace, list(operands))
    ops = [trace.local(v) if trace.typed(v) is not None else v for v in ops]
    branches: list[Trace] = [trace.child(), trace.child()]
    args: list[list[int]] = [[], []]
    outs: list[Any] = [None, None]
    for k, fn in ((1, true_fun), (0, false_fun)):  # true_fun first: it types untyped operands
        child = branches[k]
        args[k] = [child.new_arg(trace.values[v].aval, trace.values[v].view, trace.typed(v)) for v in ops]
        inputs = jax.tree_util.tree_unflatten(treedef, [child.traced(v) for v in args[k]])
        with tracing(child):
            outs[k] = _flatten(child, fn(*inputs))
        for i, v in enumerate(ops):  # an operand untyped here: as its first consumer wants it
            want = child.typed(args[k][i])
            if want is not None and trace.typed(v) != want:  # (one passed twice: typed already)
                ops[i] = trace.use(v, trace.slices[want.slice], want.spec)
    where = _slice_of(trace, [p, *ops], "cond")
    for i, v in enumerate(ops):  # read by neither branch
        if trace.typed(v) is None:
            ops[i] = trace.use(v, where, Spec(()))
        for child, a in zip(branches, args, strict=True):
            if child.values[a[i]].type is None:
                child.values[a[i]].type = trace.typed(ops[i])
    (f_leaves, f_def, _), (t_leaves, t_def, t_paths) = outs
    if f_def != t_def:
        raise InvalidArgument(f"cond: true_fun returns {t_def} but false_fun returns {f_def}")
    results: list[list[int]] = [[], []]
    types = []
    for k, path in enumerate(t_paths):
        t_v = t_leaves[k]
        t_v = branches[1].local(t_v) if trace.typed(t_v) is not None else \
            branches[1].use(t_v, where, Spec(()))  # a constant: where the cond runs
        f_v = f_leaves[k] if trace.typed(f_leaves[k]) is None else branches[0].local(f_leaves[k])
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
    trace.add(_Cond(_predicate(trace, p, where), ops + captured, branches, args, results, outputs))
    return jax.tree_util.tree_unflatten(t_def, [trace.traced(v) for v in outputs])


def _slice_of(trace: Trace, values: Sequence[int], what: str) -> Slice:
    """Where an untyped value no computation consumes goes: the slice of the first typed one
    of `values`, else of the first jitted function the program calls (loops and branches
    included)."""
    for v in values:
        if (t := trace.typed(v)) is not None and t.slice in trace.slices:
            return trace.slices[t.slice]
    if trace.slices:
        return next(iter(trace.slices.values()))
    raise InvalidArgument(f"{what}: nothing in it runs on a slice: call a jitted function in it, or "
                          "pass it a buffer")


def _predicate(trace: Trace, p: int, where: Slice) -> int:
    """`p` as a bool[] scalar on a slice: a number is true when it is not 0 (`lax.cond`)."""
    t = trace.typed(p)
    if trace.values[p].aval == BOOL:
        return trace.local(p) if t is not None else trace.use(p, where, Spec(()))
    on = trace.slices.get(t.slice, where) if t is not None else where
    nonzero = Function(None, lambda v: v != 0, on, name="cond_nonzero")
    return trace.leaf(nonzero(trace.traced(p)))


def _computed(x: Any) -> bool:
    """A value the program computes or holds (not known when traced)."""
    from client.buffer import Buffer

    return isinstance(x, Traced | Buffer)


def _is_traced(x: Any) -> bool:
    return isinstance(x, Traced)


def _shown(trace: Trace, value: int) -> str:
    """A value's type as the user's functions see it: its aval, or its typed keys'."""
    v = trace.values[value]
    return str(v.aval) if v.view.key is None else f"key<{v.view.key}> keys of data {v.aval}"
