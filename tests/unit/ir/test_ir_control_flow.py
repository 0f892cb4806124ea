"""Lowering `while` and `cond` to the per-host control-flow primitives (no Ray, no devices)."""

import pytest
from ir_placed import on

from ir import (
    Aval,
    InvalidArgument,
    Placement,
    ProgramBuilder,
    from_wire,
    parse_program,
    print_program,
    to_wire,
)
from ir.ops import WhileAttrs
from ir.passes import host_plans, lower
from ir.plan import Compute, Count, Enter, Exit, Merge, NextIteration, Recv, Send, Switch

pytestmark = pytest.mark.unit

F32, I32, BOOL = Aval((4,), "float32"), Aval((), "int32"), Aval((), "bool")
PLACES = {"sa": on("a", "a0", 0, 1), "sb": on("b", "b0", 0, 1)}


def two_island_loop(parallel: int = 1, counted: bool = False):
    """while n < k: x = back(g(move(f(x)))), n = inc(n); f on island a, g on island b; k invariant.
    `counted`: the cond gives k - n once, as `fori_loop`'s does."""
    b = ProgramBuilder()
    sa, sb = b.slice("sa", {"x": 2}, island="a"), b.slice("sb", {"y": 2}, island="b")
    x, n, k = b.arg(F32, ("x",), sa), b.arg(I32, (), sa), b.arg(I32, (), sa)
    cond = b.sub()
    _, cn, ck = cond.arg(F32, ("x",), sa), cond.arg(I32, (), sa), cond.arg(I32, (), sa)
    if counted:
        cond.result(*cond.compute("trips", b"trips", sa, [cn, ck], [(I32, ())]))
    else:
        cond.result(*cond.compute("lt", b"lt", sa, [cn, ck], [(BOOL, ())]))
    body = b.sub()
    bx, bn, bk = body.arg(F32, ("x",), sa), body.arg(I32, (), sa), body.arg(I32, (), sa)
    (f,) = body.compute("f", b"f", sa, [bx], [(F32, ("x",))])
    (g,) = body.compute("g", b"g", sb, [body.transfer(f, ("y",), sb)], [(F32, ("y",))])
    (n2,) = body.compute("inc", b"inc", sa, [bn], [(I32, ())])
    body.result(body.transfer(g, ("x",), sa), n2, bk)
    out = b.while_([x, n, k], cond.graph(), body.graph(), parallel, counted=counted)
    b.result(out[0])
    return b.build()


def test_a_loop_over_two_islands_lowers_to_the_five_primitives_on_each_host():
    plans = host_plans(lower(two_island_loop(), PLACES, check=True))
    assert set(plans) == {"a0", "b0"}
    a, b = plans["a0"], plans["b0"]
    kinds = [type(s) for s in a.steps]
    assert kinds.count(Enter) == kinds.count(Merge) == kinds.count(Switch) == 1
    assert kinds.count(NextIteration) == kinds.count(Exit) == 1
    enter = next(s for s in a.steps if isinstance(s, Enter))
    merge = next(s for s in a.steps if isinstance(s, Merge))
    assert len(enter.inputs) == 3 and len(merge.outputs) == 2  # k is invariant: entered, never merged
    # a0 computes the predicate and sends it to b0 every iteration; b0 switches on what it receives.
    (pred_send,) = [s for s in a.steps if isinstance(s, Send) and s.tag.startswith("p.")]
    assert pred_send.to == ("b0",)
    (pred_recv,) = [s for s in b.steps if isinstance(s, Recv) and s.tag == pred_send.tag]
    switch_b = next(s for s in b.steps if isinstance(s, Switch))
    assert switch_b.pred == pred_recv.output and switch_b.inputs == ()
    # only control steps read it: it stays in host memory, while a body value is placed
    others = [s for s in b.steps if isinstance(s, Recv) and s is not pred_recv]
    assert pred_recv.on_host and others and not any(s.on_host for s in others)
    # b0's body steps run under the body's pivot: dead once the loop is over.
    body = [i for i, s in enumerate(b.steps) if b.guard(i) == switch_b.pivots[1]]
    assert [type(b.steps[i]).__name__ for i in body] == ["Recv", "Compute", "Send"]
    text = "\n".join(b.text())
    assert "next_iteration" in text and "switch" in text and "enter" in text and "exit" in text
    # every host's steps are a subsequence of one order
    for plan in plans.values():
        assert list(plan.order) == sorted(plan.order)


