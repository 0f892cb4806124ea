"""The ops of the sharded dataflow IR: each op's attributes and its type rule, side by side.

Contract:
- `ARG` a program input; `COMPUTE` one sharded computation (one node whatever its shard
  count: shard counts live only in the slice table); `TRANSFER` a move and/or reshard of one
  value, aval unchanged: *logical* (`route` None) as the tracer inserts it, or *physical* once
  its slices are placed (`route` in `ROUTES`, which must agree with the placements);
  `SEND`/`RECV` one value from one host to another, paired by `tag` (the verifier checks the
  pairs), on placed slices only; `RESULT` the graph's outputs, in order, always its last node;
  `WHILE` and `COND` functional control flow whose sub-graphs are closed (they see only
  their own `ARG`s) and have their own value scope. Reverse mode's `PUSH`, `POP` and
  `REPEAT` are `ir.stack_ops`'s.
- `TYPE_RULES[op](node, env)` returns the types of the node's outputs from the types of its
  operands (`Env`), or raises `RuleError`; `ir.verify` runs them, adding the checks common
  to every node, and hands `env.check_graph` to the control-flow rules.
- Importing this module fills `ATTRS`, `SUBGRAPHS` and `TYPE_RULES` (`ir/__init__.py` always
  does).
"""

from __future__ import annotations

import numbers
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

from ir.errors import InvalidArgument
from ir.node import (
    ATTRS,
    IDENTIFIER,
    SUBGRAPHS,
    Graph,
    GraphSig,
    Node,
    Op,
    OpAttrs,
    RuleError,
    Sig,
    Type,
    check_hosts,
    check_name,
)
from ir.program import SliceDef
from ir.types import DTYPES, Aval


@dataclass(frozen=True)
class Env:
    """What a type rule may look at: operand types, the program's tables, a sub-graph checker."""

    types: Mapping[str, Type]
    slices: Mapping[str, SliceDef]
    artifacts: Collection[str]
    check_graph: Callable[[Graph, str], GraphSig]


TypeRule = Callable[[Node, Env], list[Type]]
TYPE_RULES: dict[Op, TypeRule] = {}

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


def _hosts(env: Env, slice_name: str, what: str) -> tuple[str, ...]:
    """The hosts a slice is placed on; sends and receives exist only between placed slices.
    (A slice missing from the table is the verifier's to report, naming the value.)"""
    if slice_name not in env.slices:
        return ()
    placement = env.slices[slice_name].placement
    if placement is None:
        raise RuleError(f"slice of {what}", "a placed slice (sends and receives run between hosts)",
                        f"@{slice_name} unplaced")
    return placement.hosts


# --- ARG: one program input ------------------------------------------------------------------


@dataclass(frozen=True)
class ArgAttrs(OpAttrs):
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
class ComputeAttrs(OpAttrs):
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


ROUTES = ("local", "island", "dcn")


def transfer_route(source: SliceDef, target: SliceDef) -> str | None:
    """How a value moves between two slices: `local` when both lie on one and the same host,
    `island` between hosts of one island, `dcn` between islands; None while either is unplaced."""
    if source.placement is None or target.placement is None:
        return None
    if source.placement.island != target.placement.island:
        return "dcn"
    return "local" if len({*source.placement.hosts, *target.placement.hosts}) == 1 else "island"


@dataclass(frozen=True)
class TransferAttrs(OpAttrs):
    type: Type
    route: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.type, Type):
            raise InvalidArgument(f"transfer: expected a Type, found {self.type!r}")
        if self.route is not None and self.route not in ROUTES:
            raise InvalidArgument(
                f"transfer to {self.type}: expected a route in {ROUTES}, found {self.route!r}"
            )


