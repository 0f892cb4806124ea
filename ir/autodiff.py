"""Reverse mode as a pass over the IR: a program and the positions of the arguments to
differentiate in, to a program that computes the forward pass and then the cotangents,
through the same lowering, scheduler and executors as any other.

Contract:
- `reverse(program, wrt, rules)` takes a program whose first result is a scalar of an
  inexact dtype (the loss; the others are auxiliary values, not differentiated) and returns
  one with the same arguments whose results are the loss, the auxiliary values, then the
  gradient of the loss in each argument of `wrt`, of that argument's type.
- Each computation's VJP comes from `rules` (`Rules.vjp`): a forward computation that also
  returns its residuals, and a backward one that takes the residuals and its outputs'
  cotangents and returns its inputs'. The pass owns nothing of JAX: it only wires what the
  rules give. A computation with no input that depends on a `wrt` argument, or no output
  that the loss depends on, is copied as it is, its artifact and bits unchanged.
- A transfer's transpose is a transfer back, to the operand's slice and spec. A value read
  by several nodes gets the sum of its cotangents (`Rules.add`). A cotangent nothing
  contributed to is a symbolic zero until a node needs it as a value (`Rules.zeros`); the
  loss is seeded with `Rules.ones`.
- Loops and branches that the loss depends on through a `wrt` argument are refused
  (`NotDifferentiable`, naming the node), as are `wrt` arguments and a loss that are not of
  an inexact dtype: this pass covers straight-line programs.
- Pure: it builds the new program with `ProgramBuilder`, so every node is type-checked as
  it is added and the result is verified.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ir.builder import ProgramBuilder
from ir.errors import InvalidArgument
from ir.node import Node, Op, Sig, Type, subgraphs
from ir.ops import ArgAttrs, ComputeAttrs, CondAttrs, TransferAttrs, WhileAttrs
from ir.program import Artifact, Program
from ir.types import parse_dtype
from ir.verify import value_types


class NotDifferentiable(InvalidArgument):
    """The program cannot be differentiated as asked; the message names the node or value."""


@dataclass(frozen=True)
class Vjp:
    """A computation's reverse mode: `fwd` computes its outputs and then `residuals`; `bwd`
    takes the residuals and the cotangents of the outputs asked for (`cts`) and returns the
    cotangents of the inputs asked for (`wrt`), in order. Sigs are on the computation's slice."""

    fwd: Artifact
    residuals: tuple[Sig, ...]
    bwd: Artifact


class Rules(Protocol):
    """Where the computations the pass adds come from (the client exports them with JAX)."""

    def vjp(self, node: ComputeAttrs, wrt: tuple[bool, ...], cts: tuple[bool, ...]) -> Vjp: ...
    def zeros(self, t: Type) -> Artifact: ...
    def ones(self, t: Type) -> Artifact: ...
    def add(self, t: Type, n: int) -> Artifact: ...


def inexact(t: Type) -> bool:
    return bool(np.issubdtype(parse_dtype(t.aval.dtype), np.inexact))


def reverse(program: Program, wrt: Sequence[int], rules: Rules) -> Program:
    """`program`'s loss, auxiliary results and gradients in the arguments `wrt` (see the module)."""
    return _Reverse(program, tuple(wrt), rules).run()


