import dataclasses
import re

import pytest
from ir_placed import EXAMPLE_PLACEMENTS

from ir import (
    Aval,
    Graph,
    InvalidArgument,
    Node,
    Op,
    Program,
    Sig,
    Spec,
    Type,
    VerifyError,
    node_line,
    verify,
)
from ir.passes import lower, place, route_transfers

pytestmark = pytest.mark.unit


def with_node(program: Program, index: int, node: Node) -> Program:
    nodes = list(program.nodes)
    nodes[index] = node
    return dataclasses.replace(program, graph=Graph(tuple(nodes)))


def with_attrs(node: Node, **changes) -> Node:
    return dataclasses.replace(node, attrs=dataclasses.replace(node.attrs, **changes))


def fails(program: Program, index: int, *fragments: str) -> VerifyError:
    """Verify fails naming node `index` (of the top graph) and every fragment."""
    with pytest.raises(VerifyError) as info:
        verify(program)
    message = str(info.value)
    assert message.startswith(f"node {index} `{node_line(program.nodes[index])}`"), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    return info.value


def test_good_programs_verify(example, control_flow):
    verify(example)
    verify(control_flow)


def test_use_before_def(example):
    bad = with_node(example, 2, dataclasses.replace(example.nodes[2], inputs=("%1", "%3")))
    fails(bad, 2, "operand %3: expected a value defined by an earlier node",
          "found %3 defined later, by node 3")


def test_redefinition(example):
    bad = with_node(example, 3, dataclasses.replace(example.nodes[3], outputs=("%2",)))
    fails(bad, 3, "output %2: expected a name not defined before", "found %2 already defined by node 2")


def test_unknown_slice(example):
    arg = example.nodes[0]
    bad = with_node(example, 0, with_attrs(arg, type=dataclasses.replace(arg.attrs.type, slice="s9")))
    fails(bad, 0, "slice of %0: expected a slice in the table ['s0', 's1']", "found @s9")


def test_spec_naming_a_missing_axis(example):
    arg = example.nodes[0]
    missing_axis = dataclasses.replace(arg.attrs.type, spec=Spec((None, "nope")))
    bad = with_node(example, 0, with_attrs(arg, type=missing_axis))
    fails(bad, 0, "spec of %0: expected a spec that fits float32[8,16] on @s0 {'data': 2, 'model': 2}",
          "found P(None, 'nope')", "names axis 'nope'")


def test_compute_operand_needs_a_transfer(example):
    head = example.nodes[5]
    bad = with_node(example, 5, dataclasses.replace(head, inputs=("%3",)))
    fails(bad, 5, "operand 0 (%3) of head: expected float32[4,16] P('x', None) @s1",
          "found float32[4,16] P('data', None) @s0 (a change of slice or spec needs an explicit transfer)")


def test_transfer_keeps_the_aval(example):
    transfer = example.nodes[4]
    changed = dataclasses.replace(transfer.attrs.type, aval=Aval((4, 8), "float32"))
    fails(with_node(example, 4, with_attrs(transfer, type=changed)), 4,
          "transfer of %3: expected aval float32[4,16] (a transfer keeps the aval)", "found float32[4,8]")


def test_unknown_artifact(example):
    head = example.nodes[5].attrs.artifact
    bad = dataclasses.replace(example, artifacts=tuple(a for a in example.artifacts if a.hash != head))
    fails(bad, 5, "artifact of head: expected a hash in the program's artifact table", f"found {head}")


def test_undefined_result(example):
    bad = with_node(example, 6, dataclasses.replace(example.nodes[6], inputs=("%9",)))
    fails(bad, 6, "result %9: expected a value defined by an earlier node", "found %9 undefined")


def _loop(control_flow: Program) -> tuple[int, Node]:
    return next((i, n) for i, n in enumerate(control_flow.nodes) if n.op.value == "while")


