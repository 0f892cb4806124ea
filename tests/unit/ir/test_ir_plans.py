"""Host plans: what each host runs, checked field by field, and played out by `run_plans`."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_chains import build_chain, chain_placements, chains
from ir_placed import (
    EXAMPLE_PLACEMENTS,
    INTRA_PLACEMENTS,
    RING_HOSTS,
    RING_PLACEMENTS,
    build_intra_island,
    build_ring,
    on,
    run_plans,
)

from ir import (
    Aval,
    CompileJob,
    Compute,
    DeviceMesh,
    HostPlan,
    InvalidArgument,
    Placement,
    ProgramBuilder,
    Recv,
    Reshard,
    Send,
    Spec,
    content_hash,
    executable_key,
)
from ir.passes import host_plans, lower, place, route_transfers

pytestmark = pytest.mark.unit

LAYER, NORM, HEAD = (content_hash(name) for name in (b"layer", b"norm", b"head"))


def test_example_plans_field_by_field(example):
    plans = host_plans(lower(example, EXAMPLE_PLACEMENTS, check=True))
    assert list(plans) == ["a0", "b0"]
    s0_axes, s1_axes = (("data", 2), ("model", 2)), (("x", 4),)
    s0, s1 = DeviceMesh((0, 1, 2, 3), s0_axes), DeviceMesh((0, 1, 2, 3), s1_axes)
    layer, norm, head = executable_key(LAYER, s0), executable_key(NORM, s0), executable_key(HEAD, s1)
    assert layer == LAYER[7:31] + "@0,1,2,3/data=2,model=2"
    data, model, x = Spec(("data", None)), Spec((None, "model")), Spec(("x", None))
    assert plans["a0"] == HostPlan(
        host="a0",
        args=((0, "%0"), (1, "%1")),
        steps=(Compute(layer, ("%1", "%0"), ("%2",), "layer"),
               Compute(norm, ("%2",), ("%3",), "norm"),
               Send("%3", ("b0",), "t0")),
        order=(0, 1, 2),
        results=(),
        compiles=(CompileJob(layer, LAYER, s0, (data, model), (data,)),
                  CompileJob(norm, NORM, s0, (data,), (data,))),
        held=1024,  # %2 and %3 at once: f32[4,16] split over data=2, on the slice's 4 devices
    )
    assert plans["b0"] == HostPlan(
        host="b0",
        args=(),
        steps=(Recv("%4", ("a0",), "t0", s1, x),
               Compute(head, ("%4",), ("%5",), "head")),
        order=(3, 4),
        results=((0, "%5"),),
        compiles=(CompileJob(head, HEAD, s1, (x,), (x,)),),
        held=256,  # the received f32[4,16]; %5 is the program's result
    )
    assert run_plans(plans) == [0, 1, 2, 3, 4]


def test_intra_island_plans_reshard_locally_and_send_between_hosts():
    plans = host_plans(lower(build_intra_island(), INTRA_PLACEMENTS, check=True))
    a0, a1 = plans["a0"], plans["a1"]
    assert [type(s).__name__ for s in a0.steps] == ["Compute", "Reshard", "Compute", "Send", "Compute"]
    assert a0.steps[1] == Reshard("%1", "%3", DeviceMesh((2, 3), (("x", 2),)), Spec(()))
    assert a0.steps[3] == Send("%4", ("a1",), "t0")
    assert [s.label for s in a0.steps if isinstance(s, Compute)] == ["f", "h", "g"]
    assert {c.mesh.devices for c in a0.compiles} == {(0, 1), (2, 3)}  # f, g on s0; h on s1
    assert a0.order == (0, 1, 2, 3, 5) and a1.order == (4, 6)
    assert a1.steps[0] == Recv("%5", ("a0",), "t0", DeviceMesh((0, 1), (("y", 2),)), Spec(("y",)))
    assert (a0.args, a0.results, a1.args, a1.results) == (((0, "%0"),), ((1, "%2"),), (), ((0, "%6"),))
    run_plans(plans)


@pytest.mark.parametrize("stages", [16])
def test_ring_gives_each_host_its_stages_in_global_order(stages):
    program = build_ring(stages)
    routes = [n.attrs.route for n in route_transfers(place(program, RING_PLACEMENTS)).nodes
              if n.op.value == "transfer"]
    assert routes == ["island", "dcn"] * ((stages - 1) // 2) + ["island"] * ((stages - 1) % 2)
    plans = host_plans(lower(program, RING_PLACEMENTS, check=True))
    assert list(plans) == sorted(RING_HOSTS)
    # stage j runs on RING_HOSTS[j % 4]: its recv at 3j-1, its compute at 3j, its send at 3j+1
    for k, host in enumerate(RING_HOSTS):
        plan, expected, order = plans[host], [], []
        for j in range(k, stages, 4):
            tag_in, tag_out = f"t{j - 1}", f"t{j}"
            if j:
                mesh, spec = DeviceMesh((0, 1), (("x", 2),)), Spec(("x", None))
                expected.append(Recv(f"%{2 * j}", (RING_HOSTS[(j - 1) % 4],), tag_in, mesh, spec))
                order.append(3 * j - 1)
            expected.append(Compute(plan.compiles[0].key, (f"%{2 * j}",), (f"%{2 * j + 1}",), f"stage{j}"))
            order.append(3 * j)
            if j < stages - 1:
                expected.append(Send(f"%{2 * j + 1}", (RING_HOSTS[(j + 1) % 4],), tag_out))
                order.append(3 * j + 1)
        assert plan.steps == tuple(expected), host
        assert plan.order == tuple(order), host
        assert len(plan.compiles) == 1  # four stages share one artifact, one executable per host
    assert plans["a0"].args == ((0, "%0"),) and plans["b1"].results == ((0, f"%{2 * stages - 1}"),)
    assert run_plans(plans) == list(range(3 * stages - 2))


def test_results_may_be_arguments_and_repeat():
    b = ProgramBuilder()
    s0, s1 = b.slice("s0", {"x": 2}), b.slice("s1", {"y": 1})
    v = Aval((4,), "float32")
    x, z = b.arg(v, ("x",), s0), b.arg(v, (), s1)
    (y,) = b.compute("f", b"f", s0, [x], [(v, ("x",))])
    b.result(x, y, z, x)
    plans = host_plans(lower(b.build(), {"s0": on("a", "a0", 0, 1), "s1": on("b", "b0", 0)}, check=True))
    assert plans["a0"].args == ((0, "%0"),) and plans["a0"].results == ((0, "%0"), (1, "%2"), (3, "%0"))
    assert plans["b0"] == HostPlan("b0", ((1, "%1"),), (), (), ((2, "%1"),), ())
    run_plans(plans)


def test_plans_need_a_lowered_program(example):
    with pytest.raises(InvalidArgument) as info:
        host_plans(example)
    assert str(info.value) == (
        "host_plans: slice s0: expected a placement, found none (lower the program first)"
    )
    with pytest.raises(InvalidArgument) as info:
        host_plans(route_transfers(place(example, EXAMPLE_PLACEMENTS)))
    assert str(info.value) == (
        "host_plans: `%4 = transfer %3 -> float32[4,16] P('x', None) @s1 via dcn`: expected a local transfer "
        "(partition turns the others into send and recv), found route dcn"
    )


def test_plan_key_follows_the_content(example):
    plans = host_plans(lower(example, EXAMPLE_PLACEMENTS))
    again = host_plans(lower(example, EXAMPLE_PLACEMENTS))
    assert plans["a0"].key == again["a0"].key != plans["b0"].key
    moved = host_plans(lower(example, EXAMPLE_PLACEMENTS | {"s1": on("b", "b0", 4, 5, 6, 7)}))
    assert moved["b0"].key != plans["b0"].key and moved["a0"].key == plans["a0"].key
    assert dataclasses.replace(plans["a0"], host="a9").key != plans["a0"].key


@settings(max_examples=60, deadline=None)
@given(chains(), st.sampled_from([4, 8]), st.booleans())
def test_random_chains_give_plans_that_run(steps, width, split):
    lowered = lower(build_chain(steps, width), chain_placements(split), check=True)
    plans = host_plans(lowered)
    ran = run_plans(plans)
    assert sorted(ran) == list(range(len(lowered.nodes) - 2))  # all but the one arg and the result


def test_a_slice_over_two_hosts_runs_its_computations_on_both():
    b = ProgramBuilder()
    s = b.slice("s", {"x": 4}, island="a")
    v = Aval((8,), "float32")
    x = b.arg(v, ("x",), s)
    (y,) = b.compute("f", b"f", s, [x], [(v, ("x",))])
    (z,) = b.compute("g", b"g", s, [y], [(v, ())])
    b.result(z, x)
    wide = {"s": Placement("a", (("a0", 0), ("a0", 1), ("a1", 0), ("a1", 1)))}
    lowered = lower(b.build(), wide, check=True)
    with pytest.raises(InvalidArgument, match="spans hosts with no process rank: a0, a1"):
        host_plans(lowered)
    plans = host_plans(lowered, {"a0": 0, "a1": 1})
    assert sorted(plans) == ["a0", "a1"]
    devices = ((0, 0), (0, 1), (1, 0), (1, 1))
    for plan in plans.values():
        assert plan.args == ((0, x),) and plan.results == ((0, z), (1, x))
        assert [s.label for s in plan.steps] == ["f", "g"] and plan.order == (0, 1)
        assert {j.mesh.devices for j in plan.compiles} == {devices}
    assert plans["a0"].steps == plans["a1"].steps  # one SPMD program, the same steps on both
