"""The verifier: `verify(program)` returns None or raises `VerifyError`.

Contract: a verified program has every operand defined by an earlier node of its own graph,
no value defined twice, every slice it names in the slice table, every spec fitting its
aval on its slice's mesh, every artifact it names in the artifact table, every node
obeying its op's type rule (`ir.ops.TYPE_RULES`), sub-graphs included, and in each graph
its sends and receives in pairs: one `SEND` and one `RECV` per tag, the send first (sends do
not block, so an order with every send before its receive cannot deadlock), the same aval
on both sides, and each side naming a host the other side's slice is placed on. A
`VerifyError` names the node (its index and text line), says what was expected and what was
found, and shows the node with its neighbours, as JAX's jaxpr checker does. Passes leave
verified IR.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NoReturn

from ir.errors import InvalidArgument
from ir.node import Graph, GraphSig, Node, Op, RuleError, Type
from ir.ops import TYPE_RULES, Env, RecvAttrs, SendAttrs, WhileAttrs
from ir.program import Program, SliceDef
from ir.stack_ops import RepeatAttrs, StackAttrs
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
    _check_stacks(program.graph)


def value_types(program: Program) -> dict[str, Type]:
    """Verify `program`; return the type of every value its top graph defines (for passes)."""
    return _Checker(program.slice_table, frozenset(program.artifact_table)).values(program.graph)


def graph_signature(graph: Graph, slices: Mapping[str, SliceDef], artifacts: frozenset[str]) -> GraphSig:
    """Verify a graph against the given tables; return the types of its args and results."""
    return _Checker(slices, artifacts).graph(graph)


def graph_types(graph: Graph, slices: Mapping[str, SliceDef], artifacts: frozenset[str]) -> dict[str, Type]:
    """Verify a graph against the given tables; return the type of every value it defines
    (its own scope: not those of its sub-graphs)."""
    return _Checker(slices, artifacts).values(graph)


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
        types = self.values(graph)
        return tuple(types[v] for v in graph.args), tuple(types[v] for v in graph.results)

    def values(self, graph: Graph) -> dict[str, Type]:
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
        _check_pairs(graph, types, self.slices)
        return types

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


def _check_stacks(graph: Graph) -> None:
    """One `PUSH` and one `POP` per stack, program-wide, of the same type and depth; a
    `REPEAT`'s trip count saved by one `WHILE`, at the same depth."""
    at: dict[tuple[Op, str], list[Node]] = {}
    trips: dict[str, tuple[list[Node], list[Node]]] = {}
    for node in graph.walk():
        if isinstance(node.attrs, StackAttrs):
            at.setdefault((node.op, node.attrs.stack), []).append(node)
        elif isinstance(node.attrs, WhileAttrs) and node.attrs.trips is not None:
            trips.setdefault(node.attrs.trips, ([], []))[0].append(node)
        elif isinstance(node.attrs, RepeatAttrs):
            trips.setdefault(node.attrs.trips, ([], []))[1].append(node)
    for stack, (saved, taken) in trips.items():
        first = (saved or taken)[0]
        if len(saved) != 1 or len(taken) != 1:
            problem = f"trips {stack}: expected one while that saves them and one repeat"
            raise VerifyError(f"`{node_line(first)}`", f"{problem}, found {len(saved)} and {len(taken)}", "")
        w, r = saved[0].attrs, taken[0].attrs
        assert isinstance(w, WhileAttrs) and isinstance(r, RepeatAttrs)
        if w.trips_depth != r.depth:
            raise VerifyError(f"`{node_line(taken[0])}`", f"trips {stack}: expected the depth of its while, "
                                                          f"{w.trips_depth}", "")
    for (op, stack), nodes in at.items():
        other = Op.POP if op is Op.PUSH else Op.PUSH
        if len(nodes) > 1 or (other, stack) not in at:
            found = f"{len(nodes)} {op.value}es" if len(nodes) > 1 else f"no {other.value}"
            raise VerifyError(f"`{node_line(nodes[0])}`", f"stack {stack}: expected one push and one pop, "
                                                          f"found {found}", "")
        mate = at[other, stack][0]
        if op is Op.POP and mate.attrs != nodes[0].attrs:
            raise VerifyError(f"`{node_line(nodes[0])}`", f"stack {stack}: expected the type and depth of "
                                                          f"its push `{node_line(mate)}`", "")


def _check_pairs(graph: Graph, types: Mapping[str, Type], slices: Mapping[str, SliceDef]) -> None:
    at: dict[tuple[Op, str], list[int]] = {}
    for i, node in enumerate(graph.nodes):
        if isinstance(node.attrs, SendAttrs | RecvAttrs):
            at.setdefault((node.op, node.attrs.tag), []).append(i)
    for (op, tag), where in at.items():
        if len(where) > 1:
            _pair_error(graph, where[1], f"tag {tag}: expected one {op.value} with this tag",
                        f"{len(where)}, also node {where[0]} `{node_line(graph.nodes[where[0]])}`")
        other = Op.RECV if op is Op.SEND else Op.SEND
        if (other, tag) not in at:
            _pair_error(graph, where[0], f"tag {tag}: expected a {other.value} with this tag", "none")
    for (op, tag), where in at.items():
        if op is Op.RECV:
            _check_pair(graph, at[Op.SEND, tag][0], where[0], types, slices)


def _check_pair(
    graph: Graph, s: int, r: int, types: Mapping[str, Type], slices: Mapping[str, SliceDef]
) -> None:
    send, recv = graph.nodes[s], graph.nodes[r]
    assert isinstance(send.attrs, SendAttrs) and isinstance(recv.attrs, RecvAttrs)
    tag, sent, received = send.attrs.tag, types[send.inputs[0]], recv.attrs.type
    pair = f"tag {tag} (sent by node {s} `{node_line(send)}`)"  # the error names the recv node
    if s > r:
        _pair_error(graph, r, f"{pair}: expected the send before the recv", "the send after it")
    if sent.aval != received.aval:
        _pair_error(graph, r, f"{pair}: expected the aval sent, {sent.aval}", f"{received.aval}")
    ends = (("send to go to", send.attrs.to, received.slice),
            ("recv to come from", recv.attrs.sources, sent.slice))
    for what, named, slice_name in ends:
        placement = slices[slice_name].placement  # placed: the SEND and RECV rules checked
        hosts = placement.hosts if placement else ()
        if named != hosts:
            expected = f"the hosts of @{slice_name} ({', '.join(hosts)})"
            _pair_error(graph, r, f"{pair}: expected the {what} {expected}", ", ".join(named))


def _pair_error(graph: Graph, index: int, problem: str, found: str) -> NoReturn:
    raise VerifyError(_where(graph, index), f"{problem}, found {found}", _neighbourhood(graph, index))


def _where(graph: Graph, index: int) -> str:
    return f"node {index} `{node_line(graph.nodes[index])}`"


def _neighbourhood(graph: Graph, index: int) -> str:
    lines = []
    for i in range(max(index - 1, 0), min(index + 2, len(graph.nodes))):
        mark = ">" if i == index else " "
        lines.append(f"  {mark} {i:3d} | {node_line(graph.nodes[i])}")
    return "\n".join(lines)
