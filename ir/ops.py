"""The ops of the sharded dataflow IR: each op's attributes and its type rule, side by side.

Contract:
- `ARG` a program input; `COMPUTE` one sharded computation (one node whatever its shard
  count: shard counts live only in the slice table); `TRANSFER` a move and/or reshard of one
  value, aval unchanged; `RESULT` the graph's outputs, in order, always its last node;
  `WHILE` and `COND` functional control flow whose sub-graphs are closed (they see only
  their own `ARG`s) and have their own value scope.
- Importing this module fills `ATTRS` and `TYPE_RULES` (`ir/__init__.py` always does).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ir.errors import InvalidArgument
from ir.node import ATTRS, IDENTIFIER, SUBGRAPHS, TYPE_RULES, Env, Node, Op, RuleError, Sig, Type, check_name
from ir.types import Aval

if TYPE_CHECKING:
    from ir.program import Graph

BOOL_SCALAR = Aval((), "bool")
INT32_SCALAR = Aval((), "int32")


def _arity(node: Node, inputs: int, outputs: int) -> None:
    if len(node.inputs) != inputs:
        raise RuleError(f"{node.op.value} operands", f"{inputs}", f"{len(node.inputs)}")
    if len(node.outputs) != outputs:
        raise RuleError(f"{node.op.value} outputs", f"{outputs}", f"{len(node.outputs)}")


def _same(what: str, expected: Sequence[Type], found: Sequence[Type]) -> None:
    if tuple(expected) != tuple(found):
        show = lambda ts: "(" + ", ".join(map(str, ts)) + ")"  # noqa: E731
        raise RuleError(what, show(expected), show(found))




# --- ARG: one program input ------------------------------------------------------------------


@dataclass(frozen=True)
class ArgAttrs:
    type: Type

    def __post_init__(self) -> None:
        if not isinstance(self.type, Type):
            raise InvalidArgument(f"arg: expected a Type, found {self.type!r}")


def _arg_rule(node: Node, env: Env) -> list[Type]:
    assert isinstance(node.attrs, ArgAttrs)
    _arity(node, 0, 1)
    return [node.attrs.type]


ATTRS[Op.ARG], TYPE_RULES[Op.ARG] = ArgAttrs, _arg_rule


# --- COMPUTE: one sharded computation --------------------------------------------------------


@dataclass(frozen=True)
class ComputeAttrs:
    """A computation: `artifact` is the content hash of its bytes in the program's table."""

    name: str
    artifact: str
    slice: str
    ins: tuple[Sig, ...]
    outs: tuple[Sig, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.fullmatch(r"[^\s(){}@%,]+", self.name):
            raise InvalidArgument(f"compute: expected a name without spaces or (){{}}@%, found {self.name!r}")
        check_name(self.artifact, re.compile(r"[a-z0-9]+:[0-9a-f]+"), f"compute {self.name}: artifact")
        check_name(self.slice, IDENTIFIER, f"compute {self.name}: slice")
        for field in ("ins", "outs"):
            sigs = getattr(self, field)
            if not isinstance(sigs, tuple) or not all(isinstance(s, Sig) for s in sigs):
                raise InvalidArgument(f"compute {self.name} {field}: expected a tuple of Sig, found {sigs!r}")


def _compute_rule(node: Node, env: Env) -> list[Type]:
    a = node.attrs
    assert isinstance(a, ComputeAttrs)
    _arity(node, len(a.ins), len(a.outs))
    if a.artifact not in env.artifacts:
        raise RuleError(f"artifact of {a.name}", "a hash in the program's artifact table",
                        f"{a.artifact} (table holds {len(env.artifacts)})")
    if a.slice not in env.slices:
        raise RuleError(f"slice of {a.name}", f"one of {sorted(env.slices)}", f"@{a.slice}")
    for i, (value, sig) in enumerate(zip(node.inputs, a.ins, strict=True)):
        found, expected = env.types[value], sig.on(a.slice)
        if found != expected:
            hint = " (a change of slice or spec needs an explicit transfer)" if found.aval == sig.aval else ""
            raise RuleError(f"operand {i} ({value}) of {a.name}", str(expected), f"{found}{hint}")
    return [sig.on(a.slice) for sig in a.outs]


ATTRS[Op.COMPUTE], TYPE_RULES[Op.COMPUTE] = ComputeAttrs, _compute_rule


# --- TRANSFER: move and/or reshard one value; the aval never changes ------------------------


@dataclass(frozen=True)
class TransferAttrs:
    type: Type

    def __post_init__(self) -> None:
        if not isinstance(self.type, Type):
            raise InvalidArgument(f"transfer: expected a Type, found {self.type!r}")


def _transfer_rule(node: Node, env: Env) -> list[Type]:
    assert isinstance(node.attrs, TransferAttrs)
    _arity(node, 1, 1)
    source, target = env.types[node.inputs[0]], node.attrs.type
    if source.aval != target.aval:
        raise RuleError(f"transfer of {node.inputs[0]}", f"aval {source.aval} (a transfer keeps the aval)",
                        f"{target.aval}")
    return [target]


ATTRS[Op.TRANSFER], TYPE_RULES[Op.TRANSFER] = TransferAttrs, _transfer_rule


# --- RESULT: the graph's outputs, in order; always the last node -----------------------------


@dataclass(frozen=True)
class ResultAttrs:
    pass


def _result_rule(node: Node, env: Env) -> list[Type]:
    _arity(node, len(node.inputs), 0)
    return []


ATTRS[Op.RESULT], TYPE_RULES[Op.RESULT] = ResultAttrs, _result_rule


# --- WHILE: carry -> carry while cond(carry) --------------------------------------------------


@dataclass(frozen=True)
class WhileAttrs:
    cond: Graph
    body: Graph

    def __post_init__(self) -> None:
        from ir.program import Graph

        if not isinstance(self.cond, Graph) or not isinstance(self.body, Graph):
            raise InvalidArgument(f"while: expected cond and body Graphs, found {self.cond!r}, {self.body!r}")


def _while_rule(node: Node, env: Env) -> list[Type]:
    a = node.attrs
    assert isinstance(a, WhileAttrs)
    _arity(node, len(node.inputs), len(node.inputs))
    carry = [env.types[v] for v in node.inputs]
    cond_args, cond_results = env.check_graph(a.cond, "cond")
    _same("while cond arguments", carry, cond_args)
    if len(cond_results) != 1 or cond_results[0].aval != BOOL_SCALAR:
        raise RuleError("while cond results", "one bool[] scalar",
                        "(" + ", ".join(map(str, cond_results)) + ")")
    body_args, body_results = env.check_graph(a.body, "body")
    _same("while body arguments", carry, body_args)
    _same("while body results (the carry types)", carry, body_results)
    return carry


ATTRS[Op.WHILE], TYPE_RULES[Op.WHILE] = WhileAttrs, _while_rule
SUBGRAPHS[Op.WHILE] = lambda a: (a.cond, a.body)


# --- COND: run branches[pred] on the operands; inputs are (pred, *operands) -------------------


@dataclass(frozen=True)
class CondAttrs:
    branches: tuple[Graph, ...]

    def __post_init__(self) -> None:
        from ir.program import Graph

        if not isinstance(self.branches, tuple) or not self.branches or not all(
            isinstance(b, Graph) for b in self.branches
        ):
            raise InvalidArgument(f"cond: expected a non-empty tuple of Graphs, found {self.branches!r}")


def _cond_rule(node: Node, env: Env) -> list[Type]:
    a = node.attrs
    assert isinstance(a, CondAttrs)
    if not node.inputs:
        raise RuleError("cond operands", "a predicate first", "no operands")
    pred = env.types[node.inputs[0]]
    if pred.aval not in (BOOL_SCALAR, INT32_SCALAR):
        raise RuleError(f"cond predicate {node.inputs[0]}", "a bool[] or int32[] scalar", str(pred.aval))
    if pred.aval == BOOL_SCALAR and len(a.branches) != 2:
        raise RuleError("cond branches", "2 for a bool[] predicate (false, true)", str(len(a.branches)))
    operands = [env.types[v] for v in node.inputs[1:]]
    sigs = [env.check_graph(b, f"branch {k}") for k, b in enumerate(a.branches)]
    for k, (args, results) in enumerate(sigs):
        _same(f"cond branch {k} arguments", operands, args)
        _same(f"cond branch {k} results (those of branch 0)", sigs[0][1], results)
    _arity(node, len(node.inputs), len(sigs[0][1]))
    return list(sigs[0][1])


ATTRS[Op.COND], TYPE_RULES[Op.COND] = CondAttrs, _cond_rule
SUBGRAPHS[Op.COND] = lambda a: a.branches

Attrs = ArgAttrs | ComputeAttrs | TransferAttrs | ResultAttrs | WhileAttrs | CondAttrs
