"""ir.autodiff: reverse mode as a pass over straight-line programs, with stand-in VJP rules:
each active computation becomes its forward (outputs and residuals) and, in reverse order,
its backward; a transfer's cotangent goes back by a transfer; fan-out is summed; what the
loss does not depend on through a differentiated argument is left as it was."""

from __future__ import annotations

import json

import pytest

from ir import (
    Artifact,
    Aval,
    ComputeAttrs,
    InvalidArgument,
    Op,
    Program,
    ProgramBuilder,
    Sig,
    Type,
    VerifyError,
    from_wire,
    parse_program,
    print_program,
    to_wire,
    value_types,
    verify,
)
from ir.autodiff import NotDifferentiable, Vjp, reverse

pytestmark = pytest.mark.unit

F32 = "float32"
V = Aval((4, 16), F32)
SCALAR = Aval((), F32)


class Rules:
    """Stand-in VJPs: a computation's residuals are its inputs; artifacts are named bytes."""

    def __init__(self) -> None:
        self.asked: list[tuple[str, tuple[bool, ...], tuple[bool, ...]]] = []

    def vjp(self, node: ComputeAttrs, wrt: tuple[bool, ...], cts: tuple[bool, ...],
            acc: tuple[bool, ...] = ()) -> Vjp:
        self.asked.append((node.name, wrt, cts))
        return Vjp(Artifact.of(f"fwd:{node.name}".encode()), node.ins,
                   Artifact.of(f"bwd:{node.name}:{wrt}:{cts}:{acc}".encode()))

    def zeros(self, t: Type) -> Artifact:
        return Artifact.of(f"zeros:{t}".encode())

    def ones(self, t: Type) -> Artifact:
        return Artifact.of(f"ones:{t}".encode())

    def add(self, t: Type, n: int) -> Artifact:
        return Artifact.of(f"add{n}:{t}".encode())


def two_islands() -> Program:
    """w and x on island a; layer(x, w) -> norm -> moved to island b -> a scalar loss there."""
    b = ProgramBuilder()
    s0 = b.slice("s0", {"data": 2, "model": 2}, island="a")
    s1 = b.slice("s1", {"x": 4}, island="b")
    w = b.arg(Aval((8, 16), F32), (None, "model"), s0)
    x = b.arg(Aval((4, 8), F32), ("data", None), s0)
    (h,) = b.compute("layer", b"layer", s0, [x, w], [(V, ("data", None))])
    (g,) = b.compute("norm", b"norm", s0, [h], [(V, ("data", None))])
    t = b.transfer(g, ("x", None), s1)
    (loss,) = b.compute("head", b"head", s1, [t], [(SCALAR, ())])
    b.result(loss, g)
    return b.build()


def lines(p: Program) -> list[str]:
    """Each node as `op name` (a computation) or `op` (the rest)."""
    return [f"{n.op.value} {n.attrs.name}" if isinstance(n.attrs, ComputeAttrs) else n.op.value
            for n in p.graph.nodes]


def test_a_chain_across_islands_runs_forward_then_backward_in_reverse_order():
    p, rules = two_islands(), Rules()
    d = reverse(p, [0], rules)
    verify(d)
    assert lines(d) == [
        "arg", "arg", "compute layer_fwd", "compute norm_fwd", "transfer", "compute head_fwd",
        "compute grad_ones", "compute head_bwd", "transfer", "compute norm_bwd", "compute layer_bwd",
        "result"]
    args, results = d.graph.args, d.graph.results
    types = {n.outputs[0]: n.attrs.type for n in d.graph.nodes if n.op is Op.ARG}
    assert types[args[0]] == p.graph.nodes[0].attrs.type  # the same arguments
    got = value_types(d)
    assert got[results[2]] == got[args[0]]  # the gradient has its argument's type
    assert got[results[0]].aval == SCALAR and got[results[1]].aval == V  # loss and aux, as before
    back = next(n for n in reversed(d.graph.nodes) if n.op is Op.TRANSFER)
    assert back.attrs.type == Type(V, got[p.graph.results[1]].spec, "s0")  # back to norm's slice and spec
    # x is no argument differentiated: layer's backward gives w's cotangent only
    assert ("layer", (False, True), (True,)) in rules.asked
    layer_bwd = next(n for n in d.graph.nodes
                     if isinstance(n.attrs, ComputeAttrs) and n.attrs.name == "layer_bwd")
    assert layer_bwd.attrs.outs == (Sig(Aval((8, 16), F32), got[args[0]].spec),)


