"""Reverse mode's ops of the sharded dataflow IR (`ir.autodiff`), as `ir.ops` has the others:
each op's attributes and its type rule, side by side.

Contract:
- `PUSH`/`POP` a value saved on a per-run stack in one loop's iterations and taken back, last
  first, in another's; `REPEAT` a loop run as many times as the `WHILE` that saved its trip
  count ran, each host counting its iterations.
- Importing this module fills their `ATTRS`, `SUBGRAPHS` and `TYPE_RULES` entries
  (`ir/__init__.py` always does). `Attrs` is every op's attributes, both modules'.
"""

from __future__ import annotations

from dataclasses import dataclass

from ir.errors import InvalidArgument
from ir.node import ATTRS, IDENTIFIER, SUBGRAPHS, Graph, Node, Op, OpAttrs, RuleError, Type, check_name
from ir.ops import (
    TYPE_RULES,
    ArgAttrs,
    ComputeAttrs,
    CondAttrs,
    Env,
    RecvAttrs,
    ResultAttrs,
    SendAttrs,
    TransferAttrs,
    WhileAttrs,
    _arity,
    _carried,
    check_depth,
)

# --- PUSH / POP: a value saved in one iteration of a loop, taken back in another ------------

@dataclass(frozen=True)
class StackAttrs(OpAttrs):
    """A per-run stack on the hosts of `type`'s slice (reverse mode's residuals of a loop).
    `PUSH` saves its operand keyed by the iterations of its `depth` innermost loops (in the
    frames around those, the key's context); `POP`, in another loop nest of the same
    `depth`, takes back the value of the greatest key in its own context: pushed in
    iterations 0..n-1, popped n-1..0. One `PUSH` and one `POP` per stack, program-wide."""

    type: Type
    stack: str
    depth: int = 1
    swap: bool = True  # its values may move to host memory past the host's device budget

    def __post_init__(self) -> None:
        if not isinstance(self.type, Type):
            raise InvalidArgument(f"stack: expected a Type, found {self.type!r}")
        if not isinstance(self.swap, bool):
            raise InvalidArgument(f"stack {self.stack}: swap: expected a bool, found {self.swap!r}")
        check_name(self.stack, IDENTIFIER, "stack: name")
        check_depth(self.depth, f"stack {self.stack}", 1)


def _push_rule(node: Node, env: Env) -> list[Type]:
    a = node.attrs
    assert isinstance(a, StackAttrs)
    _arity(node, 1, 0)
    if env.types[node.inputs[0]] != a.type:
        raise RuleError(f"push of {node.inputs[0]} on stack {a.stack}", f"the stack's type {a.type}",
                        str(env.types[node.inputs[0]]))
    return []


def _pop_rule(node: Node, env: Env) -> list[Type]:
    assert isinstance(node.attrs, StackAttrs)
    _arity(node, 0, 1)
    return [node.attrs.type]


ATTRS[Op.PUSH], TYPE_RULES[Op.PUSH] = StackAttrs, _push_rule
ATTRS[Op.POP], TYPE_RULES[Op.POP] = StackAttrs, _pop_rule


# --- REPEAT: carry -> carry, the body run as many times as a `WHILE` ran (backwards) -------


@dataclass(frozen=True)
class RepeatAttrs(OpAttrs):
    """Run `body` as many times as the `WHILE` whose `trips` stack this names ran, taking its
    trip count back from that stack (the greatest key in its context, as a `POP`): each
    host counts its iterations itself, so no predicate is computed or sent."""

    body: Graph
    trips: str
    depth: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.body, Graph):
            raise InvalidArgument(f"repeat: expected a body Graph, found {self.body!r}")
        check_name(self.trips, IDENTIFIER, "repeat: trips stack")
        check_depth(self.depth, "repeat: depth", 0)


def _repeat_rule(node: Node, env: Env) -> list[Type]:
    assert isinstance(node.attrs, RepeatAttrs)
    _arity(node, len(node.inputs), len(node.inputs))
    return _carried(node, env, node.attrs.body, "repeat")


ATTRS[Op.REPEAT], TYPE_RULES[Op.REPEAT] = RepeatAttrs, _repeat_rule
SUBGRAPHS[Op.REPEAT] = lambda a: (a.body,)

Attrs = (ArgAttrs | ComputeAttrs | TransferAttrs | SendAttrs | RecvAttrs | ResultAttrs | WhileAttrs
         | CondAttrs | StackAttrs | RepeatAttrs)
