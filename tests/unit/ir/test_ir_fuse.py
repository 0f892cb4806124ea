"""The fuse pass: adjacent computations on one slice become one, with a self-contained artifact."""

import pytest
from ir_placed import EXAMPLE_PLACEMENTS, RING_PLACEMENTS, build_ring

from ir import Aval, Op, ProgramBuilder, content_hash, print_program
from ir.fused import Call, decode_fused
from ir.passes import fuse_pass, host_plans, lower

pytestmark = pytest.mark.unit


def test_adjacent_computations_on_one_slice_fuse(example):
    lowered = lower(example, EXAMPLE_PLACEMENTS, check=True, fuse=True)
    fused = lowered.nodes[2]
    layer, norm = content_hash(b"layer"), content_hash(b"norm")
    assert print_program(lowered).splitlines()[5] == (
        f"%3 = compute fused.2.layer {fused.attrs.artifact} @s0 (%1: float32[4,8] P('data', None), "
        "%0: float32[8,16] P(None, 'model')) -> (float32[4,16] P('data', None))"
    )
    spec = decode_fused(lowered.artifact_table[fused.attrs.artifact].data)
    assert spec.parts == (b"layer", b"norm")
    assert spec.calls == (Call(0, (("in", 0), ("in", 1))), Call(1, (("out", 0, 0),)))
    assert spec.outputs == (("out", 1, 0),)
    assert {layer, norm} <= set(lowered.artifact_table)
    [a0] = [p for h, p in host_plans(lowered).items() if h == "a0"]
    assert [type(s).__name__ for s in a0.steps] == ["Compute", "Send"]
    assert [j.artifact for j in a0.compiles] == [fused.attrs.artifact]


def test_values_read_later_stay_outputs_and_repeated_artifacts_are_stored_once():
    b = ProgramBuilder()
    s = b.slice("s", {"x": 1})
    v = Aval((4,), "float32")
    x = b.arg(v, (), s)
    (y,) = b.compute("inc", b"inc", s, [x], [(v, ())])
    (z,) = b.compute("inc", b"inc", s, [y], [(v, ())])
    (w,) = b.compute("inc", b"inc", s, [z], [(v, ())])
    b.result(w, y)
    program = fuse_pass(b.build())
    [fused] = [n for n in program.nodes if n.op is Op.COMPUTE]
    assert fused.inputs == (x,) and fused.outputs == (y, w)
    spec = decode_fused(program.artifact_table[fused.attrs.artifact].data)
    assert spec.parts == (b"inc",) and len(spec.calls) == 3
    assert spec.outputs == (("out", 0, 0), ("out", 2, 0))


def test_computations_on_other_hosts_never_fuse():
    lowered = lower(build_ring(16), RING_PLACEMENTS, check=True, fuse=True)
    assert lowered == lower(build_ring(16), RING_PLACEMENTS, check=True)


def test_plain_artifacts_are_not_fused_ones():
    assert decode_fused(b"\x14\x00\x00\x00flatbuffer") is None
