"""The verifier: `verify(program)` returns None or raises `VerifyError`.

Contract: a verified program has every operand defined by an earlier node of its own graph,
no value defined twice, every slice it names in the slice table, every spec fitting its
aval on its slice's mesh, every artifact it names in the artifact table, and every node
obeying its op's type rule (`ir.node.TYPE_RULES`), sub-graphs included. A `VerifyError`
names the node (its index and text line), says what was expected and what was found, and
shows the node with its neighbours, as JAX's jaxpr checker does. Passes leave verified IR.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ir.errors import InvalidArgument
from ir.node import TYPE_RULES, Env, GraphSig, Node, Op, RuleError, Type
from ir.program import Graph, Program, SliceDef
from ir.text import node_line


class VerifyError(InvalidArgument):
    """A program breaks a rule of the IR. `where` names the node, `problem` says what broke."""

    def __init__(self, where: str, problem: str, context: str) -> None:
        super().__init__(f"{where}: {problem}\n{context}")
        self.where, self.problem, self.context = where, problem, context

    def within(self, where: str) -> VerifyError:
        return VerifyError(f"{where}{self.where}", self.problem, self.context)


def verify(program: Program) -> None:
    """Raise `VerifyError` unless `program` is well formed and well typed."""
    _Checker(program.slice_table, frozenset(program.artifact_table)).graph(program.graph)


def graph_signature(graph: Graph, slices: Mapping[str, SliceDef], artifacts: frozenset[str]) -> GraphSig:
    """Verify a graph against the given tables; return the types of its args and results."""
    return _Checker(slices, artifacts).graph(graph)


def infer_node(
    node: Node, types: Mapping[str, Type], slices: Mapping[str, SliceDef], artifacts: frozenset[str]
) -> list[Type]:
    """The types of `node`'s outputs, with every operand already in `types` (for builders)."""
    return _Checker(slices, artifacts).node(node, types)


@dataclass(frozen=True)
class _Checker:
    slices: Mapping[str, SliceDef]
    artifacts: frozenset[str]

    def graph(self, graph: Graph) -> GraphSig:
        defined_at: dict[str, int] = {}
        for i, node in enumerate(graph.nodes):
            for value in node.outputs:
                defined_at.setdefault(value, i)
        types: dict[str, Type] = {}
        for i, node in enumerate(graph.nodes):
            try:
                _check_names(node, i, types, defined_at)
                outs = self.node(node, types)
            except RuleError as e:
                raise VerifyError(_where(graph, i), str(e), _neighbourhood(graph, i)) from None
            except VerifyError as e:
                raise e.within(f"{_where(graph, i)}, in ") from None
            types.update(zip(node.outputs, outs, strict=True))
        return tuple(types[v] for v in graph.args), tuple(types[v] for v in graph.results)

    def node(self, node: Node, types: Mapping[str, Type]) -> list[Type]:
        outs = TYPE_RULES[node.op](node, Env(types, self.slices, self.artifacts, self._subgraph))
        for value, t in zip(node.outputs, outs, strict=True):
            self._fits(value, t)
        return outs

    def _subgraph(self, graph: Graph, label: str) -> GraphSig:
        try:
            return self.graph(graph)
        except VerifyError as e:
            raise e.within(f"{label} ") from None

    def _fits(self, value: str, t: Type) -> None:
        if t.slice not in self.slices:
            raise RuleError(f"slice of {value}", f"a slice in the table {sorted(self.slices)}", f"@{t.slice}")
        mesh = self.slices[t.slice].mesh
        try:
            t.spec.check(t.aval, mesh, value)
        except InvalidArgument as e:
            expected = f"a spec that fits {t.aval} on @{t.slice} {mesh.to_json()}"
            raise RuleError(f"spec of {value}", expected, f"{t.spec} ({e})") from None


def _check_names(node: Node, index: int, types: Mapping[str, Type], defined_at: Mapping[str, int]) -> None:
    role = "result" if node.op is Op.RESULT else "operand"
    for value in node.inputs:
        if value not in types:
            later = defined_at.get(value, -1) >= index
            found = f"{value} defined later, by node {defined_at[value]}" if later else f"{value} undefined"
            raise RuleError(f"{role} {value}", "a value defined by an earlier node", found)
    seen: set[str] = set()
    for value in node.outputs:
        if value in types or value in seen:
            raise RuleError(f"output {value}", "a name not defined before",
                            f"{value} already defined by node {defined_at[value]}")
        seen.add(value)


def _where(graph: Graph, index: int) -> str:
    return f"node {index} `{node_line(graph.nodes[index])}`"


def _neighbourhood(graph: Graph, index: int) -> str:
    lines = []
    for i in range(max(index - 1, 0), min(index + 2, len(graph.nodes))):
        mark = ">" if i == index else " "
        lines.append(f"  {mark} {i:3d} | {node_line(graph.nodes[i])}")
    return "\n".join(lines)
