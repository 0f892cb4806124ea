"""Golden tests of the lowering passes: a program's text before and after each pass."""

import dataclasses
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ir_chains import build_chain, chain_placements, chains
from ir_placed import (
    EXAMPLE_PLACEMENTS,
    INTRA_PLACEMENTS,
    build_intra_island,
    on,
)

from ir import (
    Graph,
    InvalidArgument,
    Op,
    Placement,
    VerifyError,
    content_hash,
    parse_program,
    print_program,
    verify,
)
from ir.passes import host_plans, lower, partition, pipeline, place, route_transfers, schedule
from ir.plan import Send

pytestmark = pytest.mark.unit

LAYER, NORM, HEAD = (content_hash(name) for name in (b"layer", b"norm", b"head"))
F, G, H, K = (content_hash(name) for name in (b"f", b"g", b"h", b"k"))

# --- the example: islands a and b, one transfer between them ---------------------------------

EXAMPLE = f"""\
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

EXAMPLE_PLACED = f"""\
isthmus.program v1
slice s0 = {{data: 2, model: 2}} island a placed a[a0:0, a0:1, a0:2, a0:3]
slice s1 = {{x: 4}} island b placed b[b0:0, b0:1, b0:2, b0:3]
%0 = arg float32[8,16] P(None, 'model') @s0
%1 = arg float32[4,8] P('data', None) @s0
%2 = compute layer {LAYER} @s0 (%1: float32[4,8] P('data', None), %0: float32[8,16] P(None, 'model')) \
-> (float32[4,16] P('data', None))
%3 = compute norm {NORM} @s0 (%2: float32[4,16] P('data', None)) -> (float32[4,16] P('data', None))
%4 = transfer %3 -> float32[4,16] P('x', None) @s1
%5 = compute head {HEAD} @s1 (%4: float32[4,16] P('x', None)) -> (float32[4,16] P('x', None))
result %5
"""

EXAMPLE_ROUTED = f"""\
isthmus.program v1
slice s0 = {{data: 2, model: 2}} island a placed a[a0:0, a0:1, a0:2, a0:3]
slice s1 = {{x: 4}} island b placed b[b0:0, b0:1, b0:2, b0:3]
%0 = arg float32[8,16] P(None, 'model') @s0
%1 = arg float32[4,8] P('data', None) @s0
%2 = compute layer {LAYER} @s0 (%1: float32[4,8] P('data', None), %0: float32[8,16] P(None, 'model')) \
-> (float32[4,16] P('data', None))
%3 = compute norm {NORM} @s0 (%2: float32[4,16] P('data', None)) -> (float32[4,16] P('data', None))
%4 = transfer %3 -> float32[4,16] P('x', None) @s1 via dcn
%5 = compute head {HEAD} @s1 (%4: float32[4,16] P('x', None)) -> (float32[4,16] P('x', None))
result %5
"""

EXAMPLE_PARTITIONED = f"""\
isthmus.program v1
slice s0 = {{data: 2, model: 2}} island a placed a[a0:0, a0:1, a0:2, a0:3]
slice s1 = {{x: 4}} island b placed b[b0:0, b0:1, b0:2, b0:3]
%0 = arg float32[8,16] P(None, 'model') @s0
%1 = arg float32[4,8] P('data', None) @s0
%2 = compute layer {LAYER} @s0 (%1: float32[4,8] P('data', None), %0: float32[8,16] P(None, 'model')) \
-> (float32[4,16] P('data', None))
%3 = compute norm {NORM} @s0 (%2: float32[4,16] P('data', None)) -> (float32[4,16] P('data', None))
send %3 to b0 tag t0
%4 = recv float32[4,16] P('x', None) @s1 from a0 tag t0
%5 = compute head {HEAD} @s1 (%4: float32[4,16] P('x', None)) -> (float32[4,16] P('x', None))
result %5
"""

# A chain is already in list-schedule order: the schedule leaves it as it is.
EXAMPLE_SCHEDULED = EXAMPLE_PARTITIONED

# --- one island: a local reshard on a0, an island move from a0 to a1 -------------------------

INTRA = f"""\
isthmus.program v1
slice s0 = {{x: 2}} island a
slice s1 = {{x: 2}} island a
slice s2 = {{y: 2}}
%0 = arg float32[8] P('x') @s0
%1 = compute f {F} @s0 (%0: float32[8] P('x')) -> (float32[8] P('x'))
%2 = compute g {G} @s0 (%0: float32[8] P('x')) -> (float32[8] P())
%3 = transfer %1 -> float32[8] P() @s1
%4 = compute h {H} @s1 (%3: float32[8] P()) -> (float32[8] P('x'))
%5 = transfer %4 -> float32[8] P('y') @s2
%6 = compute k {K} @s2 (%5: float32[8] P('y')) -> (float32[8] P('y'))
result %6, %2
"""

INTRA_PLACED = f"""\
isthmus.program v1
slice s0 = {{x: 2}} island a placed a[a0:0, a0:1]
slice s1 = {{x: 2}} island a placed a[a0:2, a0:3]
slice s2 = {{y: 2}} placed a[a1:0, a1:1]
%0 = arg float32[8] P('x') @s0
%1 = compute f {F} @s0 (%0: float32[8] P('x')) -> (float32[8] P('x'))
%2 = compute g {G} @s0 (%0: float32[8] P('x')) -> (float32[8] P())
%3 = transfer %1 -> float32[8] P() @s1
%4 = compute h {H} @s1 (%3: float32[8] P()) -> (float32[8] P('x'))
%5 = transfer %4 -> float32[8] P('y') @s2
%6 = compute k {K} @s2 (%5: float32[8] P('y')) -> (float32[8] P('y'))
result %6, %2
"""

INTRA_ROUTED = f"""\
isthmus.program v1
slice s0 = {{x: 2}} island a placed a[a0:0, a0:1]
slice s1 = {{x: 2}} island a placed a[a0:2, a0:3]
slice s2 = {{y: 2}} placed a[a1:0, a1:1]
%0 = arg float32[8] P('x') @s0
%1 = compute f {F} @s0 (%0: float32[8] P('x')) -> (float32[8] P('x'))
%2 = compute g {G} @s0 (%0: float32[8] P('x')) -> (float32[8] P())
%3 = transfer %1 -> float32[8] P() @s1 via local
%4 = compute h {H} @s1 (%3: float32[8] P()) -> (float32[8] P('x'))
%5 = transfer %4 -> float32[8] P('y') @s2 via island
%6 = compute k {K} @s2 (%5: float32[8] P('y')) -> (float32[8] P('y'))
result %6, %2
"""

INTRA_PARTITIONED = f"""\
isthmus.program v1
slice s0 = {{x: 2}} island a placed a[a0:0, a0:1]
slice s1 = {{x: 2}} island a placed a[a0:2, a0:3]
slice s2 = {{y: 2}} placed a[a1:0, a1:1]
%0 = arg float32[8] P('x') @s0
%1 = compute f {F} @s0 (%0: float32[8] P('x')) -> (float32[8] P('x'))
%2 = compute g {G} @s0 (%0: float32[8] P('x')) -> (float32[8] P())
%3 = transfer %1 -> float32[8] P() @s1 via local
%4 = compute h {H} @s1 (%3: float32[8] P()) -> (float32[8] P('x'))
send %4 to a1 tag t0
%5 = recv float32[8] P('y') @s2 from a0 tag t0
%6 = compute k {K} @s2 (%5: float32[8] P('y')) -> (float32[8] P('y'))
result %6, %2
"""

# The long path f -> h -> send -> recv -> k goes first; g (path length 1) waits, and wins
# the tie with k by its original position.
INTRA_SCHEDULED = f"""\
isthmus.program v1
slice s0 = {{x: 2}} island a placed a[a0:0, a0:1]
slice s1 = {{x: 2}} island a placed a[a0:2, a0:3]
slice s2 = {{y: 2}} placed a[a1:0, a1:1]
%0 = arg float32[8] P('x') @s0
%1 = compute f {F} @s0 (%0: float32[8] P('x')) -> (float32[8] P('x'))
%3 = transfer %1 -> float32[8] P() @s1 via local
%4 = compute h {H} @s1 (%3: float32[8] P()) -> (float32[8] P('x'))
send %4 to a1 tag t0
%5 = recv float32[8] P('y') @s2 from a0 tag t0
%2 = compute g {G} @s0 (%0: float32[8] P('x')) -> (float32[8] P())
%6 = compute k {K} @s2 (%5: float32[8] P('y')) -> (float32[8] P('y'))
result %6, %2
"""

CASES = {
    "example": (EXAMPLE_PLACEMENTS, [EXAMPLE, EXAMPLE_PLACED, EXAMPLE_ROUTED, EXAMPLE_PARTITIONED,
                                     EXAMPLE_SCHEDULED]),
    "intra": (INTRA_PLACEMENTS, [INTRA, INTRA_PLACED, INTRA_ROUTED, INTRA_PARTITIONED, INTRA_SCHEDULED]),
}
ARTIFACTS = {content_hash(n): n for n in (b"layer", b"norm", b"head", b"f", b"g", b"h", b"k")}


def test_goldens_start_from_the_built_programs(example):
    assert print_program(example) == EXAMPLE
    assert print_program(build_intra_island()) == INTRA


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("step", range(4), ids=[name for name, _ in pipeline({})])
def test_each_pass_golden(case, step):
    placements, texts = CASES[case]
    name, run = pipeline(placements)[step]
    before = parse_program(texts[step], ARTIFACTS)
    after = run(before)
    verify(after)
    assert print_program(after) == texts[step + 1], name
    assert parse_program(texts[step + 1], ARTIFACTS) == after


@pytest.mark.parametrize("case", CASES)
def test_lower_runs_the_pipeline_with_checks(case):
    placements, texts = CASES[case]
    program = parse_program(texts[0], ARTIFACTS)
    assert print_program(lower(program, placements, check=True)) == texts[-1]
    assert lower(program, placements) == lower(program, placements, check=True)


# --- each pass's errors ----------------------------------------------------------------------


def message(error: type[Exception], run: Callable[[], object]) -> str:
    with pytest.raises(error) as info:
        run()
    return str(info.value)


def test_place_needs_every_slice(example):
    placements = {"s0": EXAMPLE_PLACEMENTS["s0"], "s9": EXAMPLE_PLACEMENTS["s1"]}
    assert message(InvalidArgument, lambda: place(example, placements)) == (
        "place: expected a placement for every slice, found none for s1 (placed: s0, s9)"
    )


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        (on("b", "b0", 0, 1), "slice s1: expected 4 placed devices for mesh {'x': 4}, found 2"),
        (on("a", "a1", 0, 1, 2, 3), "slice s1: expected a placement on island b, found one on a"),
    ],
)
def test_place_refuses_a_placement_that_does_not_fit(example, placement, expected):
    placements = EXAMPLE_PLACEMENTS | {"s1": placement}
    assert message(InvalidArgument, lambda: place(example, placements)) == expected


def test_place_ignores_placements_of_other_slices(example):
    placed = place(example, EXAMPLE_PLACEMENTS | {"s9": on("c", "c0", 0)})
    assert placed.slice_table["s1"].placement == EXAMPLE_PLACEMENTS["s1"]


def test_route_transfers_needs_placed_slices(example):
    s0 = place(example, EXAMPLE_PLACEMENTS).slices[0]
    half = dataclasses.replace(example, slices=(s0, example.slices[1]))
    assert message(InvalidArgument, lambda: route_transfers(half)) == (
        "route_transfers: `%4 = transfer %3 -> float32[4,16] P('x', None) @s1`: expected placed slices, "
        "found s1 unplaced (run place first)"
    )


def test_partition_moves_out_of_a_slice_over_two_hosts_from_each_of_them(example):
    wide = EXAMPLE_PLACEMENTS | {"s0": Placement("a", (("a0", 0), ("a0", 1), ("a1", 0), ("a1", 1)))}
    lines = print_program(lower(example, wide)).splitlines()
    assert "send %3 to b0 tag t0" in lines
    assert "%4 = recv float32[4,16] P('x', None) @s1 from a0,a1 tag t0" in lines
    plans = host_plans(lower(example, wide), {"a0": 0, "a1": 1})
    assert [type(s).__name__ for s in plans["a0"].steps] == [type(s).__name__ for s in plans["a1"].steps]
    assert plans["a0"].steps[-1] == plans["a1"].steps[-1] == Send("%3", ("b0",), "t0")
    assert plans["b0"].steps[0].sources == ("a0", "a1")


def test_partition_needs_routed_transfers(example):
    assert message(InvalidArgument, lambda: partition(place(example, EXAMPLE_PLACEMENTS))) == (
        "partition: `%4 = transfer %3 -> float32[4,16] P('x', None) @s1`: expected a routed transfer, "
        "found a logical one (run route_transfers first)"
    )


def test_partition_skips_tags_in_use():
    text = INTRA_PARTITIONED.replace("result %6, %2", "%7 = transfer %6 -> float32[8] P('x') @s0 via island\n"
                                                      "result %7, %2")
    cut = print_program(partition(parse_program(text, ARTIFACTS)))
    assert cut.endswith("send %4 to a1 tag t0\n"
                        "%5 = recv float32[8] P('y') @s2 from a0 tag t0\n"
                        f"%6 = compute k {K} @s2 (%5: float32[8] P('y')) -> (float32[8] P('y'))\n"
                        "send %6 to a0 tag t1\n"
                        "%7 = recv float32[8] P('x') @s0 from a1 tag t1\n"
                        "result %7, %2\n")
    assert partition(parse_program(cut, ARTIFACTS)) == parse_program(cut, ARTIFACTS)


def test_lower_verifies_its_input(example):
    bad = dataclasses.replace(example, artifacts=())
    assert "artifact of layer" in message(VerifyError, lambda: lower(bad, EXAMPLE_PLACEMENTS))


def test_check_names_the_pass_that_broke_the_ir(example, monkeypatch):
    import ir.passes

    def broken(program):  # drops the node that defines %3, which the transfer uses
        kept = tuple(n for n in program.nodes if "%3" not in n.outputs)
        return dataclasses.replace(program, graph=Graph(kept))

    monkeypatch.setattr(ir.passes, "pipeline", lambda placements, fuse=False: (("broken", broken),))
    text = message(VerifyError, lambda: lower(example, EXAMPLE_PLACEMENTS, check=True))
    assert text.startswith("after broken: node 3 `%4 = transfer %3 -> float32[4,16] P('x', None) @s1`: "
                           "operand %3: expected a value defined by an earlier node"), text


# --- the schedule ----------------------------------------------------------------------------


def test_schedule_keeps_args_first_and_result_last():
    scheduled = lower(build_intra_island(), INTRA_PLACEMENTS)
    ops = [n.op for n in scheduled.nodes]
    assert ops[0] is Op.ARG and ops[-1] is Op.RESULT and Op.ARG not in ops[1:-1]
    assert schedule(scheduled) == scheduled


@settings(max_examples=60, deadline=None)
@given(chains(), st.sampled_from([4, 8]), st.booleans())
def test_random_chains_lower_with_checks(steps, width, split):
    program = build_chain(steps, width)
    lowered = lower(program, chain_placements(split), check=True)
    assert sorted(lowered.nodes, key=repr) == sorted(partition(route_transfers(
        place(program, chain_placements(split)))).nodes, key=repr)
    assert schedule(lowered) == lowered
    routes = {n.attrs.route for n in route_transfers(place(program, chain_placements(split))).nodes
              if n.op is Op.TRANSFER}
    assert routes <= ({"local", "island", "dcn"} if split else {"local", "dcn"})
