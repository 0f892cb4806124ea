"""Values, types and nodes of the sharded dataflow IR, and the per-op rule tables.

Contract:
- A `Node` applies one `Op` to named operand values and defines named output values (SSA:
  `%3`). Its attributes are a frozen dataclass owned by the op (`ATTRS[op]`), checked when
  the node is built. Nodes are values: change them with `dataclasses.replace`.
- A value's `Type` is its aval, its partition spec, and the virtual slice it lives on (a
  name in the program's slice table).
- `TYPE_RULES[op](node, env)` returns the types of the node's outputs from the types of its
  operands, or raises `RuleError` saying what was expected and what was found. The tables
  are filled next to each op's definition in `ir.ops`; `ir.verify` runs them, adding the
  checks common to every node, and hands `env.check_graph` to the control-flow rules.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ir.errors import InvalidArgument
from ir.types import Aval, Spec

if TYPE_CHECKING:
    from ir.ops import Attrs
    from ir.program import Graph, SliceDef

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


GraphSig = tuple[tuple[Type, ...], tuple[Type, ...]]


@dataclass(frozen=True)
class Env:
    """What a type rule may look at: operand types, the program's tables, a sub-graph checker."""

    types: Mapping[str, Type]
    slices: Mapping[str, SliceDef]
    artifacts: Collection[str]
    check_graph: Callable[[Graph, str], GraphSig]


@dataclass(frozen=True)
class Node:
    op: Op
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Attrs

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


TypeRule = Callable[[Node, Env], list[Type]]
TYPE_RULES: dict[Op, TypeRule] = {}
ATTRS: dict[Op, type] = {}
# The sub-graphs an op carries as attributes (`WHILE`, `COND`); ops without any are absent.
SUBGRAPHS: dict[Op, Callable[[Any], tuple[Graph, ...]]] = {}


def subgraphs(node: Node) -> tuple[Graph, ...]:
    rule = SUBGRAPHS.get(node.op)
    return rule(node.attrs) if rule else ()