def test_fan_out_is_summed_and_an_unused_argument_s_gradient_is_zeros():
    b = ProgramBuilder()
    s = b.slice("s", {"x": 2})
    x = b.arg(V, ("x", None), s)
    b.arg(V, ("x", None), s)  # no node reads it
    (f,) = b.compute("f", b"f", s, [x], [(V, ("x", None))])
    (g,) = b.compute("g", b"g", s, [x], [(V, ("x", None))])
    (loss,) = b.compute("sum2", b"sum2", s, [f, g], [(SCALAR, ())])
    b.result(loss)
    d = reverse(b.build(), [0, 1], Rules())
    verify(d)
    names = lines(d)
    assert names.count("compute grad_add2") == 1  # x's two contributions
    assert names[-2] == "compute grad_zeros"  # the unused argument's gradient
    assert len(d.graph.results) == 3


def test_what_the_loss_does_not_depend_on_through_wrt_stays_as_it_was():
    b = ProgramBuilder()
    s = b.slice("s", {"x": 2})
    w = b.arg(V, ("x", None), s)
    x = b.arg(V, ("x", None), s)
    (pre,) = b.compute("pre", b"pre", s, [x], [(V, ("x", None))])  # x only: not differentiated
    (loss,) = b.compute("loss", b"loss", s, [pre, w], [(SCALAR, ())])
    b.result(loss)
    p = b.build()
    d = reverse(p, [0], Rules())
    kept = next(n for n in d.graph.nodes if isinstance(n.attrs, ComputeAttrs) and n.attrs.name == "pre")
    assert kept.attrs.artifact == p.graph.nodes[2].attrs.artifact
    assert "compute pre_bwd" not in lines(d) and "compute loss_bwd" in lines(d)


def looped(through_w: bool, swap: bool = True, remat: bool = False) -> Program:
    """A loop doubling a carry (w's, or x's), then a loss of the loop's result and w."""
    b = ProgramBuilder()
    s = b.slice("s", {"x": 2})
    w, x = b.arg(V, ("x", None), s), b.arg(V, ("x", None), s)
    cond = b.sub()
    c = cond.arg(V, ("x", None), s)
    (p,) = cond.compute("small", b"small", s, [c], [(Aval((), "bool"), ())])
    cond.result(p)
    body = b.sub()
    y = body.arg(V, ("x", None), s)
    (y2,) = body.compute("double", b"double", s, [y], [(V, ("x", None))])
    body.result(y2)
    (z,) = b.while_([w if through_w else x], cond.graph(), body.graph(), swap=swap, remat=remat)
    (loss,) = b.compute("loss", b"loss", s, [z, w], [(SCALAR, ())])
    b.result(loss)
    return b.build()


def test_a_loop_s_transpose_repeats_its_trip_count_backwards_popping_what_it_pushed():
    d = reverse(looped(through_w=True), [0], Rules())
    verify(d)
    assert lines(d) == ["arg", "arg", "while", "compute loss_fwd", "compute grad_ones", "compute loss_bwd",
                        "repeat", "compute grad_add2", "result"]
    fwd, bwd = d.graph.nodes[2], d.graph.nodes[6]
    assert (fwd.attrs.trips, fwd.attrs.trips_depth) == (bwd.attrs.trips, bwd.attrs.depth) == ("gs1", 0)
    assert fwd.attrs.cond == looped(through_w=True).graph.nodes[2].attrs.cond  # the loop's own test
    body = fwd.attrs.body
    assert lines_of(body) == ["arg", "compute double_fwd", "push", "result"]
    push = next(n for n in body.nodes if n.op is Op.PUSH)
    assert push.inputs[0] == body.nodes[1].outputs[1]  # double's residual, saved per iteration
    back = bwd.attrs.body
    assert lines_of(back) == ["arg", "pop", "compute double_bwd", "result"]  # no predicate to compute
    pop = next(n for n in back.nodes if n.op is Op.POP)
    assert (pop.attrs.stack, pop.attrs.depth, pop.attrs.type) == (push.attrs.stack, 1, push.attrs.type)
    # w's gradient: through the loss directly, and through the loop
    assert d.graph.results[1] == d.graph.nodes[7].outputs[0]
    assert set(d.graph.nodes[7].inputs) == {d.graph.nodes[5].outputs[1], bwd.outputs[0]}
    text = print_program(d)
    assert print_program(parse_program(text)) == text and from_wire(to_wire(d)) == d


