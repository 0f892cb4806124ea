"""`cond`'s reverse mode: the transpose of a `cond` is a `cond` on the same predicate.

Each branch is differentiated on its own (a `Sweep` of the branch graph, its active values
those reached from the cond's active operands that its active results depend on). The
forward `cond` returns, after the branch's results, the residuals of every branch, in branch
order: the taken branch its own, and zeros (`Rules.zeros`) in the place of the others', so
that every branch has the same result types, as a `cond` wants. The backward `cond` takes
the predicate, the cotangents of the active results and those residuals; each of its
branches is the transpose of the forward one of the same index, so the branch taken
backwards is the one taken forwards, and it returns the cotangents of the active operands
(zeros for one its branch does not read).

The predicate and the residuals are forward values the enclosing backward reads: at the top
of a program they are in scope; inside a branch they are that branch's residuals in turn,
so conds nest.
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.autodiff.sweep import BACKWARD, FORWARD, Entry, Sweep
from ir.builder import ProgramBuilder
from ir.node import Graph, Node, Op, Type
from ir.ops import CondAttrs


@dataclass(frozen=True)
class _Branches:
    """What a differentiated cond keeps for its backward: each branch's sweep and active
    values, and the residuals of every branch (forward names in that branch) with their types."""

    sweeps: tuple[tuple[Sweep, set[str]], ...]
    saved: tuple[tuple[str, ...], ...]
    types: tuple[tuple[Type, ...], ...]


def _forward(sweep: Sweep, node: Node, inputs: tuple[str, ...]) -> None:
    attrs = node.attrs
    assert isinstance(attrs, CondAttrs)
    operands, active = node.inputs[1:], sweep.active_values
    sweeps = []
    for g in attrs.branches:
        inner = Sweep(g, sweep.tables, sweep.rules, sweep.fwd.sub(), sweep.stacks, sweep.depth)
        used = inner.active({a for a, v in zip(g.args, operands, strict=True) if v in active},
                            {r for r, v in zip(g.results, node.outputs, strict=True) if v in active})
        inner.forward(used)
        sweeps.append((inner, used))
    saved = tuple(inner.saved() for inner, _ in sweeps)
    types = tuple(tuple(inner.fwd.type_of(v) for v in values)
                  for (inner, _), values in zip(sweeps, saved, strict=True))
    graphs = []
    for k, (inner, _) in enumerate(sweeps):
        extra = [v if j == k else inner.constant(sweep.rules.zeros(t), t, "grad_zeros", into=inner.fwd)
                 for j in range(len(sweeps)) for v, t in zip(saved[j], types[j], strict=True)]
        inner.fwd.result(*(inner.renamed[r] for r in inner.graph.results), *extra)
        graphs.append(inner.fwd.graph())
    made = sweep.fwd.cond(inputs[0], inputs[1:], graphs)
    n = len(node.outputs)
    sweep.define(node.outputs, made[:n])
    sweep.tape.append(Entry(node, (inputs[0], *made[n:]), _Branches(tuple(sweeps), saved, types)))


def _backward(sweep: Sweep, entry: Entry) -> None:
    node, active, kept = entry.node, sweep.active_values, entry.kept
    assert isinstance(kept, _Branches)
    outs = [v for v in node.outputs if v in active]
    if not any(v in sweep.cts for v in outs):
        return  # no cotangent comes in: none goes out
    ins = [i for i, v in enumerate(node.inputs[1:]) if v in active]
    cts = [sweep.cotangent(v) for v in outs]
    pred, *residuals = [sweep.need(v) for v in entry.saved]
    branches = [_transpose(sweep, node, kept, k, cts, ins) for k in range(len(kept.sweeps))]
    made = sweep.bwd.cond(pred, [*cts, *residuals], branches)
    for i, ct in zip(ins, made, strict=True):
        sweep.seed(node.inputs[1 + i], ct)


def _transpose(sweep: Sweep, node: Node, kept: _Branches, k: int, cts: list[str], ins: list[int]) -> Graph:
    """Branch `k`'s backward: (cotangents of the active results, every branch's residuals)
    to the cotangents of the active operands `ins`."""
    inner, used = kept.sweeps[k]
    bb = sweep.bwd.sub()
    ct_args = [_arg(bb, sweep.bwd.type_of(v)) for v in cts]
    mine: dict[str, str] = {}
    for j, (values, types) in enumerate(zip(kept.saved, kept.types, strict=True)):
        for v, t in zip(values, types, strict=True):
            a = _arg(bb, t)
            if j == k:
                mine[v] = a
    inner.start_backward(bb, mine.__getitem__)
    outs = [r for r, v in zip(inner.graph.results, node.outputs, strict=True) if v in sweep.active_values]
    for r, a in zip(outs, ct_args, strict=True):
        if r in used:
            inner.seed(r, a)
    inner.backward(used)
    args = inner.graph.args
    bb.result(*(inner.cotangent(args[i]) for i in ins))
    return bb.graph()


def _arg(b: ProgramBuilder, t: Type) -> str:
    return b.arg(t.aval, t.spec, t.slice)


FORWARD[Op.COND], BACKWARD[Op.COND] = _forward, _backward
