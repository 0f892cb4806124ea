import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from client.arrays import PLAIN, WEAK, View, call_specs
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


def test_named_shardings_count_by_their_spec_as_in_jax_jit():
    mesh = jax.sharding.AbstractMesh((2, 2), ("x", "y"))
    tree = ({"w": np.zeros(2), "b": np.zeros(2)}, np.zeros(3))
    named = jax.sharding.NamedSharding(mesh, P("x", "y"))
    assert leaf_specs(named, tree, "in_specs") == [Spec.of(("x", "y"))] * 3
    specs = leaf_specs(({"w": named, "b": None}, jax.sharding.NamedSharding(mesh, P())), tree, "in_specs")
    assert specs == [Spec(()), Spec.of(("x", "y")), Spec(())]


def test_mismatched_prefix_is_a_clear_error():
    with pytest.raises(InvalidArgument, match="in_specs: not a prefix"):
        leaf_specs((P(), P(), P()), (np.zeros(1), np.zeros(1)), "in_specs")


def test_as_array_canonicalizes_and_marks_python_scalars_weak():
    a, view = as_array(1.5)
    assert a.dtype == np.float32 and view == WEAK
    a, view = as_array(np.float64(1.5))
    assert a.dtype == np.float32 and view == PLAIN
    a, view = as_array(True)
    assert a.dtype == np.bool_ and view == PLAIN
    a, view = as_array(np.arange(3, dtype=np.int64))
    assert a.dtype == np.int32


def test_typed_keys_travel_as_their_key_data():
    keys = jax.random.split(jax.random.key(7), 3)
    a, view = as_array(keys)
    assert view == View(key="threefry2x32") and a.dtype == np.uint32 and a.shape == (3, 2)
    np.testing.assert_array_equal(a, jax.random.key_data(keys))
    a, view = as_array(jax.random.key(1, impl="rbg"))
    assert view.key == "rbg" and a.shape == (4,)
    a, view = as_array(jax.random.PRNGKey(0))  # a raw key is plain uint32 data, as in JAX
    assert view == PLAIN and a.shape == (2,)


def test_positional_specs_leave_keyword_arguments_replicated():
    args, kwargs = (np.zeros(4), np.zeros(4)), {"bias": np.zeros(4)}
    assert call_specs((P("x"), None), args, kwargs) == [Spec.of(("x",)), Spec(()), Spec(())]
    assert call_specs(P("x"), args, kwargs) == [Spec.of(("x",))] * 3


@pytest.mark.parametrize("bad", ["x", "xy", 3, ("x", None)])
def test_what_is_no_partition_spec_is_refused_as_jax_jit_refuses_it(bad):
    """A bare axis name once read as P('x'), and 'xy' as P('x', 'y'), character by character."""
    with pytest.raises(InvalidArgument, match=r"in_specs: expected a PartitionSpec, a NamedSharding or None"):
        leaf_specs(bad, (np.zeros(4), np.zeros(4)), "in_specs")


def test_python_ints_past_the_canonical_range_overflow_as_in_jax_jit():
    assert as_array(2**31 - 1)[0] == 2**31 - 1
    for n in (2**31, -2**31 - 1, 2**70):
        with pytest.raises(OverflowError, match=f"Python int {n} too large to convert to int32"):
            as_array(n)


def test_an_artifact_past_the_server_s_body_limit_says_to_pass_closed_over_arrays_as_arguments():
    import jax.numpy as jnp
    from test_trace import make_slice

    from client.jit import Function

    class Refusing:  # a session whose server answers 413 for a body past its max_json_mb
        deleted_slices: dict[str, None] = {}

        def register(self, path, body):
            raise InvalidArgument("POST /v1/computations: body: larger than the 64 MiB limit of "
                                  "/v1/computations")

        def let_go(self, kind, record_ids):
            pass

    table = np.arange(1000, dtype=np.float32)
    f = Function(Refusing(), lambda i: jnp.asarray(table)[i], make_slice("s", {"x": 1}, "a"))
    with pytest.raises(InvalidArgument, match=r"its exported program is \d+ bytes, past what the server "
                                              r"takes \(.*64 MiB.*\)\. Arrays the function closes over"):
        f(np.int32(1))  # exported, then registered on its first call
    assert len(f.exports) == 1 and f.registrations == ()


def test_a_leaf_that_is_no_array_is_named_and_told_to_be_static():
    from client.arrays import leaf_array

    tree = ((np.ones(2), {"mode": "train"}), {"scale": object()})
    said = (r"^f: argument args\[1\]\['mode'\] is a str \('train'\), not an array: "
            r".*static_argnums=.*static_argnames")
    with pytest.raises(InvalidArgument, match=said):
        leaf_array("train", tree, 1, "f")
    with pytest.raises(InvalidArgument, match=r"^f: argument kwargs\['scale'\] is a object"):
        leaf_array(tree[1]["scale"], tree, 2, "f")
    with pytest.raises(InvalidArgument, match=r"float0 array .* holds no data"):
        as_array(np.zeros(3, jax.dtypes.float0))
    assert leaf_array(np.ones(2), tree, 0, "f")[0].dtype == np.float32
    for narrow in (jax.numpy.bfloat16, jax.numpy.float8_e4m3fn):  # numpy's kind V, as float0's
        assert as_array(np.ones(2, narrow))[0].dtype == narrow