def test_a_counted_loop_computes_its_trip_count_once_and_each_host_counts_its_iterations():
    program = two_island_loop(counted=True)
    assert from_wire(to_wire(program)) == program
    assert " counted" in print_program(program)
    assert parse_program(print_program(program)).graph == program.graph
    plans = host_plans(lower(program, PLACES, check=True))
    a, b = plans["a0"], plans["b0"]
    for plan in (a, b):
        (enter,) = [s for s in plan.steps if isinstance(s, Enter)]
        (count,) = [s for s in plan.steps if isinstance(s, Count)]
        (switch,) = [s for s in plan.steps if isinstance(s, Switch)]
        assert count.trips == enter.outputs[-1] and switch.pred == count.output  # entered, counted here
        assert plan.steps.index(enter) < plan.steps.index(count) < plan.steps.index(switch)
    # a0 computes the count before the loop and sends it to b0 once, outside the frame
    (trips,) = [s for s in a.steps if isinstance(s, Compute) and s.label.startswith("trips")]
    (sent,) = [s for s in a.steps if isinstance(s, Send) and s.tag.startswith("p.")]
    (got,) = [s for s in b.steps if isinstance(s, Recv) and s.tag == sent.tag]
    assert a.steps.index(trips) < a.steps.index(sent) < a.steps.index(next(s for s in a.steps
                                                                             if isinstance(s, Enter)))
    assert got.on_host and next(s for s in b.steps if isinstance(s, Enter)).inputs[-1] == got.output
    assert a.guard(a.steps.index(trips)) is None  # not under the loop's body


def test_a_counted_loop_s_cond_must_give_an_integer_scalar():
    with pytest.raises(InvalidArgument, match="counted while cond results: expected one integer scalar"):
        b = ProgramBuilder()
        s = b.slice("s", {"x": 1})
        n = b.arg(I32, (), s)
        cond = b.sub()
        cond.result(*cond.compute("pos", b"pos", s, [cond.arg(I32, (), s)], [(BOOL, ())]))
        body = b.sub()
        body.result(*body.compute("dec", b"dec", s, [body.arg(I32, (), s)], [(I32, ())]))
        b.result(*b.while_([n], cond.graph(), body.graph(), counted=True))
        b.build()


def test_a_three_way_cond_after_a_loop(control_flow):
    plans = host_plans(lower(control_flow, {"s1": on("b", "b0", 0, 1, 2, 3)}, check=True))
    (plan,) = plans.values()
    switches = [s for s in plan.steps if isinstance(s, Switch)]
    assert [len(s.outputs) for s in switches] == [2, 3]
    merge = [s for s in plan.steps if isinstance(s, Merge) and s.frame is None]
    assert len(merge) == 1 and len(merge[0].inputs[0]) == 3
    assert len(plan.compiles) == 5  # keep_going, step and the three branches, once each


def test_nested_loops_name_their_frames_apart():
    b = ProgramBuilder()
    s = b.slice("s", {"x": 1})
    n = b.arg(I32, (), s)

    def loop(builder, value):
        cond = builder.sub()
        cond.result(*cond.compute("pos", b"pos", s, [cond.arg(I32, (), s)], [(BOOL, ())]))
        return cond

    inner_cond = loop(b, n)
    inner_body = b.sub()
    inner_body.result(*inner_body.compute("dec", b"dec", s, [inner_body.arg(I32, (), s)], [(I32, ())]))
    outer_body = b.sub()
    (m,) = outer_body.while_([outer_body.arg(I32, (), s)], inner_cond.graph(), inner_body.graph())
    outer_body.result(*outer_body.compute("dec", b"dec", s, [m], [(I32, ())]))
    (out,) = b.while_([n], loop(b, n).graph(), outer_body.graph())
    b.result(out)
    (plan,) = host_plans(lower(b.build(), {"s": on("a", "a0", 0)}, check=True)).values()
    frames = [s.frame for s in plan.steps if isinstance(s, Enter)]
    assert len(frames) == 2 and len(set(frames)) == 2 and frames[1].startswith(frames[0] + ".")


def test_parallel_iterations_travels_in_wire_and_text_and_reaches_every_hosts_enter():
    program = two_island_loop(parallel=4)
    assert from_wire(to_wire(program)) == program
    assert "parallel_iterations 4" in print_program(program)
    assert parse_program(print_program(program)).graph == program.graph  # (artifacts: by hash)
    assert "parallel_iterations" not in str(to_wire(two_island_loop()))  # 1: as documents had it
    plans = host_plans(lower(program, PLACES, check=True))
    assert {h: [s.parallel for s in p.steps if isinstance(s, Enter)] for h, p in plans.items()} == \
        {"a0": [4], "b0": [4]}
    # A computation on a slice spanning two hosts: its hosts enter collectives in one order,
    # so the loop runs one iteration at a time, whatever it asked.
    spread = {"sa": Placement("a", (("a0", 0), ("a1", 0))), "sb": PLACES["sb"]}
    plans = host_plans(lower(program, spread, check=True), {"a0": 0, "a1": 1})
    assert {s.parallel for p in plans.values() for s in p.steps if isinstance(s, Enter)} == {1}


@pytest.mark.parametrize("bad", [0, 65, True, 2.0])
def test_a_bad_parallel_iterations_is_refused_naming_it(bad):
    loop = two_island_loop().nodes[3].attrs
    with pytest.raises(InvalidArgument, match="parallel_iterations"):
        WhileAttrs(loop.cond, loop.body, bad)
