import numpy as np
import pytest

from ir import Aval, InvalidArgument, MeshAxes, Spec, dtype_name

pytestmark = pytest.mark.unit


def test_aval_nbytes_and_text():
    a = Aval((4, 8), "float32")
    assert a.nbytes == 128
    assert str(a) == "float32[4,8]"
    assert Aval.from_json(a.to_json()) == a


@pytest.mark.parametrize("shape", [(-1,), (2.0,), ("3",)])
def test_aval_rejects_bad_shapes(shape):
    with pytest.raises(InvalidArgument, match="shape"):
        Aval(shape, "float32")


def test_aval_rejects_unknown_dtype():
    with pytest.raises(InvalidArgument, match="unknown dtype 'float8'"):
        Aval((1,), "float8")


def test_dtype_name_refuses_object():
    assert dtype_name(np.float32) == "float32"
    with pytest.raises(InvalidArgument, match="not supported"):
        dtype_name(object)


def test_mesh_axes_validation():
    m = MeshAxes.of({"data": 2, "model": 2})
    assert m.size == 4 and m.names == ("data", "model")
    with pytest.raises(InvalidArgument, match="at least one axis"):
        MeshAxes.of({})
    with pytest.raises(InvalidArgument, match="axis 'x' has size 0"):
        MeshAxes.of({"x": 0})
    with pytest.raises(InvalidArgument, match="identifier"):
        MeshAxes.of({"a b": 2})


def test_spec_json_round_trip():
    s = Spec.of((None, ("data", "model"), "x"))
    assert Spec.from_json(s.to_json()) == s
    assert Spec.from_json(None) == Spec(())


def test_spec_check_messages():
    mesh = MeshAxes.of({"data": 2, "model": 2})
    Spec.of(("data", None)).check(Aval((4, 3), "float32"), mesh, "x")
    with pytest.raises(InvalidArgument, match="rank 1"):
        Spec.of(("data", None)).check(Aval((4,), "float32"), mesh, "x")
    with pytest.raises(InvalidArgument, match="names axis 'y'"):
        Spec.of(("y",)).check(Aval((4,), "float32"), mesh, "x")
    with pytest.raises(InvalidArgument, match=r"size 3 .* 2 shards"):
        Spec.of(("data",)).check(Aval((3,), "float32"), mesh, "x")
    with pytest.raises(InvalidArgument, match="twice"):
        Spec.of(("data", "data")).check(Aval((4, 4), "float32"), mesh, "x")


def test_spec_from_json_rejects_non_lists():
    with pytest.raises(InvalidArgument, match="expected a list"):
        Spec.from_json("data")
    with pytest.raises(InvalidArgument, match=r"spec\[0\]: expected null, an axis name or a list"):
        Spec.from_json([3])


def test_hostile_specs_meshes_and_shapes_fail_by_name():
    deep: list = []
    for _ in range(100_000):  # deeper than the interpreter's recursion limit
        deep = [deep]
    with pytest.raises(InvalidArgument, match=r"in_specs\[0\]\[0\]: expected null, an axis name"):
        Spec.from_json(deep, "in_specs[0]")
    with pytest.raises(InvalidArgument, match="65 entries; at most 64"):
        Spec.from_json([None] * 65)
    with pytest.raises(InvalidArgument, match="10000 axes; at most 16"):
        MeshAxes.of({f"a{i}": 1 for i in range(10_000)})
    with pytest.raises(InvalidArgument, match="at most 64 characters"):
        MeshAxes.of({"x" * 100: 2})
    with pytest.raises(InvalidArgument, match="rank 65; at most 64"):
        Aval((1,) * 65, "float32")
    with pytest.raises(InvalidArgument, match="ints in"):
        Aval((1 << 70,), "float32")


def test_an_empty_shape_whose_dims_span_too_much_is_refused_by_name():
    with pytest.raises(InvalidArgument, match=r"shape \(4611686018427387904, 0\) of float32: its dim"):
        Aval((2**62, 0), "float32")
    assert Aval((2**40, 0), "float32").nbytes == 0 and Aval((0,) * 8, "float64").nbytes == 0
