import dataclasses

import pytest

from ir import (
    Artifact,
    Aval,
    Graph,
    InvalidArgument,
    MeshAxes,
    Node,
    Op,
    Program,
    ProgramBuilder,
    ResultAttrs,
    SliceDef,
    content_hash,
)

pytestmark = pytest.mark.unit


def chain(mesh: dict[str, int]) -> Program:
    """A -> B on one slice of the given mesh."""
    b = ProgramBuilder()
    s = b.slice("s0", mesh)
    axis = next(iter(mesh))
    x = b.arg(Aval((8, 8), "float32"), (axis, None), s)
    (a,) = b.compute("A", b"A", s, [x], [(Aval((8, 8), "float32"), (axis, None))])
    (y,) = b.compute("B", b"B", s, [a], [(Aval((8, 8), "float32"), (None, axis))])
    b.result(y)
    return b.build()


def test_one_node_per_computation_whatever_the_shard_count():
    one, four = chain({"x": 1}), chain({"x": 4})
    assert one.stats() == four.stats() == {"nodes": 4, "edges": 3}
    assert one.slice_table["s0"].mesh.size == 1 and four.slice_table["s0"].mesh.size == 4


def test_example_shape(example):
    assert [n.op for n in example.nodes] == [Op.ARG, Op.ARG, Op.COMPUTE, Op.COMPUTE, Op.TRANSFER, Op.COMPUTE,
                                            Op.RESULT]
    assert example.results == ("%5",)
    assert example.graph.args == ("%0", "%1")
    assert len(example.artifacts) == 3
    assert example.stats() == {"nodes": 7, "edges": 6}


def test_stats_count_sub_graphs(control_flow):
    assert control_flow.stats()["nodes"] > len(control_flow.nodes)


def test_values_are_frozen_and_change_by_replace(example):
    with pytest.raises(dataclasses.FrozenInstanceError):
        example.nodes[0].op = Op.RESULT  # type: ignore[misc]
    renamed = dataclasses.replace(example.nodes[2], outputs=("%x",))
    assert renamed.outputs == ("%x",) and example.nodes[2].outputs == ("%2",)


def test_artifact_is_content_addressed():
    art = Artifact.of(b"bytes", {"platform": "cpu"})
    assert art.hash == content_hash(b"bytes") and art.hash.startswith("sha256:")
    with pytest.raises(InvalidArgument, match="expected hash"):
        Artifact(content_hash(b"other"), b"bytes")


def test_artifact_table_order_does_not_matter(example):
    flipped = dataclasses.replace(example, artifacts=tuple(reversed(example.artifacts)))
    assert flipped == example


def test_node_checks_its_attributes():
    with pytest.raises(InvalidArgument, match="expected attributes ArgAttrs"):
        Node(Op.ARG, (), ("%0",), ResultAttrs())
    with pytest.raises(InvalidArgument, match="name matching"):
        Node(Op.RESULT, ("x",), (), ResultAttrs())


def test_graph_needs_exactly_one_result_last(example):
    with pytest.raises(InvalidArgument, match="exactly one result node, last"):
        Graph(example.nodes[:-1])
    with pytest.raises(InvalidArgument, match="exactly one result node, last"):
        Graph((example.nodes[-1], *example.nodes))


def test_program_tables_are_checked(example):
    dup = SliceDef("s0", MeshAxes.of({"x": 2}))
    with pytest.raises(InvalidArgument, match="distinct slice names"):
        dataclasses.replace(example, slices=(*example.slices, dup))
    with pytest.raises(InvalidArgument, match="version"):
        dataclasses.replace(example, version=2)


def test_builder_rejects_an_ill_typed_node():
    b = ProgramBuilder()
    s0, s1 = b.slice("s0", {"x": 2}), b.slice("s1", {"y": 2})
    x = b.arg(Aval((4,), "float32"), ("x",), s0)
    with pytest.raises(InvalidArgument, match=r"compute f .*operand 0 \(%0\) of f: expected .* @s1"):
        b.compute("f", b"f", s1, [x], [(Aval((4,), "float32"), ())], ins=[(Aval((4,), "float32"), ("y",))])
    with pytest.raises(InvalidArgument, match="slice s0: expected"):
        b.slice("s0", {"x": 4})
