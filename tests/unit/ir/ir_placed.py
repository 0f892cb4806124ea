"""Placed programs for the lowering tests, and a runner that plays host plans out.

`EXAMPLE_PLACEMENTS` puts `build_example()` on hosts a0 (island a) and b0 (island b);
`build_intra_island()` is a program on one island with a local reshard on host a0 and a
move from a0 to a1; `build_ring(n)` is a chain of n stages alternating over the hosts a0,
a1, b0, b1. `run_plans` runs plans as hosts would and fails on a deadlock or a missing value.
"""

from __future__ import annotations

from collections.abc import Mapping

from ir import Aval, Compute, HostPlan, Placement, Program, ProgramBuilder, Recv, Reshard, Send, Step


def on(island: str, host: str, *indices: int) -> Placement:
    return Placement(island, tuple((host, i) for i in indices))


EXAMPLE_PLACEMENTS = {"s0": on("a", "a0", 0, 1, 2, 3), "s1": on("b", "b0", 0, 1, 2, 3)}
INTRA_PLACEMENTS = {"s0": on("a", "a0", 0, 1), "s1": on("a", "a0", 2, 3), "s2": on("a", "a1", 0, 1)}
RING_HOSTS = ("a0", "a1", "b0", "b1")
RING_PLACEMENTS = {f"r{k}": on(host[0], host, 0, 1) for k, host in enumerate(RING_HOSTS)}


def build_intra_island() -> Program:
    """f and g on s0; f's output resharded onto s1 (same host), h there, moved to s2 (another host)."""
    b = ProgramBuilder()
    s0, s1 = b.slice("s0", {"x": 2}, island="a"), b.slice("s1", {"x": 2}, island="a")
    s2 = b.slice("s2", {"y": 2})
    v = Aval((8,), "float32")
    x = b.arg(v, ("x",), s0)
    (f,) = b.compute("f", b"f", s0, [x], [(v, ("x",))])
    (g,) = b.compute("g", b"g", s0, [x], [(v, ())])
    (h,) = b.compute("h", b"h", s1, [b.transfer(f, (), s1)], [(v, ("x",))])
    (k,) = b.compute("k", b"k", s2, [b.transfer(h, ("y",), s2)], [(v, ("y",))])
    b.result(k, g)
    return b.build()


def build_ring(stages: int) -> Program:
    """stage0 .. stage{n-1}, stage j on slice r{j % 4}, each moving its output to the next slice."""
    b = ProgramBuilder()
    slices = [b.slice(f"r{k}", {"x": 2}) for k in range(len(RING_HOSTS))]
    v = Aval((4, 4), "float32")
    value = b.arg(v, ("x", None), slices[0])
    for j in range(stages):
        if j:
            value = b.transfer(value, ("x", None), slices[j % 4])
        (value,) = b.compute(f"stage{j}", b"stage", slices[j % 4], [value], [(v, ("x", None))])
    b.result(value)
    return b.build()


def _io(step: Step) -> tuple[tuple[str, ...], tuple[str, ...]]:
    match step:
        case Compute(inputs=ins, outputs=outs):
            return ins, outs
        case Reshard(input=value, output=out):
            return (value,), (out,)
        case Send(input=value):
            return (value,), ()
        case Recv(output=out):
            return (), (out,)
    raise AssertionError(f"not a step: {step!r}")


def run_plans(plans: Mapping[str, HostPlan]) -> list[int]:
    """Run each host's steps in order, a recv waiting for its send; the global positions as run.

    Fails on a deadlock, on a step using a value its host does not hold, on a result its host
    does not hold, and unless the plans' positions are each increasing and together 0..n-1.
    """
    positions = sorted(o for p in plans.values() for o in p.order)
    assert positions == list(range(len(positions))), positions
    assert all(list(p.order) == sorted(set(p.order)) for p in plans.values())
    held = {h: {v for _, v in p.args} for h, p in plans.items()}
    sent: set[str] = set()
    at, ran, progress = dict.fromkeys(plans, 0), [], True
    while progress:
        progress = False
        for host, plan in plans.items():
            while at[host] < len(plan.steps):
                step = plan.steps[at[host]]
                if isinstance(step, Recv) and step.tag not in sent:
                    break
                needs, makes = _io(step)
                assert set(needs) <= held[host], f"{host}: {step} needs {set(needs) - held[host]}"
                sent |= {step.tag} if isinstance(step, Send) else set()
                held[host] |= set(makes)
                ran.append(plan.order[at[host]])
                at[host], progress = at[host] + 1, True
    stuck = {h: plans[h].steps[i] for h, i in at.items() if i < len(plans[h].steps)}
    assert not stuck, f"deadlock: {stuck}"
    for host, plan in plans.items():
        assert {v for _, v in plan.results} <= held[host], f"{host} lacks results of {plan.results}"
    return ran
