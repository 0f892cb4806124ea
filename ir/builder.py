"""`ProgramBuilder`: build a program node by node, checking each node as it is added.

Contract: every method that adds a node returns the names of the values it defines and
runs that node's type rule at once (abstract evaluation, as a JAX trace does), so a builder
never holds an ill-typed node: a mismatch raises `InvalidArgument` naming the node. Value
names are `%0`, `%1`, ... in order of definition. Sub-graphs for `while_` and `cond` come
from `sub()`, a builder with its own value scope sharing this one's slice and artifact
tables. `inline` adds another program's nodes, its arguments bound to values of this one.
`build()` returns a verified `Program`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from ir.errors import InvalidArgument
from ir.node import Graph, Node, Op, Sig, Type
from ir.ops import ArgAttrs, ComputeAttrs, CondAttrs, ResultAttrs, TransferAttrs, WhileAttrs
from ir.program import Artifact, Program, SliceDef
from ir.stack_ops import Attrs, RepeatAttrs, StackAttrs
from ir.text import node_line
from ir.types import Aval, MeshAxes, Spec
from ir.verify import VerifyError, infer_node, verify

SigLike = Sig | tuple[Aval, Any]


class ProgramBuilder:
    def __init__(
        self, slices: dict[str, SliceDef] | None = None, artifacts: dict[str, Artifact] | None = None
    ) -> None:
        self._slices = {} if slices is None else slices
        self._artifacts = {} if artifacts is None else artifacts
        self._nodes: list[Node] = []
        self._types: dict[str, Type] = {}

    # --- tables -----------------------------------------------------------------------------

    def slice(self, name: str, mesh: Mapping[str, int] | MeshAxes, island: str | None = None) -> str:
        """Declare a virtual slice; declaring the same slice again is a no-op."""
        axes = mesh if isinstance(mesh, MeshAxes) else MeshAxes.of(dict(mesh))
        new = SliceDef(name, axes, island)
        if self._slices.setdefault(name, new) != new:
            raise InvalidArgument(f"slice {name}: expected {self._slices[name]} again, found {new}")
        return name

    def artifact(self, data: bytes, meta: Mapping[str, str] | None = None) -> str:
        """Add an artifact's bytes to the table; returns its content hash."""
        art = Artifact.of(data, meta)
        self._artifacts.setdefault(art.hash, art)
        return art.hash

    def sub(self) -> ProgramBuilder:
        """A builder for a sub-graph (`while_`, `cond`): own values, shared tables."""
        return ProgramBuilder(self._slices, self._artifacts)

    def type_of(self, value: str) -> Type:
        if value not in self._types:
            raise InvalidArgument(f"value: expected one defined by this builder, found {value!r}")
        return self._types[value]

    # --- nodes ------------------------------------------------------------------------------

    def arg(self, aval: Aval, spec: Any, slice: str) -> str:
        return self._add(Op.ARG, (), 1, ArgAttrs(Type(aval, Spec.of(spec), slice)))[0]

    def compute(
        self,
        name: str,
        artifact: str | bytes | bytearray,
        slice: str,
        inputs: Sequence[str],
        outs: Sequence[SigLike],
        ins: Sequence[SigLike] | None = None,
    ) -> tuple[str, ...]:
        """One sharded computation; `ins` defaults to the operands' avals and specs."""
        ref = self.artifact(bytes(artifact)) if isinstance(artifact, bytes | bytearray) else artifact
        declared = [self.type_of(v).sig for v in inputs] if ins is None else [_sig(s) for s in ins]
        attrs = ComputeAttrs(name, ref, slice, tuple(declared), tuple(_sig(s) for s in outs))
        return self._add(Op.COMPUTE, tuple(inputs), len(outs), attrs)

    def transfer(self, value: str, spec: Any, slice: str) -> str:
        target = Type(self.type_of(value).aval, Spec.of(spec), slice)
        return self._add(Op.TRANSFER, (value,), 1, TransferAttrs(target))[0]

    def while_(self, carry: Sequence[str], cond: Graph, body: Graph, parallel_iterations: int = 1,
               swap: bool = True, trips: str | None = None, trips_depth: int = 0,
               counted: bool = False, remat: bool = False) -> tuple[str, ...]:
        attrs = WhileAttrs(cond, body, parallel_iterations, swap, trips, trips_depth, counted, remat)
        return self._add(Op.WHILE, tuple(carry), len(carry), attrs)

    def repeat(self, carry: Sequence[str], body: Graph, trips: str, depth: int = 0) -> tuple[str, ...]:
        return self._add(Op.REPEAT, tuple(carry), len(carry), RepeatAttrs(body, trips, depth))

    def cond(self, pred: str, operands: Sequence[str], branches: Sequence[Graph]) -> tuple[str, ...]:
        count = len(branches[0].results) if branches else 0
        return self._add(Op.COND, (pred, *operands), count, CondAttrs(tuple(branches)))

    def push(self, value: str, stack: str, depth: int = 1, swap: bool = True) -> None:
        self._add(Op.PUSH, (value,), 0, StackAttrs(self.type_of(value), stack, depth, swap))

    def pop(self, t: Type, stack: str, depth: int = 1, swap: bool = True) -> str:
        return self._add(Op.POP, (), 1, StackAttrs(t, stack, depth, swap))[0]

    def inline(self, program: Program, inputs: Sequence[str]) -> tuple[str, ...]:
        """Add `program`'s nodes here, its arguments bound to `inputs` (of its arguments'
        types), its slices and artifacts to this builder's tables; the values its results are."""
        graph = program.graph
        if len(inputs) != len(graph.args):
            raise InvalidArgument(f"inline: expected {len(graph.args)} inputs, got {len(inputs)}")
        for s in program.slices:
            if self._slices.setdefault(s.name, s) != s:
                raise InvalidArgument(f"inline: slice {s.name}: expected {self._slices[s.name]}, found {s}")
        for art in program.artifacts:
            self._artifacts.setdefault(art.hash, art)
        return self.splice(graph, inputs)

    def splice(self, graph: Graph, inputs: Sequence[str]) -> tuple[str, ...]:
        """Add `graph`'s nodes here (its slices and artifacts already in this builder's
        tables), its arguments bound to `inputs`; the values its results are."""
        if len(inputs) != len(graph.args):
            raise InvalidArgument(f"splice: expected {len(graph.args)} inputs, got {len(inputs)}")
        renamed = dict(zip(graph.args, inputs, strict=True))
        for node in graph.nodes:
            if node.op is Op.ARG:
                assert isinstance(node.attrs, ArgAttrs)
                found = self.type_of(renamed[node.outputs[0]])
                if found != node.attrs.type:
                    raise InvalidArgument(f"inline: argument {node.outputs[0]}: expected {node.attrs.type}, "
                                          f"found {found}")
            elif node.op is Op.RESULT:
                return tuple(renamed[v] for v in node.inputs)
            else:
                operands = tuple(renamed[v] for v in node.inputs)
                made = self._add(node.op, operands, len(node.outputs), cast(Attrs, node.attrs))
                renamed.update(zip(node.outputs, made, strict=True))
        raise AssertionError("a graph ends with its result")  # (`Graph` checks it)

    def result(self, *values: str) -> None:
        self._add(Op.RESULT, tuple(values), 0, ResultAttrs())

    def graph(self) -> Graph:
        return Graph(tuple(self._nodes))

    def build(self) -> Program:
        program = Program(self.graph(), tuple(self._slices.values()), tuple(self._artifacts.values()))
        verify(program)
        return program

    def _add(self, op: Op, inputs: tuple[str, ...], count: int, attrs: Attrs) -> tuple[str, ...]:
        if self._nodes and self._nodes[-1].op is Op.RESULT:
            raise InvalidArgument(f"{op.value}: expected no node after the result, found one")
        for value in inputs:
            self.type_of(value)
        outputs = tuple(f"%{len(self._types) + k}" for k in range(count))
        node = Node(op, inputs, outputs, attrs)
        try:
            types = infer_node(node, self._types, self._slices, frozenset(self._artifacts))
        except VerifyError as e:
            raise e.within(f"`{node_line(node)}`, in ") from None
        except InvalidArgument as e:
            raise InvalidArgument(f"`{node_line(node)}`: {e}") from None
        self._nodes.append(node)
        self._types.update(zip(outputs, types, strict=True))
        return outputs


def _sig(s: SigLike) -> Sig:
    return s if isinstance(s, Sig) else Sig(s[0], Spec.of(s[1]))
