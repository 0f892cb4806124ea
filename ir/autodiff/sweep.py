"""One graph's reverse mode: its forward copied into one builder, its backward into
another (the same one at the top of a program; a sub-graph's own for a branch or a loop's
body), with the forward values the backward reads passed through `need` (a branch's
arguments, a loop body's pops).

A `Sweep` walks its graph's nodes once forwards (`forward`: each active computation
replaced by its forward with residuals, the rest copied) and records a tape; `backward`
walks the tape in reverse and adds each node's transpose. Ops other than computations and
transfers get their rules from `FORWARD` and `BACKWARD` (`branches.py` registers `cond`'s,
`loops.py` `while`'s).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ir.builder import ProgramBuilder
from ir.errors import InvalidArgument
from ir.node import Graph, Node, Op, Sig, Type
from ir.ops import ArgAttrs, ComputeAttrs, CondAttrs, TransferAttrs, WhileAttrs
from ir.program import Artifact, SliceDef
from ir.types import parse_dtype
from ir.verify import graph_types


class NotDifferentiable(InvalidArgument):
    """The program cannot be differentiated as asked; the message names the node or value."""


@dataclass(frozen=True)
class Vjp:
    """A computation's reverse mode: `bwd` takes the `residuals` and the cotangents of the
    outputs asked for (`cts`) and returns the cotangents of the inputs asked for (`wrt`), in
    order; `fwd` computes the outputs and then the residuals that are neither an input nor an
    output of the computation. `sources` says, per residual, which it is: `("in", i)` input
    i, `("out", k)` output k, `("res", j)` fwd's j-th output after the computation's own
    (every one a `res` where empty). Sigs are on the computation's slice."""

    fwd: Artifact
    residuals: tuple[Sig, ...]
    bwd: Artifact
    sources: tuple[tuple[str, int], ...] = ()

    def made(self) -> tuple[Sig, ...]:
        """The residuals `fwd` computes, after the computation's own outputs."""
        if not self.sources:
            return self.residuals
        return tuple(r for r, (kind, _) in zip(self.residuals, self.sources, strict=True) if kind == "res")

    def saved(self, inputs: Sequence[str], outputs: Sequence[str], made: Sequence[str]) -> tuple[str, ...]:
        """The forward values `bwd` reads, in order, given the computation's inputs, its
        outputs and the residuals `fwd` made."""
        if not self.sources:
            return tuple(made)
        of = {"in": inputs, "out": outputs, "res": made}
        return tuple(of[kind][i] for kind, i in self.sources)


class Rules(Protocol):
    """Where the computations the pass adds come from (the client exports them with JAX)."""

    def vjp(self, node: ComputeAttrs, wrt: tuple[bool, ...], cts: tuple[bool, ...],
            acc: tuple[bool, ...] = ()) -> Vjp:
        """`acc` (a mask over the `wrt` inputs): the backward also takes, after the cotangents,
        an accumulator per masked input, and returns that input's cotangent added to it."""
    def zeros(self, t: Type) -> Artifact: ...
    def ones(self, t: Type) -> Artifact: ...
    def add(self, t: Type, n: int) -> Artifact: ...


def inexact(t: Type) -> bool:
    return bool(np.issubdtype(parse_dtype(t.aval.dtype), np.inexact))


# The original program's slices and artifacts, against which its graphs are typed.
Tables = tuple[Mapping[str, SliceDef], frozenset[str]]


@dataclass(frozen=True)
class Entry:
    """An active node on the tape: the forward values (new names) its backward reads, and
    what its rule keeps for the backward (a computation's VJP, a cond's backward branches)."""

    node: Node
    saved: tuple[str, ...]
    kept: Any = None


# The rules of the ops beyond computations and transfers: (sweep, node, its new inputs).
FORWARD: dict[Op, Callable[[Sweep, Node, tuple[str, ...]], None]] = {}
BACKWARD: dict[Op, Callable[[Sweep, Entry], None]] = {}


def reached(graph: Graph, varied: Iterable[str]) -> set[str]:
    """The values that depend on one of `varied` (a loop's or branch's outputs on any input)."""
    reach = set(varied)
    for node in graph.nodes:
        if node.op in (Op.COMPUTE, Op.TRANSFER, Op.WHILE, Op.COND) and reach & set(node.inputs):
            reach.update(node.outputs)
    return reach


def needed(graph: Graph, useful: Iterable[str]) -> set[str]:
    """The values one of `useful` depends on."""
    need = set(useful)
    for node in reversed(graph.nodes):
        if need & set(node.outputs):
            need.update(node.inputs)
    return need