def _transfer_rule(node: Node, env: Env) -> list[Type]:
    a = node.attrs
    assert isinstance(a, TransferAttrs)
    _arity(node, 1, 1)
    source, target = env.types[node.inputs[0]], a.type
    if source.aval != target.aval:
        raise RuleError(f"transfer of {node.inputs[0]}", f"aval {source.aval} (a transfer keeps the aval)",
                        f"{target.aval}")
    if a.route is not None and target.slice in env.slices:
        src, dst = env.slices[source.slice], env.slices[target.slice]
        expected = transfer_route(src, dst)
        if expected is None:
            unplaced = ", ".join(f"@{s.name}" for s in (src, dst) if s.placement is None)
            raise RuleError(f"route of the transfer of {node.inputs[0]}",
                            "placed slices (a route is physical)", f"via {a.route} with {unplaced} unplaced")
        if expected != a.route:
            where = ", ".join(f"@{s.name} on {s.placement.island}[{', '.join(s.placement.hosts)}]"
                              for s in (src, dst) if s.placement is not None)
            raise RuleError(f"route of the transfer of {node.inputs[0]}", f"via {expected} ({where})",
                            f"via {a.route}")
    return [target]


ATTRS[Op.TRANSFER], TYPE_RULES[Op.TRANSFER] = TransferAttrs, _transfer_rule


# --- SEND / RECV: one value from one host to another, paired by tag ------------------------


@dataclass(frozen=True)
class SendAttrs(OpAttrs):
    """Hand the operand to the hosts `to` (every host of the receiving slice); the `RECV` with
    the same `tag` takes it there. From a slice spanning hosts, each of its hosts sends its
    shards."""

    to: tuple[str, ...]
    tag: str

    def __post_init__(self) -> None:
        _check_hosts(self.to, "send: hosts")
        check_name(self.tag, IDENTIFIER, f"send to {','.join(self.to)}: tag")


def _check_hosts(hosts: tuple[str, ...], what: str) -> None:
    check_hosts(hosts, what)
    for h in hosts:
        check_name(h, IDENTIFIER, what)


def _send_rule(node: Node, env: Env) -> list[Type]:
    assert isinstance(node.attrs, SendAttrs)
    _arity(node, 1, 0)
    _hosts(env, env.types[node.inputs[0]].slice, f"{node.inputs[0]} (sent with tag {node.attrs.tag})")
    return []


ATTRS[Op.SEND], TYPE_RULES[Op.SEND] = SendAttrs, _send_rule


@dataclass(frozen=True)
class RecvAttrs(OpAttrs):
    """Take the value the `SEND` with the same `tag` hands over from the hosts `sources`
    (every host of the sending slice); each host of the receiving slice takes all of it."""

    type: Type
    sources: tuple[str, ...]
    tag: str

    def __post_init__(self) -> None:
        if not isinstance(self.type, Type):
            raise InvalidArgument(f"recv: expected a Type, found {self.type!r}")
        _check_hosts(self.sources, "recv: hosts")
        check_name(self.tag, IDENTIFIER, f"recv from {','.join(self.sources)}: tag")


def _recv_rule(node: Node, env: Env) -> list[Type]:
    a = node.attrs
    assert isinstance(a, RecvAttrs)
    _arity(node, 0, 1)
    _hosts(env, a.type.slice, f"{node.outputs[0]} (received with tag {a.tag})")
    return [a.type]


ATTRS[Op.RECV], TYPE_RULES[Op.RECV] = RecvAttrs, _recv_rule


# --- RESULT: the graph's outputs, in order; always the last node -----------------------------


@dataclass(frozen=True)
class ResultAttrs(OpAttrs):
    pass


def _result_rule(node: Node, env: Env) -> list[Type]:
    _arity(node, len(node.inputs), 0)
    return []


ATTRS[Op.RESULT], TYPE_RULES[Op.RESULT] = ResultAttrs, _result_rule


# --- WHILE: carry -> carry while cond(carry) --------------------------------------------------

MAX_PARALLEL_ITERATIONS = 64  # a host holds one environment per iteration it runs at once