def test_a_rematerialised_loop_saves_its_carry_and_its_backward_computes_the_forward_again():
    d = reverse(looped(through_w=True, remat=True), [0], Rules())
    verify(d)
    fwd, bwd = (n for n in d.graph.nodes if n.op in (Op.WHILE, Op.REPEAT))
    assert fwd.attrs.remat and (fwd.attrs.trips, bwd.attrs.trips) == ("gs1", "gs1")
    body = fwd.attrs.body
    assert lines_of(body) == ["arg", "compute double", "push", "result"]  # the loop's own body
    push = next(n for n in body.nodes if n.op is Op.PUSH)
    assert push.inputs[0] == body.args[0]  # the carry as the iteration enters it
    back = bwd.attrs.body
    assert lines_of(back) == ["arg", "pop", "compute double_fwd", "compute double_bwd", "result"]
    pop, again, grad = back.nodes[1], back.nodes[2], back.nodes[3]
    assert (pop.attrs.stack, pop.attrs.depth) == (push.attrs.stack, 1) and again.inputs == pop.outputs
    assert grad.inputs[0] == again.outputs[1]  # the residual computed again, not popped
    text = print_program(d)
    assert " remat" in text and print_program(parse_program(text)) == text and from_wire(to_wire(d)) == d


def tilted(remat: bool) -> Program:
    """A loop whose body tilts its carry by w, an invariant, then a loss of the loop's result."""
    b = ProgramBuilder()
    s = b.slice("s", {"x": 2})
    w, x = b.arg(V, ("x", None), s), b.arg(V, ("x", None), s)
    cond = b.sub()
    c, _ = cond.arg(V, ("x", None), s), cond.arg(V, ("x", None), s)
    cond.result(*cond.compute("small", b"small", s, [c], [(Aval((), "bool"), ())]))
    body = b.sub()
    y, bw = body.arg(V, ("x", None), s), body.arg(V, ("x", None), s)
    (y2,) = body.compute("tilt", b"tilt", s, [y, bw], [(V, ("x", None))])
    body.result(y2, bw)  # w: invariant
    z, _ = b.while_([x, w], cond.graph(), body.graph(), remat=remat)
    b.result(*b.compute("loss", b"loss", s, [z], [(SCALAR, ())]))
    return b.build()


def test_a_rematerialised_loop_carries_its_invariants_back_instead_of_saving_them():
    d = reverse(tilted(remat=True), [0, 1], Rules())
    verify(d)
    fwd, bwd = (n for n in d.graph.nodes if n.op in (Op.WHILE, Op.REPEAT))
    pushes = [n for n in fwd.attrs.body.nodes if n.op is Op.PUSH]
    assert [p.inputs[0] for p in pushes] == [fwd.attrs.body.args[0]]  # the moving carry only
    assert bwd.inputs[-1] == fwd.inputs[1] == d.graph.args[0]  # w, carried back unchanged
    back = bwd.attrs.body
    assert back.results[-1] == back.args[-1] and lines_of(back).count("pop") == 1


class Reading(Rules):
    """Stand-in VJPs whose residuals are the computation's inputs read where they are (as
    `client.vjp` finds a weight a matmul's pullback reads): the forward computes none."""

    def vjp(self, node: ComputeAttrs, wrt: tuple[bool, ...], cts: tuple[bool, ...],
            acc: tuple[bool, ...] = ()) -> Vjp:
        made = super().vjp(node, wrt, cts, acc)
        return Vjp(made.fwd, made.residuals, made.bwd, tuple(("in", i) for i in range(len(node.ins))))


