"""The program tracer, without a server: jitted calls become one typed IR program."""

import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from client.arrays import PLAIN
from client.connection import Slice
from client.jit import Function
from client.trace import Trace, tracing
from ir import Aval, InvalidArgument, Op, verify

pytestmark = pytest.mark.unit


def make_slice(sid: str, mesh: dict[str, int], island: str) -> Slice:
    return Slice(None, {"id": sid, "mesh": mesh, "island": island, "hosts": [], "device_ids": [],
                        "platform": "cpu"})


def trace(fn, *args):
    t = Trace()
    traced = [t.argument(*((a,) if not isinstance(a, tuple) else a)) for a in args]
    with tracing(t):
        out = fn(*traced)
    return t.finish(out if isinstance(out, tuple) else (out,))


def three_stage(n: int):
    """f on island a, g on island a with another spec, h on island b."""
    sa, sb = make_slice("sa", {"x": n}, "a"), make_slice("sb", {"y": n}, "b")
    f = Function(None, lambda x: jnp.tanh(x) * 2, sa, in_specs=P("x"), out_specs=P("x"))
    g = Function(None, lambda x: x + 1, sa, in_specs=P(), out_specs=P())
    h = Function(None, lambda x, y: x * y, sb, in_specs=P("y"), out_specs=P("y"))

    def program(x):
        y = f(x)
        return h(g(y), y)

    return trace(program, (np.ones(8, np.float32), PLAIN))


def test_calls_become_computes_with_transfers_where_slice_or_spec_change():
    program, arg_types = three_stage(4)
    verify(program)
    ops = [n.op for n in program.nodes]
    assert ops == [Op.ARG, Op.COMPUTE, Op.TRANSFER, Op.COMPUTE, Op.TRANSFER, Op.TRANSFER, Op.COMPUTE,
                   Op.RESULT]
    # The argument is placed where its first consumer (f) wants it.
    assert (arg_types[0].slice, arg_types[0].spec.to_json()) == ("sa", ["x"])
    transfers = [n.attrs.type for n in program.nodes if n.op is Op.TRANSFER]
    assert [(t.slice, t.spec.to_json()) for t in transfers] == [("sa", []), ("sb", ["y"]), ("sb", ["y"])]


def test_one_node_per_computation_whatever_the_shard_count():
    one, _ = three_stage(1)
    four, _ = three_stage(4)
    assert one.stats() == four.stats()


def test_a_value_moved_twice_to_the_same_place_moves_once():
    s = make_slice("s", {"x": 2}, "a")
    t = make_slice("t", {"x": 2}, "b")
    f = Function(None, lambda x: x * 2, s, P("x"), P("x"))
    g = Function(None, lambda x, y: x + y, t, P("x"), P("x"))
    program, _ = trace(lambda x: g(f(x), f(x)), (np.ones(4, np.float32), PLAIN))
    assert sum(n.op is Op.TRANSFER for n in program.nodes) == 2  # two f's, one move each
    program, _ = trace(lambda x: (lambda y: g(y, y))(f(x)), (np.ones(4, np.float32), PLAIN))
    assert sum(n.op is Op.TRANSFER for n in program.nodes) == 1


def test_closed_over_constants_become_bound_arguments():
    s = make_slice("s", {"x": 1}, "a")
    add = Function(None, lambda x, c: x + c, s)
    bias = np.full(3, 2.0, np.float32)
    t = Trace()
    x = t.argument(np.zeros(3, np.float32), PLAIN)
    with tracing(t):
        out = add(x, bias)
    program, types = t.finish([out])
    assert len(program.graph.args) == 2 and len(types) == 2
    assert t.bound[0] is bias


def test_results_come_from_the_program_or_are_arrays():
    s = make_slice("s", {"x": 1}, "a")
    f = Function(None, lambda x: x, s)
    program, types = trace(lambda x: (f(x), np.zeros(3)), (np.zeros(2, np.float32), PLAIN))
    assert len(program.graph.args) == 2 and types[1].aval == Aval((3,), "float32")  # sent with the run
    with pytest.raises(InvalidArgument, match=r"a result must come from a jitted function.*found object"):
        trace(lambda x: (f(x), object()), (np.zeros(2, np.float32), PLAIN))
    with pytest.raises(InvalidArgument, match="calls no jitted function and reads no buffer"):
        trace(lambda x: x, (np.zeros(2, np.float32), PLAIN))


def test_comparing_traced_values_is_refused_but_they_stay_usable_as_keys():
    sa = make_slice("sa", {"x": 1}, "a")
    f = Function(None, lambda x: x * 2, sa)
    for body, name in [(lambda x: f(x) == 3, "=="), (lambda x: f(x) != f(x), "!=")]:
        with pytest.raises(InvalidArgument, match=f"{name} on Traced.*no data yet"):
            trace(body, (np.ones(4, np.float32), PLAIN))

    def keyed(x):
        y = f(x)
        assert {y: 1}[y] == 1 and y in [y]  # (by identity)
        return y

    program, _ = trace(keyed, (np.ones(4, np.float32), PLAIN))
    assert [n.op for n in program.nodes].count(Op.COMPUTE) == 1


def test_a_float0_argument_is_made_inside_the_export_not_sent():
    """An integer input's gradient (float0, no data) fed to another jitted function: as
    `jax.jit` takes it. It is no input of the computation; the export makes it."""
    import jax

    s = make_slice("s", {"x": 1}, "a")
    grads = jax.grad(lambda v, n: (v * n).sum(), argnums=(0, 1), allow_int=True)
    g = Function(None, grads, s)
    h = Function(None, lambda gr: gr[0] * 2 + gr[1].size, s)

    program, _ = trace(lambda v: h(g(v, np.int32(3))), Aval((4,), "float32"))
    verify(program)
    computes = [n for n in program.nodes if n.op is Op.COMPUTE]
    assert [len(n.inputs) for n in computes] == [2, 1]  # g reads v and n; h only g's data leaf

    [exported] = h.exports  # the one signature the trace exported
    assert len(exported.in_specs) == 1
    run = jax.export.deserialize(bytearray(exported.artifact))
    v = np.arange(4, dtype=np.float32)
    want = jax.jit(lambda gr: gr[0] * 2 + gr[1].size)((v, np.zeros((), jax.dtypes.float0)))
    np.testing.assert_array_equal(np.asarray(run.call(v)[0]), np.asarray(want))
