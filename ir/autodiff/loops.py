"""`while`'s reverse mode: the transpose of a loop is a loop that runs the forward's trip
count backwards, popping per-iteration stacks (TensorFlow's StackPush/StackPop).

- **Which carries.** A carry is active when its initial value, or its body result in some
  iteration, depends on a differentiated argument, and the loss depends on its final value,
  or on a carry it feeds, in some iteration: both found by iterating the body to a fixpoint.
- **Forward.** The loop gets one more carry, its trip count: an int32 scalar on the slice of
  its predicate, 0 at the start and counted up in the body (`Rules.count`), returned as its
  first output. The body is differentiated by its own `Sweep` (one loop deeper), and every
  forward value its backward reads is pushed, in the body, on a stack of its own
  (`PUSH`, keyed by the iterations of the differentiated loops around it).
- **Backward.** A `while` whose carries are a counter, from the trip count down, and the
  cotangents of the active carries, from those of the loop's outputs. Its body pops the
  forward values (`POP`, the last pushed first), runs the transpose of the forward body and
  counts down; its predicate is the counter above 0 (`Rules.positive`). A loop-invariant
  carry (returned unchanged by the body) is a carry like the others here: the cotangent it
  carries adds each iteration's contribution to the one it came in with, so its gradient is
  accumulated across iterations. The cotangents it gives back are those of the loop's inputs.
- Loops nest: an inner loop's trip count is one of the outer body's forward values, pushed
  per outer iteration and popped as the inner backward loop's start; its stacks are keyed
  by both loops' iterations. A `cond` in a body gives its predicate and residuals as values
  of the body (`branches.py`), pushed like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.autodiff.sweep import BACKWARD, FORWARD, Entry, Sweep, inexact, needed, reached
from ir.builder import ProgramBuilder
from ir.node import Node, Op, Type
from ir.ops import WhileAttrs
from ir.program import Artifact
from ir.types import Aval, Spec
from ir.verify import graph_types

COUNTER = Aval((), "int32")
FLAG = Aval((), "bool")


@dataclass(frozen=True)
class _Loop:
    """What a differentiated loop keeps for its backward: its body's sweep and active values,
    the active carries, the counter's type, and the stack of each value its backward reads."""

    body: Sweep
    used: set[str]
    active: tuple[int, ...]
    counter: Type
    stacks: tuple[tuple[str, str], ...]  # (forward value in the body, its stack)
    swap: bool


def _active_carries(sweep: Sweep, node: Node, attrs: WhileAttrs) -> tuple[int, ...]:
    body, active = attrs.body, sweep.active_values
    types = graph_types(body, *sweep.tables)
    args, results = body.args, body.results
    varied = {k for k, v in enumerate(node.inputs) if v in active}
    useful = {k for k, v in enumerate(node.outputs) if v in active}
    while True:
        reach = reached(body, {args[k] for k in varied})
        more_varied = varied | {k for k, r in enumerate(results) if r in reach}
        need = needed(body, {results[k] for k in useful})
        more_useful = useful | {k for k, a in enumerate(args) if a in need}
        if (more_varied, more_useful) == (varied, useful):
            break
        varied, useful = more_varied, more_useful
    return tuple(k for k in sorted(varied & useful) if inexact(types[args[k]]))


def _forward(sweep: Sweep, node: Node, inputs: tuple[str, ...]) -> None:
    attrs = node.attrs
    assert isinstance(attrs, WhileAttrs)
    carries = _active_carries(sweep, node, attrs)
    body = attrs.body
    pred_slice = graph_types(attrs.cond, *sweep.tables)[attrs.cond.results[0]].slice
    counter = Type(COUNTER, Spec.of(()), pred_slice)
    inner = Sweep(body, sweep.tables, sweep.rules, sweep.fwd.sub(), sweep.stacks, sweep.depth + 1)
    n = inner.fwd.arg(counter.aval, counter.spec, counter.slice)
    used = inner.active({body.args[k] for k in carries}, {body.results[k] for k in carries})
    inner.forward(used)
    stacks = tuple((v, sweep.stacks.new()) for v in inner.saved())
    for v, stack in stacks:
        inner.fwd.push(v, stack, inner.depth, attrs.swap)
    (counted,) = _kernel(inner.fwd, sweep.rules.count(counter, 1), "grad_count", counter, [n], counter)
    inner.fwd.result(counted, *(inner.renamed[r] for r in body.results))
    cond = sweep.fwd.sub()  # the loop's own, with the counter first (unread)
    cond.arg(counter.aval, counter.spec, counter.slice)
    cond_types = graph_types(attrs.cond, *sweep.tables)
    cond_args = [cond.arg(t.aval, t.spec, t.slice) for t in (cond_types[a] for a in attrs.cond.args)]
    cond.result(*cond.splice(attrs.cond, cond_args))
    zero = sweep.constant(sweep.rules.zeros(counter), counter, "grad_zeros", into=sweep.fwd)
    made = sweep.fwd.while_([zero, *inputs], cond.graph(), inner.fwd.graph(), attrs.parallel_iterations,
                            attrs.swap)
    sweep.define(node.outputs, made[1:])
    sweep.tape.append(Entry(node, (made[0],), _Loop(inner, used, carries, counter, stacks, attrs.swap)))


def _backward(sweep: Sweep, entry: Entry) -> None:
    node, kept = entry.node, entry.kept
    assert isinstance(kept, _Loop)
    if not any(node.outputs[k] in sweep.cts for k in kept.active):
        return  # no cotangent comes in: none goes out
    inner, counter, body = kept.body, kept.counter, kept.body.graph
    cts = [sweep.cotangent(node.outputs[k]) for k in kept.active]
    types = [sweep.types[node.inputs[k]] for k in kept.active]
    bb = sweep.bwd.sub()
    i = bb.arg(counter.aval, counter.spec, counter.slice)
    ct_args = [bb.arg(t.aval, t.spec, t.slice) for t in types]
    popped = {v: bb.pop(inner.fwd.type_of(v), stack, inner.depth, kept.swap) for v, stack in kept.stacks}
    inner.start_backward(bb, popped.__getitem__)
    for k, a in zip(kept.active, ct_args, strict=True):
        if body.results[k] in kept.used:
            inner.seed(body.results[k], a)
    inner.backward(kept.used)
    (down,) = _kernel(bb, sweep.rules.count(counter, -1), "grad_count", counter, [i], counter)
    bb.result(down, *(inner.cotangent(body.args[k]) for k in kept.active))
    cond = sweep.bwd.sub()
    c = cond.arg(counter.aval, counter.spec, counter.slice)
    for t in types:
        cond.arg(t.aval, t.spec, t.slice)
    flag = Type(FLAG, Spec.of(()), counter.slice)
    cond.result(*_kernel(cond, sweep.rules.positive(counter), "grad_more", counter, [c], flag))
    made = sweep.bwd.while_([sweep.need(entry.saved[0]), *cts], cond.graph(), bb.graph())
    for k, ct in zip(kept.active, made[1:], strict=True):
        sweep.seed(node.inputs[k], ct)


def _kernel(b: ProgramBuilder, art: Artifact, name: str, of: Type, inputs: list[str],
            out: Type) -> tuple[str, ...]:
    """A computation the pass adds on the counter's slice: `inputs` of type `of` to `out`."""
    ref = b.artifact(art.data, dict(art.meta))
    return b.compute(name, ref, of.slice, inputs, [out.sig], ins=[of.sig] * len(inputs))


FORWARD[Op.WHILE], BACKWARD[Op.WHILE] = _forward, _backward