def test_a_loop_s_backward_carries_an_invariant_it_reads_instead_of_saving_it_each_iteration():
    d = reverse(tilted(remat=False), [0, 1], Reading())
    verify(d)
    fwd, bwd = (n for n in d.graph.nodes if n.op in (Op.WHILE, Op.REPEAT))
    forward = fwd.attrs.body
    assert lines_of(forward) == ["arg", "arg", "compute tilt_fwd", "push", "result"]
    assert len(forward.nodes[2].outputs) == 1  # tilt's own output: its residuals are its inputs
    push = forward.nodes[3]
    assert push.inputs[0] == forward.args[0]  # the moving carry, read by tilt's backward
    assert bwd.inputs[-1] == fwd.inputs[1] == d.graph.args[0]  # w, carried back unchanged
    back = bwd.attrs.body
    assert back.results[-1] == back.args[-1] and lines_of(back).count("pop") == 1
    pop, grad = (next(n for n in back.nodes if n.op is op) for op in (Op.POP, Op.COMPUTE))
    assert grad.inputs[:2] == (pop.outputs[0], back.args[-1])  # y popped, w as it came
    text = print_program(d)
    assert print_program(parse_program(text)) == text and from_wire(to_wire(d)) == d


class Activations(Rules):
    """Stand-in VJPs whose residuals are the computation's first input and its output, read
    where they are (as a tanh cell's pullback reads its state and its result)."""

    def vjp(self, node: ComputeAttrs, wrt: tuple[bool, ...], cts: tuple[bool, ...],
            acc: tuple[bool, ...] = ()) -> Vjp:
        made = super().vjp(node, wrt, cts, acc)
        return Vjp(made.fwd, (node.ins[0], node.outs[0]), made.bwd, (("in", 0), ("out", 0)))


def test_a_loop_saves_its_state_once_and_its_backward_hands_each_iteration_s_back_to_the_one_before():
    d = reverse(looped(through_w=True), [0], Activations())
    verify(d)
    fwd, bwd = (n for n in d.graph.nodes if n.op in (Op.WHILE, Op.REPEAT))
    forward = fwd.attrs.body
    assert lines_of(forward) == ["arg", "compute double_fwd", "push", "result"]
    assert forward.nodes[2].inputs[0] == forward.args[0]  # y as it came: its double is next's y
    assert bwd.inputs[-1] == fwd.outputs[0]  # the last iteration's double: the loop's output
    back = bwd.attrs.body
    pop, grad = (next(n for n in back.nodes if n.op is op) for op in (Op.POP, Op.COMPUTE))
    assert grad.inputs[:2] == (pop.outputs[0], back.args[-1])  # this iteration's y and its double
    assert back.results[-1] == pop.outputs[0]  # y: the double of the iteration before
    text = print_program(d)
    assert print_program(parse_program(text)) == text and from_wire(to_wire(d)) == d


def test_a_stack_needs_one_push_and_one_pop_alike_and_a_repeat_its_while():
    d = reverse(looped(through_w=True), [0], Rules())
    wire = json.dumps(to_wire(d))
    assert wire.count('"stack": "gs0", "depth": 1') == 2
    with pytest.raises(VerifyError, match="stack gs9: expected one push and one pop, found no pop"):
        verify(from_wire(json.loads(wire.replace('"stack": "gs0"', '"stack": "gs9"', 1))))
    with pytest.raises(VerifyError, match="stack gs0: expected the type and depth of its push"):
        verify(from_wire(json.loads(wire[::-1].replace('"stack": "gs0", "depth": 1'[::-1],
                                                       '"stack": "gs0", "depth": 2'[::-1], 1)[::-1])))
    with pytest.raises(VerifyError, match="trips gs1: expected one while that saves them and one repeat, "
                                          "found 1 and 0"):
        verify(from_wire(json.loads(wire.replace('"trips": "gs1", "depth"', '"trips": "gs7", "depth"'))))
    with pytest.raises(VerifyError, match="trips gs1: expected the depth of its while, 0"):
        verify(from_wire(json.loads(wire.replace('"trips": "gs1", "depth": 0',
                                                 '"trips": "gs1", "depth": 1'))))


def lines_of(g) -> list[str]:
    return [f"{n.op.value} {n.attrs.name}" if isinstance(n.attrs, ComputeAttrs) else n.op.value
            for n in g.nodes]