class _Reverse:
    def __init__(self, program: Program, wrt: tuple[int, ...], rules: Rules) -> None:
        self.p, self.wrt, self.rules = program, wrt, rules
        self.b = ProgramBuilder(dict(program.slice_table), dict(program.artifact_table))
        self.renamed: dict[str, str] = {}  # forward value -> its name in the new program
        self.types: dict[str, Type] = value_types(program)  # forward value -> its type
        self.cts: dict[str, list[str]] = {}  # forward value -> contributions to its cotangent (new names)
        # the active nodes in order, with their residuals' new names and their VJP (a computation's)
        self.tape: list[tuple[Node, tuple[str, ...], Vjp | None]] = []

    def run(self) -> Program:
        graph = self.p.graph
        args, results = graph.args, graph.results
        if not results:
            raise NotDifferentiable("grad: the program has no result (the loss is its first)")
        if len(set(self.wrt)) != len(self.wrt) or not all(0 <= k < len(args) for k in self.wrt):
            raise NotDifferentiable(f"grad: wrt: expected distinct argument positions below {len(args)}, "
                                    f"got {list(self.wrt)}")
        for k in self.wrt:
            t = self.types[args[k]]
            if not inexact(t):
                raise NotDifferentiable(f"grad: argument {k} ({args[k]}, {t}) is not of an inexact dtype: "
                                        "only floating and complex arguments have gradients")
        active = self._active(graph.nodes, {args[k] for k in self.wrt}, results[0])
        for node in graph.nodes[:-1]:
            self._forward(node, active)
        loss = results[0]
        t = self.types[loss]
        if t.aval.shape != () or not inexact(t):
            raise NotDifferentiable(f"grad: the loss ({loss}, {t}) must be a scalar of an inexact dtype")
        if loss in active:
            self.cts[loss] = [self._constant(self.rules.ones(t), t, "grad_ones")]
        for node, residuals, vjp in reversed(self.tape):
            self._backward(node, residuals, vjp, active)
        grads = [self._cotangent(args[k]) for k in self.wrt]
        self.b.result(*(self.renamed[v] for v in results), *grads)
        return self.b.build()

    # --- which values carry cotangents ------------------------------------------------------

    def _active(self, nodes: Sequence[Node], varied: set[str], loss: str) -> set[str]:
        """The values that depend on a `wrt` argument and that the loss depends on."""
        varied = set(varied)
        for node in nodes:
            if node.op in (Op.COMPUTE, Op.TRANSFER, Op.WHILE, Op.COND) and varied & set(node.inputs):
                varied.update(node.outputs)
        useful = {loss}
        for node in reversed(nodes):
            if useful & set(node.outputs):
                useful.update(node.inputs)
        return {v for v in varied & useful if inexact(self.types[v])}

    # --- the forward pass: each node copied, an active computation as its forward ----------

    def _forward(self, node: Node, active: set[str]) -> None:
        b, inputs = self.b, tuple(self.renamed[v] for v in node.inputs)
        live_in = [v in active for v in node.inputs]
        live_out = [v in active for v in node.outputs]
        if node.op is Op.ARG:
            assert isinstance(node.attrs, ArgAttrs)
            t = node.attrs.type
            self._define(node.outputs, (b.arg(t.aval, t.spec, t.slice),))
        elif node.op is Op.COMPUTE and any(live_in) and any(live_out):
            a = node.attrs
            assert isinstance(a, ComputeAttrs)
            vjp = self.rules.vjp(a, tuple(live_in), tuple(live_out))
            ref = b.artifact(vjp.fwd.data, dict(vjp.fwd.meta))
            made = b.compute(f"{a.name}_fwd", ref, a.slice, inputs, [*a.outs, *vjp.residuals], ins=a.ins)
            self._define(node.outputs, made[:len(a.outs)])
            self.tape.append((node, made[len(a.outs):], vjp))
        elif node.op is Op.COMPUTE:
            a = node.attrs
            assert isinstance(a, ComputeAttrs)
            self._define(node.outputs, b.compute(a.name, a.artifact, a.slice, inputs, a.outs, ins=a.ins))
        elif node.op is Op.TRANSFER:
            a = node.attrs
            assert isinstance(a, TransferAttrs)
            self._define(node.outputs, (b.transfer(inputs[0], a.type.spec, a.type.slice),))
            if any(live_out):
                self.tape.append((node, (), None))
        elif any(live_in) and any(live_out):
            calls = sorted({n.attrs.name for g in subgraphs(node) for n in g.walk()
                            if isinstance(n.attrs, ComputeAttrs)})
            raise NotDifferentiable(f"grad: a {node.op.value} that the loss depends on through a "
                                    f"differentiated argument ({', '.join(node.outputs)}, calling "
                                    f"{', '.join(calls) or 'nothing'}): loops and branches are not "
                                    "differentiated yet")
        elif node.op is Op.WHILE:  # the loss does not depend on it through a `wrt` argument: as it is
            w = node.attrs
            assert isinstance(w, WhileAttrs)
            self._define(node.outputs, b.while_(inputs, w.cond, w.body, w.parallel_iterations))
        elif node.op is Op.COND:
            c = node.attrs
            assert isinstance(c, CondAttrs)
            self._define(node.outputs, b.cond(inputs[0], inputs[1:], c.branches))
        else:
            raise NotDifferentiable(f"grad: {node.op.value} nodes are not supported here "
                                    f"({', '.join(node.outputs) or 'no outputs'})")

    def _define(self, old: Sequence[str], new: Sequence[str]) -> None:
        self.renamed.update(zip(old, new, strict=True))

    # --- the backward pass -----------------------------------------------------------------

    def _backward(self, node: Node, residuals: tuple[str, ...], vjp: Vjp | None, active: set[str]) -> None:
        b = self.b
        if node.op is Op.TRANSFER:
            if node.outputs[0] not in self.cts:
                return
            source = self.types[node.inputs[0]]
            back = b.transfer(self._cotangent(node.outputs[0]), source.spec, source.slice)
            self.cts.setdefault(node.inputs[0], []).append(back)
            return
        a = node.attrs
        assert isinstance(a, ComputeAttrs) and vjp is not None
        outs = [v for v in node.outputs if v in active]
        if not any(v in self.cts for v in outs):
            return  # every cotangent it would take is zero: so are those it would give
        wrt = [i for i, v in enumerate(node.inputs) if v in active]
        ref = b.artifact(vjp.bwd.data, dict(vjp.bwd.meta))
        cts = [self._cotangent(v) for v in outs]
        ins = [*vjp.residuals, *(self.types[v].sig for v in outs)]
        made = b.compute(f"{a.name}_bwd", ref, a.slice, [*residuals, *cts], [a.ins[i] for i in wrt], ins=ins)
        for i, ct in zip(wrt, made, strict=True):
            self.cts.setdefault(node.inputs[i], []).append(ct)

    def _cotangent(self, value: str) -> str:
        """The value's cotangent in the new program: the sum of what was contributed, or zeros."""
        t = self.types[value]
        parts = self.cts.get(value, [])
        if not parts:
            ct = self._constant(self.rules.zeros(t), t, "grad_zeros")
        elif len(parts) == 1:
            ct = parts[0]
        else:
            art = self.rules.add(t, len(parts))
            ref = self.b.artifact(art.data, dict(art.meta))
            n = len(parts)
            ct = self.b.compute(f"grad_add{n}", ref, t.slice, parts, [t.sig], ins=[t.sig] * n)[0]
        self.cts[value] = [ct]
        return ct

    def _constant(self, art: Artifact, t: Type, name: str) -> str:
        ref = self.b.artifact(art.data, dict(art.meta))
        return self.b.compute(name, ref, t.slice, (), [t.sig], ins=())[0]
