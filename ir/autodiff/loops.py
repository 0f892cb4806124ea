"""`while`'s reverse mode: the transpose of a loop is a loop that runs the forward's trip
count backwards, popping per-iteration stacks (TensorFlow's StackPush/StackPop).

- **Which carries.** A carry is active when its initial value, or its body result in some
  iteration, depends on a differentiated argument, and the loss depends on its final value,
  or on a carry it feeds, in some iteration: both found by iterating the body to a fixpoint.
- **Forward.** The loop saves its trip count, on each of its hosts, as it exits
  (`WhileAttrs.trips`: its `Exit` pushes it, keyed as the loop's residuals are by the
  differentiated loops around it). Its body is differentiated by its own `Sweep` (one loop
  deeper), and every forward value its backward reads is pushed, in the body, on a stack of
  its own (`PUSH`, keyed by the iterations of the differentiated loops around it), but for
  the loop's invariants (a weight its body reads, returned unchanged): the backward carries
  those, unchanged, from the loop's inputs, so a weight is not saved once per iteration. A
  body result k that iteration t+1 saves as its argument k (an RNN's state, read by the
  cell's pullback as its input and as its output) is saved once: the backward carries it
  from one iteration to the one before (argument k as it popped it), starting from the
  loop's output k.
- **Backward.** A `REPEAT` of the forward's trip count, taken back from that stack: each host
  counts its iterations itself, so no predicate is computed or sent. Its carries are the
  cotangents of the active carries, from those of the loop's outputs. Its body pops the
  forward values (`POP`, the last pushed first) and runs the transpose of the forward body.
  A loop-invariant carry (returned unchanged by the body) is a carry like the others here:
  the cotangent it carries adds each iteration's contribution to the one it came in with, so
  its gradient is accumulated across iterations. The cotangents it gives back are those of
  the loop's inputs.
- Loops nest: an inner loop's trip count is saved per outer iteration, and taken back in
  the outer backward body; its stacks are keyed by both loops' iterations. A `cond` in a
  body gives its predicate and residuals as values of the body (`branches.py`), pushed like
  any other.
- **Rematerialisation** (`WhileAttrs.remat`, `jax.checkpoint`'s trade). The forward body is
  the loop's own, and it pushes only the carry as each iteration enters it, but for its
  invariants: those the backward `REPEAT` carries, unchanged, from the loop's inputs. The
  backward body pops that carry and first runs the body's differentiated forward on it (the
  residuals again, and what loops and conds in it save, pushed and popped within the one
  backward iteration), then goes back through it as above.
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.autodiff.sweep import BACKWARD, FORWARD, Entry, Sweep, inexact, needed, reached
from ir.builder import ProgramBuilder
from ir.node import Graph, Node, Op
from ir.ops import WhileAttrs
from ir.verify import graph_types


@dataclass(frozen=True)
class _Loop:
    """What a differentiated loop keeps for its backward: its body's sweep and active values,
    the active carries, its trip count's stack, the stack of each value its backward reads,
    and the invariants it reads (which the backward carries, their value the loop's input)."""

    body: Sweep
    used: set[str]
    active: tuple[int, ...]
    trips: str  # the stack its trip count is saved on, on each of its hosts
    stacks: tuple[tuple[str, str], ...]  # (forward value in the body, its stack)
    swap: bool
    invariants: tuple[str, ...] = ()  # forward values in the body: arguments the body returns as they came
    # (forward value in the body, k): body result k, which is argument k of the next
    # iteration (saved there) or, after the last, the loop's output k
    chained: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class _Remat:
    """What a rematerialised loop keeps: the depth of its body, the active carries, its trip
    count's stack, and the stack of each of its body's arguments (the carry, per iteration),
    or None for an invariant (which the backward carries, its value the loop's input)."""

    body_depth: int
    active: tuple[int, ...]
    trips: str
    stacks: tuple[str | None, ...]  # one per body argument
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
    if attrs.remat:
        _forward_remat(sweep, node, inputs, carries)
        return
    body = attrs.body
    inner = Sweep(body, sweep.tables, sweep.rules, sweep.fwd.sub(), sweep.stacks, sweep.depth + 1)
    used = inner.active({body.args[k] for k in carries}, {body.results[k] for k in carries})
    inner.forward(used)
    invariant = {inner.renamed[a]: k for k, a in enumerate(body.args) if body.results[k] == a}
    saved = inner.saved()
    chained = _chained(body, inner.renamed, saved, set(invariant))
    stacks = tuple((v, sweep.stacks.new()) for v in saved if v not in invariant and v not in chained)
    for v, stack in stacks:
        inner.fwd.push(v, stack, inner.depth, attrs.swap)
    inner.fwd.result(*(inner.renamed[r] for r in body.results))
    trips = sweep.stacks.new()
    made = sweep.fwd.while_(inputs, attrs.cond, inner.fwd.graph(), attrs.parallel_iterations, attrs.swap,
                            trips, sweep.depth, attrs.counted)
    sweep.define(node.outputs, made)
    read = tuple(v for v in saved if v in invariant)
    carried = (*(inputs[invariant[v]] for v in read), *(made[k] for k in chained.values()))
    kept = _Loop(inner, used, carries, trips, stacks, attrs.swap, read, tuple(chained.items()))
    sweep.tape.append(Entry(node, carried, kept))


def _chained(body: Graph, renamed: dict[str, str], saved: tuple[str, ...],
             invariant: set[str]) -> dict[str, int]:
    """The saved body results (forward names -> k) that the next iteration saves again as its
    argument k: each is taken back from there (or from the loop's output k, after the last
    iteration) instead of being saved twice (an RNN's state: the pullback of the cell reads
    its input and its output)."""
    args = {renamed[a] for a in body.args}
    pushed = set(saved) - invariant
    chained = {}
    for k, r in enumerate(body.results):
        v = renamed[r]
        if v in pushed and v not in args and v not in chained and renamed[body.args[k]] in pushed:
            chained[v] = k
    return chained


def _forward_remat(sweep: Sweep, node: Node, inputs: tuple[str, ...], carries: tuple[int, ...]) -> None:
    """The loop as it is, its body also pushing its arguments (the carry entering it) but for
    the invariants, which the backward reads as the loop's inputs."""
    attrs = node.attrs
    assert isinstance(attrs, WhileAttrs)
    body, types = attrs.body, graph_types(attrs.body, *sweep.tables)
    fb = sweep.fwd.sub()
    args = [fb.arg(t.aval, t.spec, t.slice) for t in (types[a] for a in body.args)]
    results = fb.splice(body, args)
    invariant = [body.results[k] == a for k, a in enumerate(body.args)]
    stacks = tuple(None if same else sweep.stacks.new() for same in invariant)
    for a, stack in zip(args, stacks, strict=True):
        if stack is not None:
            fb.push(a, stack, sweep.depth + 1, attrs.swap)
    fb.result(*results)
    trips = sweep.stacks.new()
    made = sweep.fwd.while_(inputs, attrs.cond, fb.graph(), attrs.parallel_iterations, attrs.swap,
                            trips, sweep.depth, attrs.counted, attrs.remat)
    sweep.define(node.outputs, made)
    kept = tuple(v for v, stack in zip(inputs, stacks, strict=True) if stack is None)
    sweep.tape.append(Entry(node, kept, _Remat(sweep.depth + 1, carries, trips, stacks, attrs.swap)))


def _backward(sweep: Sweep, entry: Entry) -> None:
    node, kept = entry.node, entry.kept
    assert isinstance(kept, _Loop | _Remat)
    if not any(node.outputs[k] in sweep.cts for k in kept.active):
        return  # no cotangent comes in: none goes out
    attrs = node.attrs
    assert isinstance(attrs, WhileAttrs)
    cts = [sweep.cotangent(node.outputs[k]) for k in kept.active]
    bb = sweep.bwd.sub()
    ct_args = [bb.arg(t.aval, t.spec, t.slice) for t in (sweep.types[node.inputs[k]] for k in kept.active)]
    carried: list[str] = []  # what the backward carries besides the cotangents (see `_Loop`, `_Remat`)
    if isinstance(kept, _Remat):
        inner, used, carried = _again(sweep, attrs, kept, bb)
    else:
        inner, used = kept.body, kept.used
        popped = {v: bb.pop(inner.fwd.type_of(v), stack, inner.depth, kept.swap) for v, stack in kept.stacks}
        for v in (*kept.invariants, *(v for v, _ in kept.chained)):
            t = inner.fwd.type_of(v)
            popped[v] = bb.arg(t.aval, t.spec, t.slice)
        carried = [popped[v] for v in kept.invariants]
        # a chained result of iteration t-1 is argument k as iteration t saved it
        carried += [popped[inner.renamed[attrs.body.args[k]]] for _, k in kept.chained]
        inner.start_backward(bb, popped.__getitem__)
    body = attrs.body
    for k, a in zip(kept.active, ct_args, strict=True):
        if body.results[k] in used:
            inner.seed(body.results[k], a)
    inner.backward(used)
    bb.result(*(inner.cotangent(body.args[k]) for k in kept.active), *carried)
    invariants = [sweep.need(v) for v in entry.saved]
    made = sweep.bwd.repeat([*cts, *invariants], bb.graph(), kept.trips, sweep.depth)
    for k, ct in zip(kept.active, made[:len(cts)], strict=True):
        sweep.seed(node.inputs[k], ct)


def _again(sweep: Sweep, attrs: WhileAttrs, kept: _Remat, bb: ProgramBuilder
           ) -> tuple[Sweep, set[str], list[str]]:
    """In the backward body `bb`: the carry popped (its invariants carried: arguments of `bb`
    after the cotangents), the body's differentiated forward run on it; its sweep, ready to
    go back, its active values, and the invariants' arguments."""
    body, types = attrs.body, graph_types(attrs.body, *sweep.tables)
    carried = [bb.arg(types[a].aval, types[a].spec, types[a].slice)
               for a, stack in zip(body.args, kept.stacks, strict=True) if stack is None]
    left = iter(carried)
    popped = [next(left) if stack is None else bb.pop(types[a], stack, kept.body_depth, kept.swap)
              for a, stack in zip(body.args, kept.stacks, strict=True)]
    inner = Sweep(body, sweep.tables, sweep.rules, bb.sub(), sweep.stacks, kept.body_depth)
    used = inner.active({body.args[k] for k in kept.active}, {body.results[k] for k in kept.active})
    inner.forward(used)
    saved = inner.saved()
    inner.fwd.result(*saved)
    again = dict(zip(saved, bb.splice(inner.fwd.graph(), popped), strict=True))
    inner.start_backward(bb, again.__getitem__)
    return inner, used, carried


FORWARD[Op.WHILE], BACKWARD[Op.WHILE] = _forward, _backward
