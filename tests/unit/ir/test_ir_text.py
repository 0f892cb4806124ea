import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_chains import build_chain, chain_placements, chains
from ir_placed import EXAMPLE_PLACEMENTS, INTRA_PLACEMENTS, build_intra_island

from ir import ParseError, content_hash, parse_program, print_program, verify
from ir.passes import lower, place, route_transfers

pytestmark = pytest.mark.unit

LAYER, NORM, HEAD = (content_hash(name) for name in (b"layer", b"norm", b"head"))

GOLDEN = f"""\
isthmus.program v1
slice s0 = {{data: 2, model: 2}} island a
slice s1 = {{x: 4}} island b
%0 = arg float32[8,16] P(None, 'model') @s0
%1 = arg float32[4,8] P('data', None) @s0
%2 = compute layer {LAYER} @s0 (%1: float32[4,8] P('data', None), %0: float32[8,16] P(None, 'model')) \
-> (float32[4,16] P('data', None))
%3 = compute norm {NORM} @s0 (%2: float32[4,16] P('data', None)) -> (float32[4,16] P('data', None))
%4 = transfer %3 -> float32[4,16] P('x', None) @s1
%5 = compute head {HEAD} @s1 (%4: float32[4,16] P('x', None)) -> (float32[4,16] P('x', None))
result %5
"""


def test_golden_text(example):
    assert print_program(example) == GOLDEN
    assert parse_program(GOLDEN, example.artifacts) == example
    assert parse_program(GOLDEN, {a.hash: a.data for a in example.artifacts}) == example


def test_parse_without_artifacts_keeps_the_graph(example):
    parsed = parse_program(GOLDEN)
    assert parsed.graph == example.graph and parsed.artifacts == ()


def test_control_flow_round_trip(control_flow):
    text = print_program(control_flow)
    assert "cond {\n  %0 = arg" in text and "} body {" in text and "} branch {" in text
    assert parse_program(text, control_flow.artifacts) == control_flow


def test_comments_and_blank_lines_are_ignored(example):
    text = "# a comment\n\n" + GOLDEN.replace("%4 = transfer", "\n  # moves to island b\n%4 = transfer")
    assert parse_program(text, example.artifacts) == example


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "line 1: expected 'isthmus.program v1'"),
        ("isthmus.program v7\nresult\n", "line 1: program: expected a version in"),
        ("isthmus.program v1\nslice s0 = {x: 0}\nresult\n", "line 2: mesh: axis 'x' has size 0"),
        ("isthmus.program v1\n%0 = frob %1\nresult %0\n", "line 2: expected an op in"),
        ("isthmus.program v1\n%0 = arg float32[4] Q() @s0\nresult %0\n", "line 2: expected a type like"),
        ("isthmus.program v1\n%0 = arg float99[4] P() @s0\nresult %0\n", "line 2: dtype: unknown dtype"),
        ("isthmus.program v1\n%0 = arg float32[4] P(1) @s0\nresult %0\n", "line 2: spec: entry 1"),
        ("isthmus.program v1\n%0 = arg bool[] P() @s0\n", "line 2: graph: expected exactly one result"),
        ("isthmus.program v1\nresult\n}\n", "line 3: expected the end of the program"),
        ("isthmus.program v1\n%1 = while (%0) cond {\nresult\n", "expected '}' closing this node's cond"),
        ("isthmus.program v1\nslice s0 = {x: 2} placed a[a0]\nresult\n", "line 2: expected 'host:index', "
                                                                          "found 'a0'"),
        ("isthmus.program v1\nslice s0 = {x: 2} placed a[a0:0]\nresult\n",
         "line 2: slice s0: expected 2 placed devices for mesh {'x': 2}, found 1"),
        ("isthmus.program v1\nslice s0 = {x: 1} island b placed a[a0:0]\nresult\n",
         "line 2: slice s0: expected a placement on island b, found one on a"),
        ("isthmus.program v1\nslice s0 = {x: 2} placed a[a0:0, a0:0]\nresult\n",
         "line 2: placement: expected distinct devices"),
        ("isthmus.program v1\n%0 = arg float32[4] P() @s0\n%1 = transfer %0 -> float32[4] P() @s0 via warp\n"
         "result %1\n",
         "line 3: transfer to float32[4] P() @s0: expected a route in ('local', 'island', 'dcn'), found 'w"),
        ("isthmus.program v1\n%0 = arg float32[4] P() @s0\nsend %0 to b0\nresult\n",
         "line 3: expected 'send %value to HOST[,HOST...] tag TAG', found '%0 to b0'"),
        ("isthmus.program v1\n%0 = recv float32[4] P() @s0 tag t0\nresult\n",
         "line 2: expected 'recv TYPE from HOST[,HOST...] tag TAG'"),
        ("isthmus.program v1\n%0 = recv float32[4] P() @s0 from b0 tag t/0\nresult\n",
         "line 2: recv from b0: tag: expected a name matching"),
    ],
)
def test_parse_errors_name_the_line(text, message):
    with pytest.raises(ParseError) as info:
        parse_program(text)
    assert message in str(info.value)


@settings(max_examples=60, deadline=None)
@given(chains(), st.sampled_from([4, 8]))
def test_random_chains_round_trip_through_text(steps, width):
    program = build_chain(steps, width)
    verify(program)
    assert parse_program(print_program(program), program.artifacts) == program


def test_placed_routed_and_partitioned_programs_round_trip(example):
    routed = route_transfers(place(example, EXAMPLE_PLACEMENTS))
    assert "slice s1 = {x: 4} island b placed b[b0:0, b0:1, b0:2, b0:3]\n" in print_program(routed)
    assert "%4 = transfer %3 -> float32[4,16] P('x', None) @s1 via dcn\n" in print_program(routed)
    intra = lower(build_intra_island(), INTRA_PLACEMENTS)
    for program in (routed, lower(example, EXAMPLE_PLACEMENTS), intra):
        assert parse_program(print_program(program), program.artifacts) == program


@settings(max_examples=60, deadline=None)
@given(chains(), st.sampled_from([4, 8]), st.booleans())
def test_random_lowered_chains_round_trip_through_text(steps, width, split):
    program = lower(build_chain(steps, width), chain_placements(split))
    assert parse_program(print_program(program), program.artifacts) == program
