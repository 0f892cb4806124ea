"""`route_transfers`: make every logical transfer physical.

Contract: the tracer inserts a *logical* `TRANSFER` (route None) wherever a value meets a
computation on another slice or spec, so every edge of the IR is exactly typed. Once the
slices are placed, this pass sets each transfer's route from the placements of its
source and target slices (`ir.ops.transfer_route`), in sub-graphs too: `local` when both
lie on one and the same host, `island` between hosts of one island, `dcn` between
islands. Routes already set are recomputed. Nothing else changes. A transfer whose source
or target slice is unplaced is an `InvalidArgument` naming the transfer and the slice.
Input: a verified program.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ir.errors import InvalidArgument
from ir.node import Graph, Node, Op, Type
from ir.ops import TransferAttrs, transfer_route
from ir.passes.subgraphs import rewrite_graphs
from ir.program import Program
from ir.text import node_line


def route_transfers(program: Program) -> Program:
    slices = program.slice_table

    def graph(g: Graph, types: Mapping[str, Type]) -> Graph:
        return Graph(tuple(routed(n, types) for n in g.nodes))

    def routed(node: Node, types: Mapping[str, Type]) -> Node:
        if node.op is not Op.TRANSFER:
            return node
        assert isinstance(node.attrs, TransferAttrs)
        source, target = slices[types[node.inputs[0]].slice], slices[node.attrs.type.slice]
        route = transfer_route(source, target)
        if route is None:
            unplaced = ", ".join(s.name for s in (source, target) if s.placement is None)
            raise InvalidArgument(
                f"route_transfers: `{node_line(node)}`: expected placed slices, found {unplaced} unplaced "
                "(run place first)"
            )
        return replace(node, attrs=replace(node.attrs, route=route))

    return rewrite_graphs(program, graph)
