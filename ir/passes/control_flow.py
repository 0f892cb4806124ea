"""Lowering `WHILE` and `COND` to per-host dataflow control flow (Yu et al., EuroSys 2018).

Contract: called by `host_plans` for each `WHILE` / `COND` node of a lowered program (its
sub-graphs already routed, partitioned and scheduled), this emits, on every host that takes
part, the five primitives of `ir.plan` around the steps of the sub-graphs, in one global
order (every host's steps stay a subsequence of it). A host takes part when it holds an
operand or a result, runs a step of a sub-graph, or computes the predicate.

A `WHILE` with carry `c` becomes frame `F`, on each participating host `h`:

    Enter F (c on h) -> e               (values the body returns unchanged are invariants:
    Merge F (e | n) -> m                 entered once, never merged nor switched)
      <cond steps on m>                 the host(s) of the predicate compute it; the first
      send p to <other hosts> / recv p   sends it to every other participant, each iteration
    Switch p (m) -> exit: x | body: s   pivots %F.exit, %F.body
      <body steps on s, guarded by %F.body>
    NextIteration F (body results) -> n while p     back to Merge while p is live and true
    Exit F (x) -> the while's results

A `COND` with predicate `p` and operands `o` becomes, on each participating host:

    send p / recv p                     from the first host of p's slice to the others
    Switch p (o on h) -> branch k: a_k  pivots %C.k
      <branch k's steps on a_k, guarded by %C.k>   for each branch k
    Merge (branch results on h) -> the cond's results (the one live input)

Sub-graph values are renamed `%<frame>.<graph>.<name>` (`b` body, `c` cond, `kN` branch N)
so that one run's environment holds every level. A host runs up to the loop's
`parallel_iterations` iterations of it at once (`Enter.parallel`; `executors.iterations`),
except where a computation of the loop spans hosts (an island's JAX group): hosts must
enter those collectives in one order, so such a loop runs one iteration at a time.
"""

from __future__ import annotations

from typing import Protocol

from ir.node import Graph, Node
from ir.ops import CondAttrs, WhileAttrs
from ir.plan import DeviceMesh, Enter, Exit, Merge, NextIteration, Recv, Send, Step, Switch
from ir.types import Spec


class Lowering(Protocol):
    """What the lowering of control flow needs of the walk that calls it (`plans._Walk`)."""

    def emit(self, hosts: tuple[str, ...] | list[str], step: Step, guard: str | None) -> None: ...

    def hosts(self, value: str) -> tuple[str, ...]: ...

    def mesh_of_host(self, host: str) -> DeviceMesh: ...

    def graph(self, graph: Graph, names: dict[str, str], prefix: str, guard: str | None) -> list[str]: ...

    def hosts_of(self, graphs: list[tuple[Graph, dict[str, str], str]], guard: str | None) -> set[str]:
        """The hosts that `graph(...)` of each of `graphs` would give steps (emitting nothing)."""
        ...

    def spans_hosts(self, graph: Graph) -> bool:
        """Whether a computation of `graph`, or of a loop or branch in it, spans hosts."""
        ...


def _participants(walk: Lowering, values: list[str], graphs: list[tuple[Graph, dict[str, str], str]],
                  guard: str | None) -> set[str]:
    """Hosts of `values` and of every step the sub-graphs will emit."""
    return {h for v in values for h in walk.hosts(v)} | walk.hosts_of(graphs, guard)


def _broadcast(walk: Lowering, pred: str, hosts: list[str], frame: str, guard: str | None) -> dict[str, str]:
    """Send the predicate from its first host to every other participant; per host, the
    name its predicate has there."""
    sources = walk.hosts(pred)
    others = [h for h in hosts if h not in sources]
    names = {h: pred for h in sources}
    if others:
        tag, received = f"p.{frame}", f"%{frame}.p"
        walk.emit((sources[0],), Send(pred, tuple(others), tag), guard)
        for h in others:
            walk.emit((h,), Recv(received, (sources[0],), tag, walk.mesh_of_host(h), Spec(()), on_host=True),
                      guard)
            names[h] = received
    return names


