import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from client.jit import as_array, leaf_specs
from ir import InvalidArgument, Spec

pytestmark = pytest.mark.unit


def test_one_spec_applies_to_every_leaf():
    tree = ({"w": np.zeros(2), "b": np.zeros(2)}, np.zeros(3))
    assert leaf_specs(P("x"), tree, "in_specs") == [Spec.of(("x",))] * 3
    assert leaf_specs(None, tree, "in_specs") == [Spec(())] * 3


def test_prefix_specs_follow_the_tree():
    tree = ({"w": np.zeros(2), "b": np.zeros(2)}, np.zeros(3))
    specs = leaf_specs((P("x"), None), tree, "in_specs")
    assert specs == [Spec.of(("x",)), Spec.of(("x",)), Spec(())]
    specs = leaf_specs(({"w": P(), "b": P("y")}, P("z")), tree, "in_specs")
    assert specs == [Spec.of(("y",)), Spec(()), Spec.of(("z",))]  # dict leaves in key order


def test_mismatched_prefix_is_a_clear_error():
    with pytest.raises(InvalidArgument, match="in_specs: not a prefix"):
        leaf_specs((P(), P(), P()), (np.zeros(1), np.zeros(1)), "in_specs")


def test_as_array_canonicalizes_and_marks_python_scalars_weak():
    a, weak = as_array(1.5)
    assert a.dtype == np.float32 and weak
    a, weak = as_array(np.float64(1.5))
    assert a.dtype == np.float32 and not weak
    a, weak = as_array(True)
    assert a.dtype == np.bool_ and not weak
    a, weak = as_array(np.arange(3, dtype=np.int64))
    assert a.dtype == np.int32