def test_while_body_must_return_the_carry_types(control_flow):
    index, loop = _loop(control_flow)
    body = list(loop.attrs.body.nodes)
    step = body[2]
    body[2] = with_attrs(step, outs=(Sig(Aval((4, 16), "float32"), Spec(())), step.attrs.outs[1]))
    bad = with_node(control_flow, index, with_attrs(loop, body=Graph(tuple(body))))
    fails(bad, index, "while body results (the carry types): expected (float32[4,16] P('x', None) @s1, ",
          "found (float32[4,16] P() @s1, int32[] P() @s1)")


def test_while_cond_must_return_one_bool(control_flow):
    index, loop = _loop(control_flow)
    cond = list(loop.attrs.cond.nodes)
    cond[2] = with_attrs(cond[2], outs=(Sig(Aval((), "int32"), Spec(())),))
    bad = with_node(control_flow, index, with_attrs(loop, cond=Graph(tuple(cond))))
    fails(bad, index, "while cond results: expected one bool[] scalar", "found (int32[] P() @s1)")


def test_error_inside_a_sub_graph_names_both_nodes(control_flow):
    index, loop = _loop(control_flow)
    body = list(loop.attrs.body.nodes)
    body[2] = dataclasses.replace(body[2], inputs=("%0", "%7"))
    bad = with_node(control_flow, index, with_attrs(loop, body=Graph(tuple(body))))
    err = fails(bad, index, ", in body node 2 `%2, %3 = compute step", "operand %7: expected a value defined")
    assert "> " in err.context and "%1 = arg int32[] P() @s1" in err.context


def test_cond_branches_must_agree(control_flow):
    index, branch = len(control_flow.nodes) - 2, control_flow.nodes[-2]
    branches = list(branch.attrs.branches)
    nodes = list(branches[1].nodes)
    nodes[1] = with_attrs(nodes[1], outs=(Sig(Aval((4, 16), "float32"), Spec((None, "x"))),))
    branches[1] = Graph(tuple(nodes))
    bad = with_node(control_flow, index, with_attrs(branch, branches=tuple(branches)))
    fails(bad, index, "cond branch 1 results (those of branch 0): expected (float32[4,16] P('x', None) @s1)",
          "found (float32[4,16] P(None, 'x') @s1)")


def test_cond_predicate_must_be_a_bool_or_int32_scalar(control_flow):
    index, branch = len(control_flow.nodes) - 2, control_flow.nodes[-2]
    float_pred = dataclasses.replace(branch, inputs=(branch.inputs[1], branch.inputs[1]))
    bad = with_node(control_flow, index, float_pred)
    fails(bad, index, "cond predicate %2: expected a bool[] or int32[] scalar", "found float32[4,16]")


def test_error_shows_the_neighbourhood(example):
    head = example.nodes[5]
    err = fails(with_node(example, 5, dataclasses.replace(head, inputs=("%3",))), 5)
    lines = err.context.splitlines()
    assert len(lines) == 3
    assert re.match(r"\s+4 \| %4 = transfer", lines[0])
    assert re.match(r"\s+>\s+5 \| %5 = compute head", lines[1])
    assert re.match(r"\s+6 \| result %5", lines[2])


def test_arity_is_checked(example):
    transfer = example.nodes[4]
    fails(with_node(example, 4, dataclasses.replace(transfer, inputs=("%3", "%2"))), 4,
          "transfer operands: expected 1, found 2")


def test_type_of_an_arg_is_its_declared_type(example):
    assert example.nodes[0].attrs.type == Type(Aval((8, 16), "float32"), Spec((None, "model")), "s0")


# --- placed programs: routes, sends and receives --------------------------------------------


@pytest.fixture
def lowered(example) -> Program:
    """0, 1 args; 2 layer; 3 norm; 4 `send %3 to b0 tag t0`; 5 `%4 = recv ... from a0 tag t0`; 6 head."""
    return lower(example, EXAMPLE_PLACEMENTS)


def test_lowered_programs_verify(lowered):
    verify(lowered)
    assert [n.op for n in lowered.nodes[4:6]] == [Op.SEND, Op.RECV]