@dataclass(frozen=True)
class WhileAttrs(OpAttrs):
    cond: Graph
    body: Graph
    # How many iterations a host may run at once (`executors.iterations`); 1: one at a time.
    parallel_iterations: int = 1
    # Whether what its gradient saves per iteration may be swapped to host memory (`PUSH`).
    swap: bool = True
    # A stack its trip count is saved on, on each of its hosts, as it exits (a `REPEAT` takes
    # it back), keyed by the iterations of `trips_depth` loops around it (`StackAttrs`).
    trips: str | None = None
    trips_depth: int = 0
    # `cond` gives, from the carry entered, how many iterations the loop runs (an integer
    # scalar; none where not positive), once, before the loop: each host then counts its
    # iterations itself (as a `REPEAT` does), so no predicate is computed or sent per
    # iteration. `jax.lax.fori_loop`'s form, whose bounds the body cannot change.
    counted: bool = False
    # Its gradient saves each iteration's carry as it enters the body, not the residuals, and
    # its backward computes the body's forward again from it (`jax.checkpoint`'s trade).
    remat: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.cond, Graph) or not isinstance(self.body, Graph):
            raise InvalidArgument(f"while: expected cond and body Graphs, found {self.cond!r}, {self.body!r}")
        object.__setattr__(self, "parallel_iterations", check_parallel_iterations(self.parallel_iterations))
        if not isinstance(self.swap, bool):
            raise InvalidArgument(f"while: swap: expected a bool, found {self.swap!r}")
        if self.trips is not None:
            check_name(self.trips, IDENTIFIER, "while: trips stack")
        check_depth(self.trips_depth, "while: trips_depth", 0)
        if not isinstance(self.counted, bool):
            raise InvalidArgument(f"while: counted: expected a bool, found {self.counted!r}")
        if not isinstance(self.remat, bool):
            raise InvalidArgument(f"while: remat: expected a bool, found {self.remat!r}")


MAX_STACK_DEPTH = 16  # (loops nest no deeper on the wire)


def check_depth(depth: object, what: str, least: int) -> None:
    if isinstance(depth, bool) or not isinstance(depth, int) or not least <= depth <= MAX_STACK_DEPTH:
        raise InvalidArgument(f"{what}: expected a depth from {least} to {MAX_STACK_DEPTH}, found {depth!r}")


def check_parallel_iterations(value: object) -> int:
    """A loop's `parallel_iterations`, checked (an integer from 1 to MAX_PARALLEL_ITERATIONS)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) \
            or not 1 <= int(value) <= MAX_PARALLEL_ITERATIONS:
        raise InvalidArgument(f"parallel_iterations must be an integer from 1 to {MAX_PARALLEL_ITERATIONS}, "
                              f"found {value!r}")
    return int(value)


def _while_rule(node: Node, env: Env) -> list[Type]:
    a = node.attrs
    assert isinstance(a, WhileAttrs)
    _arity(node, len(node.inputs), len(node.inputs))
    carry = [env.types[v] for v in node.inputs]
    cond_args, cond_results = env.check_graph(a.cond, "cond")
    _same("while cond arguments", carry, cond_args)
    if a.counted:
        if len(cond_results) != 1 or cond_results[0].aval.shape != () or \
                DTYPES[cond_results[0].aval.dtype].kind not in "iu":
            raise RuleError("counted while cond results", "one integer scalar (the trip count)",
                            "(" + ", ".join(map(str, cond_results)) + ")")
    elif len(cond_results) != 1 or cond_results[0].aval != BOOL_SCALAR:
        raise RuleError("while cond results", "one bool[] scalar",
                        "(" + ", ".join(map(str, cond_results)) + ")")
    return _carried(node, env, a.body, "while")


def _carried(node: Node, env: Env, body: Graph, what: str) -> list[Type]:
    """A loop's carry types, checked against its body's arguments and results."""
    carry = [env.types[v] for v in node.inputs]
    body_args, body_results = env.check_graph(body, "body")
    _same(f"{what} body arguments", carry, body_args)
    _same(f"{what} body results (the carry types)", carry, body_results)
    return carry


ATTRS[Op.WHILE], TYPE_RULES[Op.WHILE] = WhileAttrs, _while_rule
SUBGRAPHS[Op.WHILE] = lambda a: (a.cond, a.body)


# --- COND: run branches[pred] on the operands; inputs are (pred, *operands) -------------------


@dataclass(frozen=True)
class CondAttrs(OpAttrs):
    branches: tuple[Graph, ...]

    def __post_init__(self) -> None:
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
