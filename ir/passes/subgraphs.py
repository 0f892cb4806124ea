"""Applying a graph rewrite to a program's graph and, recursively, to every sub-graph.

Contract: `rewrite_graphs(program, rewrite)` calls `rewrite(graph, types)` on every
sub-graph of every `WHILE` and `COND` (innermost first) and then on the top graph, with
`types` the graph's own value types, and rebuilds the nodes with the rewritten sub-graphs.
Passes that work node by node (`route_transfers`, `partition`, `schedule`) use it so that
control flow is lowered like straight-line code.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

from ir.node import Graph, Node, Op, Type
from ir.ops import CondAttrs, WhileAttrs
from ir.program import Program
from ir.stack_ops import RepeatAttrs
from ir.verify import graph_types

GraphRewrite = Callable[[Graph, Mapping[str, Type]], Graph]


def rewrite_graphs(program: Program, rewrite: GraphRewrite) -> Program:
    slices, artifacts = program.slice_table, frozenset(program.artifact_table)

    def graph(g: Graph) -> Graph:
        inner = Graph(tuple(node(n) for n in g.nodes))
        return rewrite(inner, graph_types(inner, slices, artifacts))

    def node(n: Node) -> Node:
        if n.op is Op.WHILE:
            assert isinstance(n.attrs, WhileAttrs)
            return replace(n, attrs=replace(n.attrs, cond=graph(n.attrs.cond), body=graph(n.attrs.body)))
        if n.op is Op.REPEAT:
            assert isinstance(n.attrs, RepeatAttrs)
            return replace(n, attrs=replace(n.attrs, body=graph(n.attrs.body)))
        if n.op is Op.COND:
            assert isinstance(n.attrs, CondAttrs)
            return replace(n, attrs=CondAttrs(tuple(graph(b) for b in n.attrs.branches)))
        return n

    return replace(program, graph=graph(program.graph))