class Stacks:
    """Names of the stacks a program's reverse adds (`<prefix>s<k>`), unique in the program
    as long as each reverse inlined into one has its own prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.count = prefix, 0

    def new(self) -> str:
        self.count += 1
        return f"{self.prefix}s{self.count - 1}"


class Sweep:
    def __init__(self, graph: Graph, tables: Tables, rules: Rules, fwd: ProgramBuilder, stacks: Stacks,
                 depth: int = 0) -> None:
        """`depth`: the loops around the graph that are differentiated (those whose residuals
        a stack keys by iteration)."""
        self.graph, self.tables, self.rules, self.fwd = graph, tables, rules, fwd
        self.stacks, self.depth = stacks, depth
        self.types = graph_types(graph, *tables)  # (the graph's own scope)
        self.bwd = fwd
        self.need: Callable[[str], str] = lambda v: v  # a forward value (new name) as the backward reads it
        self.renamed: dict[str, str] = {}  # value -> its name in the forward builder
        self.cts: dict[str, list[str]] = {}  # value -> contributions to its cotangent (backward names)
        self.tape: list[Entry] = []
        self.active_values: set[str] = set()
        self.seeds: set[str] = set()  # cotangents from outside the graph (a loop body's carried ones)

    # --- which values carry cotangents ------------------------------------------------------

    def active(self, varied: Iterable[str], useful: Iterable[str]) -> set[str]:
        """The values of an inexact dtype that depend on one in `varied` and that one in
        `useful` (the loss, or a branch's results that carry cotangents) depends on."""
        both = reached(self.graph, varied) & needed(self.graph, useful)
        self.active_values = {v for v in both if inexact(self.types[v])}
        return self.active_values

    # --- the forward pass: each node copied, an active computation as its forward ----------

    def forward(self, active: set[str]) -> None:
        """Every node but the result, into the forward builder (the result is the caller's)."""
        for node in self.graph.nodes[:-1]:
            self._forward(node, active)

    def _forward(self, node: Node, active: set[str]) -> None:
        b, inputs = self.fwd, tuple(self.renamed[v] for v in node.inputs)
        live_in = [v in active for v in node.inputs]
        live_out = [v in active for v in node.outputs]
        if node.op is Op.ARG:
            assert isinstance(node.attrs, ArgAttrs)
            t = node.attrs.type
            self.define(node.outputs, (b.arg(t.aval, t.spec, t.slice),))
        elif node.op is Op.COMPUTE and any(live_in) and any(live_out):
            a = node.attrs
            assert isinstance(a, ComputeAttrs)
            vjp = self.rules.vjp(a, tuple(live_in), tuple(live_out))
            ref = b.artifact(vjp.fwd.data, dict(vjp.fwd.meta))
            made = b.compute(f"{a.name}_fwd", ref, a.slice, inputs, [*a.outs, *vjp.made()], ins=a.ins)
            outs = made[:len(a.outs)]
            self.define(node.outputs, outs)
            self.tape.append(Entry(node, vjp.saved(inputs, outs, made[len(a.outs):]), vjp))
        elif node.op is Op.COMPUTE:
            a = node.attrs
            assert isinstance(a, ComputeAttrs)
            self.define(node.outputs, b.compute(a.name, a.artifact, a.slice, inputs, a.outs, ins=a.ins))
        elif node.op is Op.TRANSFER:
            a = node.attrs
            assert isinstance(a, TransferAttrs)
            self.define(node.outputs, (b.transfer(inputs[0], a.type.spec, a.type.slice),))
            if any(live_out):
                self.tape.append(Entry(node, ()))
        elif any(live_in) and any(live_out):
            rule = FORWARD.get(node.op)
            if rule is None:
                raise NotDifferentiable(f"grad: a {node.op.value} that the loss depends on through a "
                                        f"differentiated argument ({', '.join(node.outputs)}) has no "
                                        "reverse mode")
            rule(self, node, inputs)
        elif node.op is Op.WHILE:  # the loss does not depend on it through a `wrt` argument: as it is
            w = node.attrs
            assert isinstance(w, WhileAttrs)
            self.define(node.outputs, b.while_(inputs, w.cond, w.body, w.parallel_iterations, w.swap,
                                               counted=w.counted, remat=w.remat))
        elif node.op is Op.COND:
            c = node.attrs
            assert isinstance(c, CondAttrs)
            self.define(node.outputs, b.cond(inputs[0], inputs[1:], c.branches))
        else:
            raise NotDifferentiable(f"grad: {node.op.value} nodes are not supported here "
                                    f"({', '.join(node.outputs) or 'no outputs'})")

    def define(self, old: Sequence[str], new: Sequence[str]) -> None:
        self.renamed.update(zip(old, new, strict=True))

    def saved(self) -> tuple[str, ...]:
        """The forward values (new names) the backward reads, once each, in tape order."""
        return tuple(dict.fromkeys(v for e in self.tape for v in e.saved))

    # --- the backward pass -----------------------------------------------------------------

    def start_backward(self, bwd: ProgramBuilder, need: Callable[[str], str]) -> None:
        self.bwd, self.need = bwd, need

    def seed(self, value: str, ct: str) -> None:
        """A cotangent of `value` (a backward name) contributed from outside the graph."""
        self.cts.setdefault(value, []).append(ct)
        self.seeds.add(ct)

    def backward(self, active: set[str]) -> None:
        for entry in reversed(self.tape):
            if entry.node.op is Op.COMPUTE:
                self._compute_backward(entry, active)
            elif entry.node.op is Op.TRANSFER:
                self._transfer_backward(entry.node)
            else:
                BACKWARD[entry.node.op](self, entry)

    def _transfer_backward(self, node: Node) -> None:
        if node.outputs[0] not in self.cts:
            return
        source = self.types[node.inputs[0]]
        back = self.bwd.transfer(self.cotangent(node.outputs[0]), source.spec, source.slice)
        self.cts.setdefault(node.inputs[0], []).append(back)

    def _compute_backward(self, entry: Entry, active: set[str]) -> None:
        node, vjp = entry.node, entry.kept
        a = node.attrs
        assert isinstance(a, ComputeAttrs) and isinstance(vjp, Vjp)
        outs = [v for v in node.outputs if v in active]
        if not any(v in self.cts for v in outs):
            return  # every cotangent it would take is zero: so are those it would give
        wrt = [i for i, v in enumerate(node.inputs) if v in active]
        cts = [self.cotangent(v) for v in outs]
        acc = tuple(self._accumulates(node, i) for i in wrt)
        if any(acc):  # the backward that also adds each of those in
            vjp = self.rules.vjp(a, tuple(v in active for v in node.inputs),
                                 tuple(v in active for v in node.outputs), acc)
        into = [self.cts.pop(node.inputs[i])[0] for i, added in zip(wrt, acc, strict=True) if added]
        ins = [*vjp.residuals, *(self.types[v].sig for v in outs),
               *(a.ins[i] for i, added in zip(wrt, acc, strict=True) if added)]
        ref = self.bwd.artifact(vjp.bwd.data, dict(vjp.bwd.meta))
        operands = [*(self.need(r) for r in entry.saved), *cts, *into]
        made = self.bwd.compute(f"{a.name}_bwd", ref, a.slice, operands, [a.ins[i] for i in wrt], ins=ins)
        for i, ct in zip(wrt, made, strict=True):
            self.cts.setdefault(node.inputs[i], []).append(ct)

    def _accumulates(self, node: Node, i: int) -> bool:
        """Whether input i's cotangent so far is only one carried in from outside the graph (a
        loop-invariant's, which each iteration adds to): the backward adds into it, in one
        computation rather than two. (An input read twice by the node is left to `cotangent`.)"""
        v = node.inputs[i]
        parts = self.cts.get(v, [])
        return len(parts) == 1 and parts[0] in self.seeds and node.inputs.index(v) == i

    def cotangent(self, value: str) -> str:
        """The value's cotangent in the backward: the sum of what was contributed, or zeros."""
        t = self.types[value]
        parts = self.cts.get(value, [])
        if not parts:
            ct = self.constant(self.rules.zeros(t), t, "grad_zeros")
        elif len(parts) == 1:
            ct = parts[0]
        else:
            art = self.rules.add(t, len(parts))
            ref = self.bwd.artifact(art.data, dict(art.meta))
            n = len(parts)
            ct = self.bwd.compute(f"grad_add{n}", ref, t.slice, parts, [t.sig], ins=[t.sig] * n)[0]
        self.cts[value] = [ct]
        return ct

    def constant(self, art: Artifact, t: Type, name: str, into: ProgramBuilder | None = None) -> str:
        """A computation of no inputs giving `art`'s value of type `t`, into the backward
        builder (or `into`)."""
        b = self.bwd if into is None else into
        ref = b.artifact(art.data, dict(art.meta))
        return b.compute(name, ref, t.slice, (), [t.sig], ins=())[0]
