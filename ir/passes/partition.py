"""`partition`: cut the program between hosts.

Contract: every slice must be placed (else an `InvalidArgument` naming the slice); a slice
may span the hosts of an island (its computations then run on all of them, as one SPMD
program). A `local` transfer stays a `TRANSFER` (a reshard on one host). Each `island` or
`dcn` transfer

    %t = transfer %v -> T via R

becomes, at the same place,

    send %v to <hosts of T's slice> tag tK
    %t = recv T from <hosts of %v's slice> tag tK

(each host of %v's slice sends its shards to every host of T's slice, each of which takes
them all and places its part).

with the same output name, so later nodes are unchanged; sub-graphs (`WHILE`, `COND`)
are cut the same way. Tags are t0, t1, ... program-wide, innermost graphs first, skipping
tags the program already uses. A logical transfer (no route) is an
`InvalidArgument` (run `route_transfers` first). Input: a verified program.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping

from ir.errors import InvalidArgument
from ir.node import Graph, Node, Op, Type
from ir.ops import RecvAttrs, SendAttrs, TransferAttrs
from ir.passes.subgraphs import rewrite_graphs
from ir.program import Program
from ir.text import node_line


def partition(program: Program) -> Program:
    hosts = {s.name: s.placement.hosts if s.placement else () for s in program.slices}
    for name, placed in hosts.items():
        if not placed:
            raise InvalidArgument(f"partition: slice {name}: expected a placement, found none (run place)")
    used = {n.attrs.tag for n in program.graph.walk() if isinstance(n.attrs, SendAttrs | RecvAttrs)}
    tags = (t for t in (f"t{k}" for k in itertools.count()) if t not in used)

    def graph(g: Graph, types: Mapping[str, Type]) -> Graph:
        return Graph(tuple(_cut(g, types, hosts, tags)))

    return rewrite_graphs(program, graph)


def _cut(g: Graph, types: Mapping[str, Type], hosts: Mapping[str, tuple[str, ...]],
         tags: Iterator[str]) -> list[Node]:
    nodes: list[Node] = []
    for node in g.nodes:
        if node.op is not Op.TRANSFER:
            nodes.append(node)
            continue
        a = node.attrs
        assert isinstance(a, TransferAttrs)
        if a.route is None:
            raise InvalidArgument(
                f"partition: `{node_line(node)}`: expected a routed transfer, found a logical one "
                "(run route_transfers first)"
            )
        if a.route == "local":
            nodes.append(node)
            continue
        tag, value = next(tags), node.inputs[0]
        source, target = types[value].slice, a.type.slice
        nodes.append(Node(Op.SEND, (value,), (), SendAttrs(hosts[target], tag)))
        nodes.append(Node(Op.RECV, (), node.outputs, RecvAttrs(a.type, hosts[source], tag)))
    return nodes