def test_a_loop_that_does_not_swap_gives_its_stacks_no_swap_and_they_travel():
    d = reverse(looped(through_w=True, swap=False), [0], Rules())
    fwd, bwd = (n for n in d.graph.nodes if n.op in (Op.WHILE, Op.REPEAT))
    push = next(n for n in fwd.attrs.body.nodes if n.op is Op.PUSH)
    pop = next(n for n in bwd.attrs.body.nodes if n.op is Op.POP)
    assert not fwd.attrs.swap and not push.attrs.swap and not pop.attrs.swap
    text = print_program(d)
    assert "no_swap" in text and print_program(parse_program(text)) == text and from_wire(to_wire(d)) == d


def test_loops_the_loss_does_not_depend_on_through_wrt_are_kept():
    d = reverse(looped(through_w=False), [0], Rules())
    verify(d)
    assert lines(d) == ["arg", "arg", "while", "compute loss_fwd", "compute grad_ones", "compute loss_bwd",
                        "result"]


def test_what_cannot_be_differentiated_is_named():
    p = two_islands()
    with pytest.raises(NotDifferentiable, match=r"argument 0 .* not of an inexact dtype"):
        b = ProgramBuilder()
        s = b.slice("s", {"x": 2})
        n = b.arg(Aval((), "int32"), (), s)
        (loss,) = b.compute("f", b"f", s, [n], [(SCALAR, ())])
        b.result(loss)
        reverse(b.build(), [0], Rules())
    b = ProgramBuilder()
    s = b.slice("s", {"x": 2})
    x = b.arg(V, ("x", None), s)
    b.result(x)
    with pytest.raises(NotDifferentiable, match=r"the loss \(%0, float32\[4,16\].*\) must be a scalar"):
        reverse(b.build(), [0], Rules())
    with pytest.raises(NotDifferentiable, match="wrt: expected distinct argument positions below 2"):
        reverse(p, [0, 0], Rules())


def test_a_differentiated_program_inlines_into_another_and_a_wrong_argument_is_named():
    d = reverse(two_islands(), [0], Rules())
    b = ProgramBuilder()
    s0 = b.slice("s0", {"data": 2, "model": 2}, island="a")
    w = b.arg(Aval((8, 16), F32), (None, "model"), s0)
    x = b.arg(Aval((4, 8), F32), ("data", None), s0)
    loss, _, grad_w = b.inline(d, [w, x])
    b.result(loss, grad_w)
    p = b.build()
    assert value_types(p)[p.graph.results[1]] == value_types(p)[w]
    assert lines(p)[2:-1] == lines(d)[2:-1]  # its nodes, renamed
    other = ProgramBuilder()
    s0 = other.slice("s0", {"data": 2, "model": 2}, island="a")
    w = other.arg(Aval((8, 16), F32), (None, "model"), s0)
    with pytest.raises(InvalidArgument, match=r"inline: argument %1: expected float32\[4,8\]"):
        other.inline(d, [w, w])


def branched(nested: bool = False) -> Program:
    """A cond on island a's predicate: branch 0 scales w on island a, branch 1 moves it to
    island b and transforms it there (`nested`: through a cond of its own); then a loss."""
    b = ProgramBuilder()
    sa = b.slice("sa", {"x": 2}, island="a")
    sb = b.slice("sb", {"y": 2}, island="b")
    w = b.arg(V, ("x", None), sa)
    x = b.arg(V, ("x", None), sa)
    (p,) = b.compute("positive", b"positive", sa, [x], [(Aval((), "bool"), ())])
    zero = b.sub()
    zw, zx = zero.arg(V, ("x", None), sa), zero.arg(V, ("x", None), sa)
    (scaled,) = zero.compute("scale", b"scale", sa, [zw, zx], [(V, ("x", None))])
    zero.result(scaled)
    one = b.sub()
    ow, _ = one.arg(V, ("x", None), sa), one.arg(V, ("x", None), sa)
    moved = one.transfer(ow, ("y", None), sb)
    if nested:
        (q,) = one.compute("big", b"big", sb, [moved], [(Aval((), "bool"), ())])
        keep, square = one.sub(), one.sub()
        keep.result(keep.arg(V, ("y", None), sb))
        sq = square.arg(V, ("y", None), sb)
        square.result(*square.compute("square", b"square", sb, [sq], [(V, ("y", None))]))
        (t,) = one.cond(q, [moved], [keep.graph(), square.graph()])
    else:
        (t,) = one.compute("tanh", b"tanh", sb, [moved], [(V, ("y", None))])
    one.result(one.transfer(t, ("x", None), sa))
    (z,) = b.cond(p, [w, x], [zero.graph(), one.graph()])
    (loss,) = b.compute("loss", b"loss", sa, [z], [(SCALAR, ())])
    b.result(loss)
    return b.build()


