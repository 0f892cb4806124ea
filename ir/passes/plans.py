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
- `RESULT` position k: `(k, value)` in `results` of each host of that value's slice (a
  value may be an argument, and may appear at several positions).

Anything else (a routed transfer between hosts, `WHILE`, `COND`) is an `InvalidArgument`
naming the node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from ir.errors import InvalidArgument
from ir.node import Node, Op, Type
from ir.ops import ArgAttrs, ComputeAttrs, RecvAttrs, SendAttrs, TransferAttrs
from ir.plan import CompileJob, Compute, DeviceMesh, HostPlan, Recv, Reshard, Send, Step, executable_key
from ir.program import Placement, Program, SliceDef
from ir.text import node_line
from ir.types import MeshAxes
from ir.verify import value_types


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

    types: Mapping[str, Type]
    slices: Mapping[str, SliceDef]
    ranks: Mapping[str, int]

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


_STEPS: dict[Op, Callable[[Node, _Where], Planned]] = {
    Op.COMPUTE: _compute,
    Op.TRANSFER: _reshard,
    Op.SEND: _send,
    Op.RECV: _recv,
}


@dataclass
class _Draft:
    """One host's plan while the walk fills it in (local to `host_plans`)."""

    args: list[tuple[int, str]] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    order: list[int] = field(default_factory=list)
    results: list[tuple[int, str]] = field(default_factory=list)
    compiles: dict[str, CompileJob] = field(default_factory=dict)


def host_plans(lowered: Program, ranks: Mapping[str, int] | None = None) -> dict[str, HostPlan]:
    where = _Where(value_types(lowered), lowered.slice_table, ranks or {})
    drafts: dict[str, _Draft] = {}
    args = [n for n in lowered.nodes if n.op is Op.ARG]
    for k, node in enumerate(args):
        assert isinstance(node.attrs, ArgAttrs)
        for host in where.hosts(node.attrs.type.slice):
            drafts.setdefault(host, _Draft()).args.append((k, node.outputs[0]))
    for position, node in enumerate(n for n in lowered.nodes[:-1] if n.op is not Op.ARG):
        if node.op not in _STEPS:
            raise InvalidArgument(
                f"host_plans: `{node_line(node)}`: expected one of {', '.join(o.value for o in _STEPS)}, "
                f"found {node.op.value} (lower the program first)"
            )
        hosts, step, job = _STEPS[node.op](node, where)
        for host in hosts:
            draft = drafts.setdefault(host, _Draft())
            draft.steps.append(step)
            draft.order.append(position)
            if job is not None:
                draft.compiles.setdefault(job.key, job)
    for k, value in enumerate(lowered.results):
        for host in where.hosts(where.types[value].slice):
            drafts.setdefault(host, _Draft()).results.append((k, value))
    return {
        host: HostPlan(host, tuple(d.args), tuple(d.steps), tuple(d.order), tuple(d.results),
                       tuple(d.compiles.values()))
        for host, d in sorted(drafts.items())
    }
