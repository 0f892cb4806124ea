"""`schedule`: put the graph in the one global order its hosts run it in.

Contract: returns the program with the same nodes (and each sub-graph's) in a deterministic topological order:
the `ARG` nodes first, in their original order; the `RESULT` last; in between, list
scheduling: of the nodes whose operands are all defined (and, for a `RECV`, whose `SEND`
has been placed), the one with the longest path, counted in nodes, to the end of the graph
goes first, ties broken by original position. So sends go as early as they can and the
receiving host can start sooner. Every host's steps are a subsequence of this one order,
which is what keeps runs deadlock-free. Input: a verified program (every send before its
recv).
"""

from __future__ import annotations

import heapq

from ir.node import Graph, Op
from ir.ops import RecvAttrs, SendAttrs
from ir.passes.subgraphs import rewrite_graphs
from ir.program import Program


def schedule(program: Program) -> Program:
    return rewrite_graphs(program, lambda g, _types: _scheduled(g))


def _scheduled(graph: Graph) -> Graph:
    nodes = graph.nodes
    args = [n for n in nodes if n.op is Op.ARG]
    body = [n for n in nodes if n.op not in (Op.ARG, Op.RESULT)]
    producer = {v: i for i, n in enumerate(body) for v in n.outputs}
    sender = {n.attrs.tag: i for i, n in enumerate(body) if isinstance(n.attrs, SendAttrs)}
    deps = [
        {producer[v] for v in n.inputs if v in producer}
        | ({sender[n.attrs.tag]} if isinstance(n.attrs, RecvAttrs) else set())
        for n in body
    ]
    users: list[list[int]] = [[] for _ in body]
    for i, before in enumerate(deps):
        for d in before:
            users[d].append(i)
    height = [0] * len(body)
    for i in reversed(range(len(body))):  # users come later in a verified graph
        height[i] = 1 + max((height[u] for u in users[i]), default=0)
    waiting = [len(d) for d in deps]
    ready = [(-height[i], i) for i in range(len(body)) if not waiting[i]]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, (-height[u], u))
    assert len(order) == len(body), "schedule: the graph has a cycle; verify it first"
    return Graph((*args, *(body[i] for i in order), nodes[-1]))
