"""Values, types, nodes and graphs of the sharded dataflow IR.

Contract:
- A `Node` applies one `Op` to named operand values and defines named output values (SSA:
  `%3`). Its attributes are a frozen dataclass owned by the op (`ATTRS[op]`, an `OpAttrs`),
  checked when the node is built. Nodes are values: change them with `dataclasses.replace`.
- A `Graph` is a tuple of nodes in topological order whose last node, and only that one, is
  a `RESULT`; its inputs are the `ARG` nodes, in order. The bodies of `WHILE` and `COND`
  are graphs too, carried in their nodes' attributes (`SUBGRAPHS[op]`).
- A value's `Type` is its aval, its partition spec, and the virtual slice it lives on (a
  name in the program's slice table).
- The tables `ATTRS` and `SUBGRAPHS` (and `ir.ops.TYPE_RULES`) are filled next to each op's
  definition in `ir.ops`; a rule that finds a node wrong raises `RuleError` saying what was
  expected and what was found.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ir.errors import InvalidArgument
from ir.types import Aval, Spec

VALUE_NAME = re.compile(r"%[A-Za-z0-9_.]+")
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*")


class Op(enum.Enum):
    ARG = "arg"
    COMPUTE = "compute"
    TRANSFER = "transfer"
    SEND = "send"
    RECV = "recv"
    RESULT = "result"
    WHILE = "while"
    COND = "cond"
    PUSH = "push"
    POP = "pop"
    REPEAT = "repeat"


def check_name(name: object, pattern: re.Pattern[str], what: str) -> None:
    if not isinstance(name, str) or not pattern.fullmatch(name):
        raise InvalidArgument(f"{what}: expected a name matching {pattern.pattern}, found {name!r}")


def check_hosts(hosts: object, what: str) -> None:
    """`hosts` must be a non-empty tuple of distinct, non-empty host names."""
    if (not isinstance(hosts, tuple) or not hosts or not all(isinstance(h, str) and h for h in hosts)
            or len(set(hosts)) != len(hosts)):
        raise InvalidArgument(f"{what}: expected a non-empty tuple of distinct host names, got {hosts!r}")


@dataclass(frozen=True)
class Sig:
    """What a computation declares for one input or output: aval and spec on its slice."""

    aval: Aval
    spec: Spec

    def __post_init__(self) -> None:
        if not isinstance(self.aval, Aval) or not isinstance(self.spec, Spec):
            raise InvalidArgument(f"sig: expected an Aval and a Spec, found {self.aval!r}, {self.spec!r}")

    def on(self, slice_name: str) -> Type:
        return Type(self.aval, self.spec, slice_name)

    def __str__(self) -> str:
        return f"{self.aval} {self.spec}"


@dataclass(frozen=True)
class Type:
    """The type of a value: its aval, how it is sharded, and the virtual slice it lives on."""

    aval: Aval
    spec: Spec
    slice: str

    def __post_init__(self) -> None:
        Sig(self.aval, self.spec)
        check_name(self.slice, IDENTIFIER, "type: slice")

    @property
    def sig(self) -> Sig:
        return Sig(self.aval, self.spec)

    def __str__(self) -> str:
        return f"{self.aval} {self.spec} @{self.slice}"


class RuleError(InvalidArgument):
    """A node breaks its op's type rule; the verifier adds which node."""

    def __init__(self, what: str, expected: str, found: str) -> None:
        super().__init__(f"{what}: expected {expected}, found {found}")
        self.what, self.expected, self.found = what, expected, found


GraphSig = tuple[tuple[Type, ...], tuple[Type, ...]]  # a graph's argument and result types


@dataclass(frozen=True)
class OpAttrs:
    """The attributes of a node: each op's are a frozen dataclass of their own (`ir.ops`)."""


@dataclass(frozen=True)
class Node:
    op: Op
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: OpAttrs

    def __post_init__(self) -> None:
        if not isinstance(self.op, Op):
            raise InvalidArgument(f"node: expected an Op, found {self.op!r}")
        for field in ("inputs", "outputs"):
            names = getattr(self, field)
            if not isinstance(names, tuple):
                raise InvalidArgument(f"{self.op.value} {field}: expected a tuple, found {names!r}")
            for name in names:
                check_name(name, VALUE_NAME, f"{self.op.value} {field}")
        if not isinstance(self.attrs, ATTRS[self.op]):
            raise InvalidArgument(
                f"{self.op.value}: expected attributes {ATTRS[self.op].__name__}, found {self.attrs!r}"
            )


ATTRS: dict[Op, type[OpAttrs]] = {}
# The sub-graphs an op carries as attributes (`WHILE`, `COND`); ops without any are absent.
SUBGRAPHS: dict[Op, Callable[[Any], tuple[Graph, ...]]] = {}


def subgraphs(node: Node) -> tuple[Graph, ...]:
    rule = SUBGRAPHS.get(node.op)
    return rule(node.attrs) if rule else ()


@dataclass(frozen=True)
class Graph:
    nodes: tuple[Node, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.nodes, tuple) or not all(isinstance(n, Node) for n in self.nodes):
            raise InvalidArgument(f"graph: expected a tuple of Nodes, found {self.nodes!r}")
        results = [i for i, n in enumerate(self.nodes) if n.op is Op.RESULT]
        if results != [len(self.nodes) - 1]:
            raise InvalidArgument(
                f"graph: expected exactly one result node, last; found result nodes at {results} "
                f"of {len(self.nodes)} nodes"
            )

    @property
    def args(self) -> tuple[str, ...]:
        return tuple(n.outputs[0] for n in self.nodes if n.op is Op.ARG and n.outputs)

    @property
    def results(self) -> tuple[str, ...]:
        return self.nodes[-1].inputs

    def walk(self) -> Iterator[Node]:
        """Every node, those of sub-graphs included (each sub-graph's after its node)."""
        for node in self.nodes:
            yield node
            for sub in subgraphs(node):
                yield from sub.walk()

    def stats(self) -> dict[str, int]:
        """Nodes and edges (operand uses), sub-graphs included."""
        nodes, edges = len(self.nodes), sum(len(n.inputs) for n in self.nodes)
        for node in self.nodes:
            for sub in subgraphs(node):
                inner = sub.stats()
                nodes, edges = nodes + inner["nodes"], edges + inner["edges"]
        return {"nodes": nodes, "edges": edges}