def branch_lines(g) -> list[str]:
    return [f"{n.op.value} {n.attrs.name}" if isinstance(n.attrs, ComputeAttrs) else n.op.value
            for n in g.nodes]


def test_a_cond_s_transpose_is_a_cond_on_the_same_predicate_over_every_branch_s_residuals():
    p, rules = branched(), Rules()
    d = reverse(p, [0], rules)
    verify(d)
    assert lines(d) == ["arg", "arg", "compute positive", "cond", "compute loss_fwd", "compute grad_ones",
                        "compute loss_bwd", "cond", "result"]
    fwd, bwd = (n for n in d.graph.nodes if n.op is Op.COND)
    assert bwd.inputs[0] == fwd.inputs[0]  # the same predicate
    zero, one = fwd.attrs.branches
    # scale's residuals are its inputs (w, x), tanh's its input (moved): each branch returns
    # its own and zeros for the other's
    assert branch_lines(zero) == ["arg", "arg", "compute scale_fwd", "compute grad_zeros", "result"]
    assert branch_lines(one) == ["arg", "arg", "transfer", "compute tanh_fwd", "transfer",
                                 "compute grad_zeros", "compute grad_zeros", "result"]
    types = value_types(d)
    assert [types[v].slice for v in fwd.outputs] == ["sa", "sa", "sa", "sb"]
    assert bwd.inputs[1:] == (d.graph.nodes[6].outputs[0], *fwd.outputs[1:])  # ct of z, then residuals
    back_zero, back_one = bwd.attrs.branches
    assert branch_lines(back_zero) == ["arg"] * 4 + ["compute scale_bwd", "result"]
    assert branch_lines(back_one) == ["arg"] * 4 + ["transfer", "compute tanh_bwd", "transfer", "result"]
    assert d.graph.results[1] == bwd.outputs[0]  # w's gradient: what the taken branch gave
    assert ("scale", (True, False), (True,)) in rules.asked


def test_nested_conds_pass_their_predicate_and_residuals_out_through_the_enclosing_branch():
    d = reverse(branched(nested=True), [0], Rules())
    verify(d)
    fwd, bwd = (n for n in d.graph.nodes if n.op is Op.COND)
    _, one = fwd.attrs.branches
    assert branch_lines(one)[-4:] == ["transfer", "compute grad_zeros", "compute grad_zeros", "result"]
    inner = next(n for n in one.nodes if n.op is Op.COND)
    # the inner cond gives its result and square's residual (zeros from the branch that keeps)
    assert len(inner.outputs) == 2
    saved = one.results[1:]
    assert inner.inputs[0] in saved and inner.outputs[1] in saved  # its predicate and residual, out
    back_inner = next(n for n in bwd.attrs.branches[1].nodes if n.op is Op.COND)
    assert [branch_lines(g) for g in back_inner.attrs.branches] == [
        ["arg", "arg", "result"], ["arg", "arg", "compute square_bwd", "result"]]


def test_a_branch_that_does_not_read_an_operand_gives_it_zeros_and_saves_nothing():
    d = reverse(branched(), [1], Rules())  # x: scale's operand on branch 0, unread on branch 1
    verify(d)
    fwd, bwd = (n for n in d.graph.nodes if n.op is Op.COND)
    assert len(fwd.outputs) == 1 + 2  # z and scale's residuals: tanh is not on x's path
    assert branch_lines(fwd.attrs.branches[1]) == ["arg", "arg", "transfer", "compute tanh", "transfer",
                                                   "compute grad_zeros", "compute grad_zeros", "result"]
    assert branch_lines(bwd.attrs.branches[1]) == ["arg", "arg", "arg", "compute grad_zeros", "result"]
