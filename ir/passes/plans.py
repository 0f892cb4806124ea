"""`host_plans`: the last step of lowering, from one program to what each host runs.

Contract: `host_plans(lowered, ranks)` takes a lowered program (verified, every slice placed,
no logical or non-local transfers left: `ir.passes.lower`'s output) and returns one
`ir.plan.HostPlan` per host that holds any argument, step or result, keyed and ordered by
host name. A slice spanning several hosts (an island's JAX group) puts its arguments,
computations and results on each of them. `device_mesh` is the one rule naming a slice's
devices for its executors: `(rank, local index)` across hosts, `ranks` giving each host's
process index in the group; local indices on one host. Walking the graph, a node's global
position (`HostPlan.order`) counts the nodes that are neither `ARG` nor `RESULT`, in graph order. Per op:

- `ARG` k (the k-th arg node): `(k, value)` in `args` of each host of its slice;
- `COMPUTE`: `Compute(executable_key(artifact, device mesh of its slice), inputs,
  outputs, label=name)` on each of its slice's hosts, and one `CompileJob` per distinct key
  per host, in order of first use, with the computation's declared in/out specs;
- a `local` `TRANSFER`: `Reshard(input, output, device mesh, spec)` of its target type;
- `SEND`: `Send(input, to, tag)` on each host of its operand's slice (each sends its shards);
- `RECV`: `Recv(output, sources, tag, device mesh, spec)` on each host of its type's slice
  (each takes the shards of every source host and places its part);
- `PUSH`/`POP`: `Push(input, stack, depth)` / `Pop(output, stack, depth)` on each host of
  the stack's slice (each saves and takes back its own shards);
- `RESULT` position k: `(k, value)` in `results` of each host of that value's slice (a
  value may be an argument, and may appear at several positions).

- `WHILE` and `COND`: the control-flow primitives on every participating host
  (`ir.passes.control_flow`); the values of a sub-graph are renamed `%<frame>.<name>`, and
  `HostPlan.guards` names, per step inside a branch or loop body, the pivot it runs under.

Anything else (a routed transfer between hosts) is an `InvalidArgument` naming the node.
Each plan's `held` is `ir.passes.footprint.held_bytes` of it: the most bytes of its own
values a run holds on that host at once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from functools import partial

from ir import plan
from ir.errors import InvalidArgument
from ir.node import Graph, Node, Op, Type
from ir.ops import ArgAttrs, ComputeAttrs, CondAttrs, RecvAttrs, SendAttrs, TransferAttrs, WhileAttrs
from ir.passes.control_flow import lower_cond, lower_repeat, lower_while
from ir.passes.footprint import held_bytes, per_device
from ir.plan import CompileJob, Compute, DeviceMesh, HostPlan, Recv, Reshard, Send, Step, executable_key
from ir.program import Placement, Program, SliceDef
from ir.stack_ops import RepeatAttrs, StackAttrs
from ir.text import node_line
from ir.types import MeshAxes
from ir.verify import graph_types


def device_mesh(placement: Placement, mesh: MeshAxes, ranks: Mapping[str, int],
                what: str = "slice") -> DeviceMesh:
    """A placed slice's devices as its hosts' executors name them (the module contract)."""
    hosts = placement.hosts
    if len(hosts) == 1:
        return DeviceMesh(placement.local(hosts[0]), mesh.axes)
    missing = [h for h in hosts if h not in ranks]
    if missing:
        raise InvalidArgument(f"{what} spans hosts with no process rank: {', '.join(missing)} "
                              "(its island must be one JAX group)")
    return DeviceMesh(tuple((ranks[h], i) for h, i in placement.devices), mesh.axes)


@dataclass(frozen=True)
class _Where:
    """Where values live: their types, and the placed slices those name."""

    types: dict[str, Type]
    slices: Mapping[str, SliceDef]
    ranks: Mapping[str, int]
    artifacts: frozenset[str] = frozenset()

    def hosts(self, slice_name: str) -> tuple[str, ...]:
        placement = self.slices[slice_name].placement
        if placement is None:
            raise InvalidArgument(f"host_plans: slice {slice_name}: expected a placement, found none "
                                  "(lower the program first)")
        return placement.hosts

    def host(self, slice_name: str) -> str:
        hosts = self.hosts(slice_name)
        if len(hosts) != 1:
            raise InvalidArgument(f"host_plans: slice {slice_name}: expected a placement on one host, "
                                  f"found {', '.join(hosts)}")
        return hosts[0]

    def whole(self, value: str) -> int:
        """Bytes of the whole array a value is (0 for the lowering's own predicates)."""
        t = self.types.get(value)
        return 0 if t is None else t.aval.nbytes

    def placed(self, value: str, host: str) -> int:
        """Bytes of a value on `host`: a device's shard times the slice's devices there."""
        t = self.types.get(value)
        if t is None:
            return 0
        s = self.slices[t.slice]
        sizes = dict(s.mesh.axes)
        local = len(s.placement.local(host)) if s.placement is not None else 1
        return per_device(t.aval.nbytes, math.prod(sizes[a] for a in t.spec.axis_names())) * local

    def mesh(self, slice_name: str) -> DeviceMesh:
        """The slice's device mesh, as its hosts' executors name it."""
        s = self.slices[slice_name]
        self.hosts(slice_name)  # placed
        assert s.placement is not None
        return device_mesh(s.placement, s.mesh, self.ranks, f"host_plans: slice {slice_name}")


Planned = tuple[tuple[str, ...], Step, CompileJob | None]  # the hosts that run one step


def _compute(node: Node, where: _Where) -> Planned:
    a = node.attrs
    assert isinstance(a, ComputeAttrs)
    mesh = where.mesh(a.slice)
    key = executable_key(a.artifact, mesh)
    specs = tuple(s.spec for s in a.ins), tuple(s.spec for s in a.outs)
    job = CompileJob(key, a.artifact, mesh, *specs)
    return where.hosts(a.slice), Compute(key, node.inputs, node.outputs, a.name), job


def _reshard(node: Node, where: _Where) -> Planned:
    a = node.attrs
    assert isinstance(a, TransferAttrs)
    if a.route != "local":
        raise InvalidArgument(
            f"host_plans: `{node_line(node)}`: expected a local transfer (partition turns the others "
            f"into send and recv), found route {a.route}"
        )
    host = where.host(a.type.slice)
    return (host,), Reshard(node.inputs[0], node.outputs[0], where.mesh(a.type.slice), a.type.spec), None


def _send(node: Node, where: _Where) -> Planned:
    a = node.attrs
    assert isinstance(a, SendAttrs)
    return where.hosts(where.types[node.inputs[0]].slice), Send(node.inputs[0], a.to, a.tag), None


def _recv(node: Node, where: _Where) -> Planned:
    a = node.attrs
    assert isinstance(a, RecvAttrs)
    return where.hosts(a.type.slice), Recv(node.outputs[0], a.sources, a.tag, where.mesh(a.type.slice),
                                           a.type.spec), None


def _push(node: Node, where: _Where) -> Planned:
    a = node.attrs
    assert isinstance(a, StackAttrs)
    return where.hosts(a.type.slice), plan.Push(node.inputs[0], a.stack, a.depth, a.swap), None


def _pop(node: Node, where: _Where) -> Planned:
    a = node.attrs
    assert isinstance(a, StackAttrs)
    return where.hosts(a.type.slice), plan.Pop(node.outputs[0], a.stack, a.depth), None


_STEPS: dict[Op, Callable[[Node, _Where], Planned]] = {
    Op.COMPUTE: _compute,
    Op.TRANSFER: _reshard,
    Op.SEND: _send,
    Op.RECV: _recv,
    Op.PUSH: _push,
    Op.POP: _pop,
}


@dataclass
class _Draft:
    """One host's plan while the walk fills it in (local to `host_plans`)."""

    args: list[tuple[int, str]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    guards: list[str | None] = field(default_factory=list)
    results: list[tuple[int, str]] = field(default_factory=list)
    compiles: dict[str, CompileJob] = field(default_factory=dict)


@dataclass
class _Walk:
    """The walk over the program and its sub-graphs (the `control_flow.Lowering` it needs)."""

    where: _Where
    drafts: dict[str, _Draft] = field(default_factory=dict)
    position: int = 0
    recording: set[str] | None = None  # during `hosts_of`: the hosts steps would go to, no steps

    def emit(self, hosts: tuple[str, ...] | list[str], step: Step, guard: str | None,
             job: CompileJob | None = None) -> None:
        if self.recording is not None:
            self.recording.update(hosts)
            return
        for host in hosts:
            draft = self.drafts.setdefault(host, _Draft())
            draft.steps.append(step)
            draft.order.append(self.position)
            draft.guards.append(guard)
            if job is not None:
                draft.compiles.setdefault(job.key, job)
        self.position += 1

    def hosts(self, value: str) -> tuple[str, ...]:
        return self.where.hosts(self.where.types[value].slice)

    def mesh_of_host(self, host: str) -> DeviceMesh:
        """Where a host places a predicate it receives: its first device."""
        return DeviceMesh((0,), ())

    def hosts_of(self, graphs: list[tuple[Graph, dict[str, str], str]], guard: str | None) -> set[str]:
        outer, position = self.recording, self.position
        self.recording = set()
        try:
            for graph, names, prefix in graphs:
                self.graph(graph, names, prefix, guard)
            return self.recording
        finally:
            self.recording, self.position = outer, position

    def spans_hosts(self, graph: Graph) -> bool:
        for node in graph.nodes:
            a = node.attrs
            if isinstance(a, ComputeAttrs) and len(self.where.hosts(a.slice)) > 1:
                return True
            if isinstance(a, WhileAttrs) and (self.spans_hosts(a.cond) or self.spans_hosts(a.body)):
                return True
            if isinstance(a, RepeatAttrs) and self.spans_hosts(a.body):
                return True
            if isinstance(a, CondAttrs) and any(self.spans_hosts(b) for b in a.branches):
                return True
        return False

    def graph(self, graph: Graph, names: dict[str, str], prefix: str, guard: str | None) -> list[str]:
        """Emit the steps of `graph` (a sub-graph: `names` maps its args, its values get `prefix`);
        returns the env names of its results."""
        types = graph_types(graph, self.where.slices, self.where.artifacts)
        rename = lambda v: names.get(v) or ("%" + prefix + v[1:] if prefix else v)  # noqa: E731
        for value, t in types.items():
            self.where.types[rename(value)] = t
        for node in graph.nodes[:-1]:
            if node.op is Op.ARG:
                continue
            named = replace(node, inputs=tuple(map(rename, node.inputs)),
                            outputs=tuple(map(rename, node.outputs)))
            if isinstance(node.attrs, WhileAttrs):  # (a node's attributes are its op's)
                lower_while(self, named, node.attrs, f"{prefix}w{self.position}", guard)
            elif isinstance(node.attrs, RepeatAttrs):
                lower_repeat(self, named, node.attrs, f"{prefix}r{self.position}", guard)
            elif isinstance(node.attrs, CondAttrs):
                lower_cond(self, named, node.attrs, f"{prefix}c{self.position}", guard)
            elif node.op in _STEPS:
                hosts, step, job = _STEPS[node.op](named, self.where)
                self.emit(hosts, step, guard, job)
            else:
                raise InvalidArgument(
                    f"host_plans: `{node_line(node)}`: expected one of "
                    f"{', '.join(o.value for o in (*_STEPS, Op.WHILE, Op.REPEAT, Op.COND))}, "
                    f"found {node.op.value} (lower the program first)"
                )
        return [rename(v) for v in graph.results]


def host_plans(lowered: Program, ranks: Mapping[str, int] | None = None) -> dict[str, HostPlan]:
    where = _Where({}, lowered.slice_table, ranks or {}, frozenset(lowered.artifact_table))
    walk = _Walk(where)
    args = [n for n in lowered.nodes if n.op is Op.ARG]
    for k, node in enumerate(args):
        assert isinstance(node.attrs, ArgAttrs)
        for host in where.hosts(node.attrs.type.slice):
            walk.drafts.setdefault(host, _Draft()).args.append((k, node.outputs[0]))
    walk.graph(lowered.graph, {}, "", None)
    for k, value in enumerate(lowered.results):
        for host in where.hosts(where.types[value].slice):
            walk.drafts.setdefault(host, _Draft()).results.append((k, value))
    plans = {
        host: HostPlan(host, tuple(d.args), tuple(d.steps), tuple(d.order), tuple(d.results),
                       tuple(d.compiles.values()),
                       tuple(d.guards) if any(g is not None for g in d.guards) else ())
        for host, d in sorted(walk.drafts.items())
    }
    return {host: replace(plan, held=held_bytes(plan, partial(where.placed, host=host), where.whole))
            for host, plan in plans.items()}