def test_recv_without_a_send(lowered):
    nodes = [n for i, n in enumerate(lowered.nodes) if i != 4]
    bad = dataclasses.replace(lowered, graph=Graph(tuple(nodes)))
    fails(bad, 4, "tag t0: expected a send with this tag, found none")


def test_send_without_a_recv(lowered):
    bad = with_node(lowered, 5, with_attrs(lowered.nodes[5], tag="t1"))
    fails(bad, 4, "tag t0: expected a recv with this tag, found none")


def test_two_sends_with_one_tag(lowered):
    nodes = list(lowered.nodes)
    nodes.insert(5, dataclasses.replace(nodes[4], inputs=("%2",)))
    bad = dataclasses.replace(lowered, graph=Graph(tuple(nodes)))
    fails(bad, 5, "tag t0: expected one send with this tag, found 2, also node 4 `send %3 to b0 tag t0`")


def test_recv_before_its_send(lowered):
    nodes = list(lowered.nodes)
    nodes[4], nodes[5] = nodes[5], nodes[4]
    bad = dataclasses.replace(lowered, graph=Graph(tuple(nodes)))
    fails(bad, 4, "tag t0 (sent by node 5 `send %3 to b0 tag t0`): "
                  "expected the send before the recv, found the send after it")


def test_send_and_recv_must_agree_on_the_aval(lowered):
    bad = with_node(lowered, 4, dataclasses.replace(lowered.nodes[4], inputs=("%1",)))
    fails(bad, 5, "tag t0 (sent by node 4 `send %1 to b0 tag t0`): "
                  "expected the aval sent, float32[4,8], found float32[4,16]")


def test_send_must_go_to_the_receiving_host(lowered):
    bad = with_node(lowered, 4, with_attrs(lowered.nodes[4], to=("b1",)))
    fails(bad, 5, "tag t0 (sent by node 4 `send %3 to b1 tag t0`): "
                  "expected the send to go to the hosts of @s1 (b0), found b1")


def test_recv_must_come_from_the_sending_host(lowered):
    bad = with_node(lowered, 5, with_attrs(lowered.nodes[5], sources=("a1",)))
    fails(bad, 5, "expected the recv to come from the hosts of @s0 (a0), found a1")


def test_a_send_goes_to_every_host_of_the_receiving_slice(lowered):
    bad = with_node(lowered, 4, with_attrs(lowered.nodes[4], to=("b0", "b1")))
    fails(bad, 5, "expected the send to go to the hosts of @s1 (b0), found b0, b1")


def test_sends_need_placed_slices(lowered):
    unplaced = dataclasses.replace(lowered, slices=tuple(dataclasses.replace(s, placement=None)
                                                         for s in lowered.slices))
    fails(unplaced, 4, "slice of %3 (sent with tag t0): expected a placed slice (sends and receives run "
                       "between hosts), found @s0 unplaced")
    only_s0 = dataclasses.replace(lowered, slices=(lowered.slices[0], unplaced.slices[1]))
    fails(only_s0, 5, "slice of %4 (received with tag t0): expected a placed slice", "found @s1 unplaced")


def test_route_must_match_the_placements(example):
    routed = route_transfers(place(example, EXAMPLE_PLACEMENTS))
    verify(routed)
    bad = with_node(routed, 4, with_attrs(routed.nodes[4], route="local"))
    fails(bad, 4, "route of the transfer of %3: expected via dcn (@s0 on a[a0], @s1 on b[b0])",
          "found via local")


def test_a_route_needs_placed_slices(example):
    bad = with_node(example, 4, with_attrs(example.nodes[4], route="dcn"))
    fails(bad, 4, "route of the transfer of %3: expected placed slices (a route is physical), "
                  "found via dcn with @s0, @s1 unplaced")


def test_unknown_route_is_refused(example):
    with pytest.raises(InvalidArgument, match=r"expected a route in \('local', 'island', 'dcn'\), found 'w"):
        with_attrs(example.nodes[4], route="warp")
