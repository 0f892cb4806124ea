"""`while_loop`, `cond` and `fori_loop` traced without a server: closed sub-graphs, checked
carries, invariants captured once, results moved to one type."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P
from test_trace import make_slice, trace

import client as isthmus
from client.arrays import PLAIN
from client.jit import Function
from ir import InvalidArgument, Op, verify
from ir.passes import host_plans, lower
from ir.plan import Enter, Merge, Recv

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

SA, SB = make_slice("sa", {"x": 2}, "a"), make_slice("sb", {"y": 2}, "b")
F = Function(None, lambda x: x * 2, SA, in_specs=P("x"), out_specs=P("x"))
G = Function(None, lambda x: x + 1, SB, in_specs=P("y"), out_specs=P("y"))
SMALL = Function(None, lambda x: x.sum() < 100, SA)
ADD = Function(None, lambda x, w: x + w, SA, in_specs=P("x"), out_specs=P("x"))
X = (np.ones(4, np.float32), PLAIN)


def ops(graph):
    return [n.op for n in graph.nodes]


def test_a_while_whose_body_spans_islands_is_one_node_with_closed_sub_graphs():
    program, _ = trace(lambda x: isthmus.while_loop(SMALL, lambda v: G(F(v)), F(x)), X)
    verify(program)
    (loop,) = [n for n in program.nodes if n.op is Op.WHILE]
    body = loop.attrs.body
    # the body's result comes back to the carry's slice and spec
    assert ops(body).count(Op.TRANSFER) == 2 and body.nodes[-2].op is Op.TRANSFER


def test_a_carry_that_changes_its_aval_names_the_leaf_and_both_avals():
    shrink = Function(None, lambda x: x[:2], SA, in_specs=P(), out_specs=P())
    with pytest.raises(InvalidArgument, match=r"carry leaf \[1\]\['w'\]: body_fun returns float32\[2\], "
                                              r"the carry \(init_val\) is float32\[4\]"):
        trace(lambda x: isthmus.while_loop(lambda c: SMALL(c[0]), lambda c: (c[0], {"w": shrink(c[1]["w"])}),
                                           (F(x), {"w": F(x)})), X)


def test_a_fori_loop_carry_is_named_as_the_user_wrote_it():
    shrink = Function(None, lambda x: x[:2], SA, in_specs=P(), out_specs=P())
    with pytest.raises(InvalidArgument, match=r"fori_loop: carry leaf \['w'\]: body_fun returns f"):
        trace(lambda x: isthmus.fori_loop(0, 3, lambda i, c: {"w": shrink(c["w"])}, {"w": F(x)}), X)
    with pytest.raises(InvalidArgument, match=r"fori_loop: carry leaf \(the whole carry\)"):
        trace(lambda x: isthmus.fori_loop(0, 3, lambda i, c: shrink(c), F(x)), X)
    with pytest.raises(InvalidArgument, match=r"fori_loop: body_fun must return the carry's structure "
                                              r"PyTreeDef\(\*\); it returned PyTreeDef\(\(\*, \*\)\)"):
        trace(lambda x: isthmus.fori_loop(0, 3, lambda i, c: (c, c), F(x)), X)
    with pytest.raises(InvalidArgument, match="must return the carry's structure"):  # (a carry on no slice)
        trace(lambda x: isthmus.fori_loop(0, 3, lambda i, c: (c, c), x), X)


def test_the_structure_and_the_predicate_are_checked():
    with pytest.raises(InvalidArgument, match="must return the carry's structure"):
        trace(lambda x: isthmus.while_loop(SMALL, lambda v: (v, v), F(x)), X)
    with pytest.raises(InvalidArgument, match="one bool"):
        trace(lambda x: isthmus.while_loop(lambda v: F(v), F, F(x)), X)
    with pytest.raises(InvalidArgument, match="inside a @c"):
        isthmus.while_loop(SMALL, F, np.ones(4, np.float32))
    for flag in ("swap", "remat"):
        with pytest.raises(InvalidArgument, match=f"while_loop: {flag} must be True or False, found 'yes'"):
            trace(lambda x, flag=flag: isthmus.while_loop(SMALL, F, F(x), **{flag: "yes"}), X)
        with pytest.raises(InvalidArgument, match=f"fori_loop: {flag} must be True or False, found 1"):
            trace(lambda x, flag=flag: isthmus.fori_loop(0, 3, lambda i, v: F(v), F(x), **{flag: 1}), X)


def test_an_integer_fori_loop_is_counted_and_a_float_one_tests_each_iteration():
    program, _ = trace(lambda x: isthmus.fori_loop(0, 3, lambda i, v: F(v), F(x), remat=True), X)
    (loop,) = [n for n in program.nodes if n.op is Op.WHILE]
    assert loop.attrs.counted and loop.attrs.remat
    assert loop.attrs.cond.nodes[-2].attrs.name == "fori_trips_3"
    # the counter's increment is left out where the body does not read it, kept where it does
    (body,) = [n.attrs.body for n in program.nodes if n.op is Op.WHILE]
    assert body.results[0] == body.args[0] and "fori_next" not in str(body)
    plus_i = Function(None, lambda x, i: x + i, SA, in_specs=(P("x"), P()), out_specs=P("x"))
    program, _ = trace(lambda x: isthmus.fori_loop(0, 3, lambda i, v: plus_i(v, i), F(x)), X)
    (body,) = [n.attrs.body for n in program.nodes if n.op is Op.WHILE]
    assert body.results[0] != body.args[0] and "fori_next" in str(body)
    half = np.float32(2.5)
    program, _ = trace(lambda x: isthmus.fori_loop(np.float32(0), half, lambda i, v: F(v), F(x)), X)
    (loop,) = [n for n in program.nodes if n.op is Op.WHILE]
    assert not loop.attrs.counted and not loop.attrs.remat


def test_a_captured_value_is_an_invariant_entered_once_and_moved_before_the_loop():
    def program(x, w):
        wb = G(w)  # on island b; the body wants it on island a: one transfer, before the loop
        return isthmus.while_loop(SMALL, lambda v: ADD(v, wb), F(x))

    lowered_in, _ = trace(program, X, X)
    loop = next(n for n in lowered_in.nodes if n.op is Op.WHILE)
    assert len(loop.inputs) == 2 and loop.attrs.body.results[1] == loop.attrs.body.args[1]
    assert Op.TRANSFER not in ops(loop.attrs.body)
    placements = {"sa": _on("a", "a0"), "sb": _on("b", "b0")}
    plans = host_plans(lower(lowered_in, placements, check=True))
    enter = next(s for s in plans["a0"].steps if isinstance(s, Enter))
    merge = next(s for s in plans["a0"].steps if isinstance(s, Merge))
    assert len(enter.inputs) == 2 and len(merge.inputs) == 1  # the invariant is never merged
    steps = plans["a0"].steps
    (recv,) = [i for i, s in enumerate(steps) if isinstance(s, Recv)]  # wb arrives once, before the loop
    assert recv < steps.index(enter)


def test_cond_moves_the_false_branch_results_to_the_true_branch_type():
    def program(x):
        y = F(x)
        return isthmus.cond(SMALL(y), lambda v: G(v), lambda v: F(v), y)

    program_ir, _ = trace(program, X)
    (node,) = [n for n in program_ir.nodes if n.op is Op.COND]
    false_branch, true_branch = node.attrs.branches
    assert ops(false_branch)[-2] is Op.TRANSFER and ops(true_branch)[-2] is Op.COMPUTE
    with pytest.raises(InvalidArgument, match=r"result leaf \[0\]: true_fun returns float32\[2\]"):
        trace(lambda x: isthmus.cond(SMALL(F(x)), lambda v: (Function(None, lambda a: a[:2], SA)(v),),
                                     lambda v: (F(v),), F(x)), X)


def test_nested_loops_and_fori_loop_trace_and_lower():
    def program(x):
        def outer(c):
            return isthmus.fori_loop(0, 3, lambda i, v: F(v), c)

        return isthmus.while_loop(SMALL, outer, F(x))

    program_ir, _ = trace(program, X)
    outer = next(n for n in program_ir.nodes if n.op is Op.WHILE)
    assert Op.WHILE in ops(outer.attrs.body)
    plans = host_plans(lower(program_ir, {"sa": _on("a", "a0"), "sb": _on("b", "b0")}, check=True))
    assert [type(s).__name__ for s in plans["a0"].steps].count("Enter") == 2


def _on(island, host):
    from ir import Placement

    return Placement(island, ((host, 0), (host, 1)))


def test_control_flow_outside_a_program_is_refused():
    with pytest.raises(InvalidArgument, match="inside a @c"):
        isthmus.cond(jnp.bool_(True), F, F, np.ones(4))
    with pytest.raises(InvalidArgument, match="inside a @c"):
        isthmus.fori_loop(0, 2, lambda i, v: v, np.ones(4))


@pytest.mark.parametrize("use", ["returned", "read"])
def test_a_value_leaked_out_of_a_loop_body_is_refused_by_name_as_a_result_and_as_an_input(use):
    leaked = []

    def body(v):
        leaked.append(F(v))
        return leaked[-1]

    def program(x):
        out = isthmus.while_loop(SMALL, body, F(x))
        return out, leaked[-1] if use == "returned" else F(leaked[-1])

    with pytest.raises(InvalidArgument, match="a value traced inside a loop or branch was used outside it"):
        trace(program, X)