def lower_while(walk: Lowering, node: Node, attrs: WhileAttrs, frame: str, guard: str | None) -> None:
    carry, outs = list(node.inputs), list(node.outputs)
    body_args, body_results = attrs.body.args, attrs.body.results
    invariant = [body_results[i] == body_args[i] for i in range(len(carry))]
    entered = [f"%{frame}.e{i}" for i in range(len(carry))]
    merged = [entered[i] if invariant[i] else f"%{frame}.m{i}" for i in range(len(carry))]
    exits = [entered[i] if invariant[i] else f"%{frame}.x{i}" for i in range(len(carry))]
    body_in = [entered[i] if invariant[i] else f"%{frame}.s{i}" for i in range(len(carry))]
    nexts = [f"%{frame}.n{i}" for i in range(len(carry))]
    cond_names = dict(zip(attrs.cond.args, merged, strict=True))
    body_names = dict(zip(body_args, body_in, strict=True))
    go, stop = f"%{frame}.body", f"%{frame}.exit"
    hosts = sorted(_participants(walk, carry, [(attrs.cond, cond_names, f"{frame}.c."),
                                               (attrs.body, body_names, f"{frame}.b.")], guard))
    on = {h: [i for i, v in enumerate(carry) if h in walk.hosts(v)] for h in hosts}
    moving = {h: [i for i in on[h] if not invariant[i]] for h in hosts}
    gang = walk.spans_hosts(attrs.cond) or walk.spans_hosts(attrs.body)
    parallel = 1 if gang else attrs.parallel_iterations
    for h in hosts:
        walk.emit((h,), Enter(frame, tuple(carry[i] for i in on[h]), tuple(entered[i] for i in on[h]),
                              parallel), guard)
    for h in hosts:
        walk.emit((h,), Merge(frame, tuple((entered[i], nexts[i]) for i in moving[h]),
                              tuple(merged[i] for i in moving[h])), None)
    (pred,) = walk.graph(attrs.cond, cond_names, f"{frame}.c.", guard)
    preds = _broadcast(walk, pred, hosts, frame, guard)
    for h in hosts:
        walk.emit((h,), Switch(preds[h], tuple(merged[i] for i in moving[h]),
                               (tuple(exits[i] for i in moving[h]), tuple(body_in[i] for i in moving[h])),
                               (stop, go)), None)
    results = walk.graph(attrs.body, body_names, f"{frame}.b.", go)
    for h in hosts:
        walk.emit((h,), NextIteration(frame, preds[h], tuple(results[i] for i in moving[h]),
                                      tuple(nexts[i] for i in moving[h])), None)
    for h in hosts:
        walk.emit((h,), Exit(frame, tuple(exits[i] for i in on[h]), tuple(outs[i] for i in on[h])), None)


def lower_cond(walk: Lowering, node: Node, attrs: CondAttrs, frame: str, guard: str | None) -> None:
    pred, operands, outs = node.inputs[0], list(node.inputs[1:]), list(node.outputs)
    branches = attrs.branches
    args = [[f"%{frame}.k{k}.a{i}" for i in range(len(operands))] for k in range(len(branches))]
    names = [dict(zip(b.args, args[k], strict=True)) for k, b in enumerate(branches)]
    pivots = tuple(f"%{frame}.k{k}" for k in range(len(branches)))
    prefixes = [f"{frame}.k{k}." for k in range(len(branches))]
    hosts = sorted(_participants(walk, [pred, *operands, *outs],
                                 [(b, names[k], prefixes[k]) for k, b in enumerate(branches)], guard))
    preds = _broadcast(walk, pred, hosts, frame, guard)
    on = {h: [i for i, v in enumerate(operands) if h in walk.hosts(v)] for h in hosts}
    for h in hosts:
        walk.emit((h,), Switch(preds[h], tuple(operands[i] for i in on[h]),
                               tuple(tuple(a[i] for i in on[h]) for a in args), pivots), None)
    results = [walk.graph(b, names[k], prefixes[k], pivots[k]) for k, b in enumerate(branches)]
    for h in hosts:
        mine = [j for j, v in enumerate(outs) if h in walk.hosts(v)]
        walk.emit((h,), Merge(None, tuple(tuple(r[j] for r in results) for j in mine),
                              tuple(outs[j] for j in mine)), None)
