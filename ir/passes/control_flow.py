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

A `REPEAT` (reverse mode's backward loop) becomes the same frame with no predicate
computed or sent: each host pops the trip count its `WHILE`'s `Exit` saved, enters it with
the carry, and its `Count` step is the predicate (`lower_repeat`). A counted `WHILE`
(`WhileAttrs.counted`, `fori_loop`'s) is lowered the same way, its cond's steps run once
before the frame on the carry entered and the trip count they give sent once to every other
participant (`_lower_counted`).

Sub-graph values are renamed `%<frame>.<graph>.<name>` (`b` body, `c` cond, `kN` branch N)
so that one run's environment holds every level. A host runs up to the loop's
`parallel_iterations` iterations of it at once (`Enter.parallel`; `executors.iterations`),
except where a computation of the loop spans hosts (an island's JAX group): hosts must
enter those collectives in one order, so such a loop runs one iteration at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from ir.node import Graph, Node
from ir.ops import CondAttrs, WhileAttrs
from ir.plan import Count, DeviceMesh, Enter, Exit, Merge, NextIteration, Pop, Recv, Send, Step, Switch
from ir.stack_ops import RepeatAttrs
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


@dataclass(frozen=True)
class _Frame:
    """A loop's values as one host's frame names them: the carry entered (`e`), merged at the
    head (`m`), switched to the exit (`x`) or the body (`s`), and the next iteration's (`n`);
    a carry the body returns unchanged is an invariant, entered once and never merged."""

    name: str
    carry: list[str]
    outs: list[str]
    invariant: list[bool]

    @classmethod
    def of(cls, name: str, node: Node, body: Graph) -> _Frame:
        carry = list(node.inputs)
        return cls(name, carry, list(node.outputs),
                   [body.results[i] == body.args[i] for i in range(len(carry))])

    def _named(self, kind: str) -> list[str]:
        return [f"%{self.name}.e{i}" if invariant else f"%{self.name}.{kind}{i}"
                for i, invariant in enumerate(self.invariant)]

    @property
    def entered(self) -> list[str]:
        return self._named("e")

    @property
    def merged(self) -> list[str]:
        return self._named("m")

    @property
    def exits(self) -> list[str]:
        return self._named("x")

    @property
    def body_in(self) -> list[str]:
        return self._named("s")

    @property
    def nexts(self) -> list[str]:
        return [f"%{self.name}.n{i}" for i in range(len(self.carry))]

    def on(self, walk: Lowering, host: str) -> tuple[list[int], list[int]]:
        """The carry positions the host holds, and those of them that move."""
        held = [i for i, v in enumerate(self.carry) if host in walk.hosts(v)]
        return held, [i for i in held if not self.invariant[i]]

    def head(self, walk: Lowering, hosts: list[str], parallel: int, guard: str | None,
             extra: Mapping[str, tuple[str, str]] | None = None) -> None:
        """Enter (the carry on each host, and the host's `extra` (value, entered name)) and
        Merge."""
        entered = self.entered
        for h in hosts:
            on, _ = self.on(walk, h)
            more = () if extra is None else (extra[h],)
            walk.emit((h,), Enter(self.name, (*(self.carry[i] for i in on), *(v for v, _ in more)),
                                  (*(entered[i] for i in on), *(e for _, e in more)), parallel), guard)
        for h in hosts:
            _, moving = self.on(walk, h)
            walk.emit((h,), Merge(self.name, tuple((entered[i], self.nexts[i]) for i in moving),
                                  tuple(self.merged[i] for i in moving)), None)

    def counted(self, walk: Lowering, hosts: list[str], parallel: int, guard: str | None,
                trips: Mapping[str, str], body: Graph,
                exit_: Callable[[tuple[str, ...], tuple[str, ...]], Exit]) -> None:
        """The frame with its trip count (`trips`: its name on each host) entered with the
        carry, and each host's `Count` of its iterations as the predicate."""
        counted, pred = f"%{self.name}.et", f"%{self.name}.q"
        self.head(walk, hosts, parallel, guard, {h: (trips[h], counted) for h in hosts})
        for h in hosts:
            walk.emit((h,), Count(self.name, counted, pred), None)
        self.tail(walk, hosts, dict.fromkeys(hosts, pred), body, exit_)

    def tail(self, walk: Lowering, hosts: list[str], preds: dict[str, str], body: Graph,
             exit_: Callable[[tuple[str, ...], tuple[str, ...]], Exit]) -> None:
        """Switch on each host's predicate, the body under `%F.body`, NextIteration, Exit."""
        go, stop = f"%{self.name}.body", f"%{self.name}.exit"
        for h in hosts:
            _, moving = self.on(walk, h)
            outs = (tuple(self.exits[i] for i in moving), tuple(self.body_in[i] for i in moving))
            walk.emit((h,), Switch(preds[h], tuple(self.merged[i] for i in moving), outs, (stop, go)), None)
        results = walk.graph(body, dict(zip(body.args, self.body_in, strict=True)), f"{self.name}.b.", go)
        for h in hosts:
            _, moving = self.on(walk, h)
            walk.emit((h,), NextIteration(self.name, preds[h], tuple(results[i] for i in moving),
                                          tuple(self.nexts[i] for i in moving)), None)
        for h in hosts:
            on, _ = self.on(walk, h)
            walk.emit((h,), exit_(tuple(self.exits[i] for i in on), tuple(self.outs[i] for i in on)), None)


def lower_while(walk: Lowering, node: Node, attrs: WhileAttrs, frame: str, guard: str | None) -> None:
    if attrs.counted:
        _lower_counted(walk, node, attrs, frame, guard)
        return
    f = _Frame.of(frame, node, attrs.body)
    cond_names = dict(zip(attrs.cond.args, f.merged, strict=True))
    body_names = dict(zip(attrs.body.args, f.body_in, strict=True))
    hosts = sorted(_participants(walk, f.carry, [(attrs.cond, cond_names, f"{frame}.c."),
                                                 (attrs.body, body_names, f"{frame}.b.")], guard))
    gang = walk.spans_hosts(attrs.cond) or walk.spans_hosts(attrs.body)
    # (a loop whose trips are saved runs one iteration at a time: its Exit counts them)
    parallel = 1 if gang or attrs.trips is not None else attrs.parallel_iterations
    f.head(walk, hosts, parallel, guard)
    (pred,) = walk.graph(attrs.cond, cond_names, f"{frame}.c.", guard)
    preds = _broadcast(walk, pred, hosts, frame, guard)
    f.tail(walk, hosts, preds, attrs.body,
           lambda inputs, outputs: Exit(frame, inputs, outputs, attrs.trips, attrs.trips_depth))


def _lower_counted(walk: Lowering, node: Node, attrs: WhileAttrs, frame: str, guard: str | None) -> None:
    """A counted `WHILE`: its cond run once, on the carry entered, before the frame; the trip
    count sent to every participant, each of which counts its iterations (`Count`)."""
    f = _Frame.of(frame, node, attrs.body)
    body_names = dict(zip(attrs.body.args, f.body_in, strict=True))
    hosts = sorted(_participants(walk, f.carry, [(attrs.body, body_names, f"{frame}.b.")], guard))
    parallel = 1 if walk.spans_hosts(attrs.body) or attrs.trips is not None else attrs.parallel_iterations
    (trips,) = walk.graph(attrs.cond, dict(zip(attrs.cond.args, f.carry, strict=True)), f"{frame}.c.", guard)
    f.counted(walk, hosts, parallel, guard, _broadcast(walk, trips, hosts, frame, guard), attrs.body,
              lambda inputs, outputs: Exit(frame, inputs, outputs, attrs.trips, attrs.trips_depth))


def lower_repeat(walk: Lowering, node: Node, attrs: RepeatAttrs, frame: str, guard: str | None) -> None:
    """A `REPEAT` as a frame whose predicate each host counts itself (`Count`): its trip
    count popped from the stack its `WHILE` saved it on, before it is entered; no predicate
    is computed or sent. Each participant must have taken part in that `WHILE` (it pushed the
    count there); one that did not fails its pop, typed."""
    f = _Frame.of(frame, node, attrs.body)
    body_names = dict(zip(attrs.body.args, f.body_in, strict=True))
    hosts = sorted(_participants(walk, f.carry, [(attrs.body, body_names, f"{frame}.b.")], guard))
    trips = f"%{frame}.t"
    for h in hosts:
        walk.emit((h,), Pop(trips, attrs.trips, attrs.depth), guard)
    f.counted(walk, hosts, 1, guard, dict.fromkeys(hosts, trips), attrs.body,
              lambda inputs, outputs: Exit(frame, inputs, outputs))


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
