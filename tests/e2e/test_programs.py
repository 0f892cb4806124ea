"""Programs: many computations on many slices, submitted once, run as dataflow on the hosts."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import client as isthmus
from ir import InvalidArgument, RemoteError

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def local_jit(fn, n, axis, in_specs, out_specs):
    mesh = jax.make_mesh((n,), (axis,), devices=jax.devices()[:n])
    shard = lambda s: NamedSharding(mesh, s)  # noqa: E731
    ins = tuple(map(shard, in_specs)) if isinstance(in_specs, tuple) else shard(in_specs)
    return jax.jit(fn, in_shardings=ins, out_shardings=shard(out_specs))


def stage_fns():
    def f(x):
        return jnp.tanh(x) * 3.0

    def g(x):
        return x - jnp.sum(x) / x.size  # an all-reduce when x is sharded

    def h(x, y):
        return jnp.sin(x) * y

    return f, g, h


def test_three_computations_over_islands_a_and_b_equal_local_jit_bit_for_bit(c):
    sa, sb = c.slice({"x": 4}, island="a"), c.slice({"y": 2}, island="b")
    f, g, h = stage_fns()
    fi = c.jit(f, slice=sa, in_specs=P("x"), out_specs=P("x"))
    gi = c.jit(g, slice=sa, in_specs=P(), out_specs=P())  # a reshard inside island a
    hi = c.jit(h, slice=sb, in_specs=P("y"), out_specs=P("y"))  # a DCN move to island b

    @c.program
    def step(x):
        y = fi(x)
        return hi(gi(y), y)

    x = np.random.default_rng(0).standard_normal(16, dtype=np.float32)
    out = step(x)
    assert out.shape == (16,) and out.sharding.spec == P("y")
    lf = local_jit(f, 4, "x", P("x"), P("x"))
    lg = local_jit(g, 4, "x", P(), P())
    lh = local_jit(h, 2, "y", (P("y"), P("y")), P("y"))
    y = lf(x)
    want = lh(np.asarray(lg(np.asarray(y))), np.asarray(y))
    np.testing.assert_array_equal(out.numpy(), np.asarray(want))
    # The same program, dispatched node by node, gives the same bits.
    seq = c.program(step.fn, dispatch="sequential")
    np.testing.assert_array_equal(seq(x).numpy(), np.asarray(want))


def test_ir_size_does_not_depend_on_shard_count(c):
    f, _, h = stage_fns()
    stats = []
    for n in (1, 4):
        sa, sb = c.slice({"x": n}, island="a"), c.slice({"y": n}, island="b")
        fi = c.jit(f, slice=sa, in_specs=P("x"), out_specs=P("x"))
        hi = c.jit(h, slice=sb, in_specs=P("y"), out_specs=P("y"))
        prog = c.program(lambda x, fi=fi, hi=hi: hi(fi(x), fi(x)))
        out = prog(np.ones(8, np.float32))
        record = c.raw_json("GET", f"/v1/programs/{prog.traces[0].program_id}")
        stats.append((record["nodes"], record["edges"]))
        assert out.numpy().shape == (8,)
    assert stats[0] == stats[1]


def host_counters(c):
    rows = [h for isl in c.raw_json("GET", "/v1/islands") for h in isl["hosts"]]
    return {h["name"]: (h["requests"], h["dispatch_messages"]) for h in rows}


def test_a_128_node_run_is_one_submission_and_one_message_per_host(c):
    sa, sb = c.slice({"x": 1}, island="a"), c.slice({"x": 1}, island="b")
    inc = [c.jit(lambda v: v + 1.0, slice=s) for s in (sa, sb)]

    @c.program
    def chain(v):
        for k in range(64):  # 64 computes + 63 cross-island transfers + arg + result = 129 nodes
            v = inc[k % 2](v)
        return v

    x = c.put(np.zeros(4, np.float32), sa)
    first = chain(x).result()  # trace, register, compile; kept, so no release rides along
    program = chain.traces[0].program
    assert program.stats()["nodes"] >= 128
    hosts = set(sa.hosts) | set(sb.hosts)
    before, sent = host_counters(c), c.requests_sent
    out = chain(x)
    c.flush()  # the run leaves the client's queue (in the background or here)
    assert c.requests_sent - sent == 1  # the client made one submission
    out.result()
    after = host_counters(c)
    for h in hosts:
        assert after[h][1] - before[h][1] == 1, f"host {h}: dispatch messages"
        # and no more: the result's wait is answered from the host's answer to its message
        assert after[h][0] - before[h][0] == 1, f"host {h}: requests"
    np.testing.assert_array_equal(out.numpy(), np.full(4, 64.0, np.float32))
    np.testing.assert_array_equal(first.numpy(), out.numpy())


def test_twenty_concurrent_runs_from_four_clients_all_finish_correctly(connect):
    results: dict[tuple[int, int], np.ndarray] = {}
    errors: list[BaseException] = []

    def client_work(k: int) -> None:
        try:
            c = connect(f"tenant-{k}")
            sa, sb = c.slice({"x": 1}, island="a"), c.slice({"x": 1}, island="b")
            f = c.jit(lambda v: v * 2.0 + k, slice=sa)
            g = c.jit(lambda v: jnp.sum(v) + v, slice=sb)
            prog = c.program(lambda v: g(f(v)))
            outs = [prog(np.full(4, float(r), np.float32)) for r in range(5)]
            for r, o in enumerate(outs):
                results[(k, r)] = o.numpy()
        except BaseException as e:  # reported below, with the thread's traceback
            errors.append(e)

    threads = [threading.Thread(target=client_work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert not errors, errors
    assert len(results) == 20
    for (k, r), got in results.items():
        v = np.full(4, float(r), np.float32) * 2.0 + k
        np.testing.assert_array_equal(got, np.sum(v) + v)


def test_a_failure_inside_a_program_reaches_its_results_and_the_server_keeps_serving(c):
    from test_futures import MISSING_KERNEL, missing_kernel_artifact

    from ir import Aval, Conflict, ProgramBuilder, to_wire

    sa, sb = c.slice({"x": 1}, island="a"), c.slice({"x": 1}, island="b")
    g = c.jit(lambda v: v + 1.0, slice=sb)
    good = c.program(lambda v: g(v))
    # A program whose first computation no host can compile, feeding one on another island.
    b = ProgramBuilder()
    b.slice(sa.id, sa.mesh, sa.island)
    x = b.arg(Aval((4,), "float32"), (), sa.id)
    (y,) = b.compute("broken", missing_kernel_artifact(sa.abstract_mesh, (4,)), sa.id, [x],
                     [(Aval((4,), "float32"), ())])
    b.result(y)
    record = c.raw_json("POST", "/v1/programs", json={"program": to_wire(b.build())})
    buf = c.put(np.zeros(4, np.float32), sa)
    try:
        outs = c.raw_json("POST", "/v1/runs", json={"program_id": record["id"], "inputs": [buf.id]})
    except Conflict as e:  # compiling had already failed: the run is refused at once
        assert MISSING_KERNEL in str(e)
    else:
        with pytest.raises(RemoteError, match=MISSING_KERNEL):
            c.raw_json("GET", f"/v1/buffers/{outs['outputs'][0]['id']}", params={"wait": True})
    np.testing.assert_array_equal(good(np.zeros(2, np.float32)).numpy(), np.ones(2, np.float32))


def test_bad_programs_and_runs_are_4xx_naming_the_fault(c):
    s = c.slice({"x": 1})
    f = c.jit(lambda v: v + 1.0, slice=s)
    prog = c.program(lambda v: f(v))
    x = c.put(np.zeros(3, np.float32), s)
    prog(x).result()
    pid = prog.traces[0].program_id
    with pytest.raises(InvalidArgument, match="takes 1 inputs; got 2"):
        c.raw_json("POST", "/v1/runs", json={"program_id": pid, "inputs": [x.id, x.id]})
    y = c.put(np.zeros(4, np.float32), s)
    with pytest.raises(InvalidArgument, match=r"input 0 \(buffer .*\): expected float32\[3\]"):
        c.raw_json("POST", "/v1/runs", json={"program_id": pid, "inputs": [y.id]})
    with pytest.raises(InvalidArgument, match=r"\$.format"):
        c.raw_json("POST", "/v1/programs", json={"program": {"format": "nope"}})
    wire = __import__("ir").to_wire(prog.traces[0].program)
    wire["slices"][0]["name"] = "sl-000000000000"
    with pytest.raises(Exception, match="sl-000000000000"):
        c.raw_json("POST", "/v1/programs", json={"program": wire})
    np.testing.assert_array_equal(prog(x).numpy(), np.ones(3, np.float32))  # still serving


def test_array_operations_inside_a_program_are_refused_saying_where_they_go(c):
    """A program's Python code passes values between jitted functions; an operation on a
    value there (as on a jax tracer outside jit) names itself and what to do instead."""
    s = c.slice({"x": 1})
    f = c.jit(lambda v: v * 2, slice=s)
    x = np.arange(4, dtype=np.float32)
    for name, body in [
        (r"\+", lambda v: f(v) + 1),
        ("<", lambda v: isthmus.cond(f(v) < 3, f, f, v)),
        ("indexing", lambda v: f(v)[:2]),
        (r"\.sum", lambda v: f(v).sum()),
        ("truth value", lambda v: f(v) if f(v) else v),
        ("Traced.* is not a valid JAX type", lambda v: jnp.sin(f(v))),
        ("Traced.* is not a valid JAX type", lambda v: jax.lax.fori_loop(0, 2, lambda i, w: f(w), v)),
    ]:
        with pytest.raises(InvalidArgument, match=f"(?s){name}.*(i|I)nside @program has no data yet.*c.jit"):
            c.program(body)(x)
    shaped = c.program(lambda v: isthmus.fori_loop(0, len(v), lambda i, w: f(w), v))  # shapes are known
    np.testing.assert_array_equal(shaped(x).numpy(), x * 16)
    outer = c.program(lambda v: shaped(f(v)))  # a program calling a program: one program, inlined
    np.testing.assert_array_equal(outer(x).numpy(), x * 32)
    ops = [n.op.name for n in outer.trace(x).graph.nodes]
    assert ops.count("COMPUTE") == 1 and ops.count("WHILE") == 1  # its call of f, and shaped's loop


def test_fused_chains_match_local_jit_within_a_stated_tolerance(c):
    s = c.slice({"x": 4}, island="a")
    fns = [lambda v: jnp.tanh(v) * 1.5, lambda v: v - jnp.sum(v) / v.size, lambda v: jnp.sin(v) + v * v]
    stages = [c.jit(f, slice=s, in_specs=P("x"), out_specs=P("x")) for f in fns]

    def chain(v):
        for k in range(9):
            v = stages[k % 3](v)
        return v

    x = np.random.default_rng(1).standard_normal(32, dtype=np.float32)
    fused = c.program(chain, fuse=True)(x)
    plain = c.program(chain, fuse=False)(x)
    want = x
    for k in range(9):
        want = np.asarray(local_jit(fns[k % 3], 4, "x", P("x"), P("x"))(want))
    np.testing.assert_array_equal(plain.numpy(), want)
    # One executable: XLA optimizes across the stages, so an ulp or two may move.
    np.testing.assert_allclose(fused.numpy(), want, rtol=1e-5, atol=1e-6)


def test_back_to_back_runs_of_collective_programs_neither_hang_nor_drift(c):
    s = c.slice({"x": 4}, island="b")

    def step(v):
        return jax.shard_map(lambda a: a * 0.5 + jax.lax.psum(a, "x") * 0.125 + 1.0,
                             mesh=s.abstract_mesh, in_specs=P("x"), out_specs=P("x"))(v)

    f = c.jit(step, slice=s, in_specs=P("x"), out_specs=P("x"))

    @c.program
    def chain(v):
        for _ in range(32):
            v = f(v)
        return v

    x = c.put(np.zeros(4, np.float32), s, P("x"))
    outs = [chain(x) for _ in range(10)]  # submitted back to back: 320 all-reduces in flight
    want = np.zeros(4, np.float32)
    local = local_jit(step, 4, "x", P("x"), P("x"))
    for _ in range(32):
        want = np.asarray(local(want))
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), want)


def test_a_buffer_on_a_slice_no_computation_uses_is_moved_to_its_consumer(c):
    sa, sb = c.slice({"x": 2}, island="a"), c.slice({"x": 1}, island="b")
    g = c.jit(lambda v: v * 2.0, slice=sb)
    x = c.put(np.arange(4, dtype=np.float32), sa, P("x"))
    out = c.program(lambda v: g(v))(x)
    np.testing.assert_array_equal(out.numpy(), np.arange(4, dtype=np.float32) * 2)


def test_a_program_closing_over_a_buffer_deleted_since_names_it(c):
    s = c.slice({"x": 2})
    f = c.jit(lambda v, w: v * w, slice=s)
    w = c.put(np.arange(4, dtype=np.float32), s)
    scaled = c.program(lambda v: f(v, w))
    np.testing.assert_array_equal(scaled(np.ones(4, np.float32)).numpy(), np.arange(4))
    w.delete()
    with pytest.raises(isthmus.NotFound, match=f"buffer {w.id} .* has been deleted"):
        scaled(np.ones(4, np.float32))


def test_a_program_returns_constants_as_jax_jit_does(c):
    """Arrays and Python scalars among a program's results come back as buffers of their
    values (a Python scalar weakly typed), as `jax.jit` returns them; other objects are
    refused by name."""
    s = c.slice({"x": 2})
    f = c.jit(lambda v: v + 1, slice=s)

    def fn(x):
        return f(x), np.float32(3), 2.5, jnp.ones(2), None

    got = c.program(fn)(np.zeros(2, np.float32))
    want = jax.jit(lambda x: (x + 1, np.float32(3), 2.5, jnp.ones(2), None))(np.zeros(2, np.float32))
    assert got[4] is None
    for g, w in zip(got[:4], want[:4], strict=True):
        assert g.dtype == w.dtype and g.shown.weak == w.weak_type
        np.testing.assert_array_equal(g.numpy(), np.asarray(w))
    with pytest.raises(InvalidArgument, match=r"a result must come from a jitted function.*found str"):
        c.program(lambda x: (f(x), "s"))(np.zeros(2, np.float32))


def test_a_program_that_calls_no_jitted_function_returns_its_buffers(c):
    """As `jax.jit(lambda x, y: (y, x))` runs: its results are its inputs. With no buffer
    either, no slice is named for its values: refused saying so."""
    sa, sb = c.slice({"x": 2}, island="a"), c.slice({"y": 1}, island="b")
    x, y = c.put(np.arange(4, dtype=np.float32), sa, P("x")), c.put(np.int32(7), sb)
    swapped = c.program(lambda u, v: (v, u))(x, y)
    assert [b.dtype for b in swapped] == [np.int32, np.float32]
    assert int(swapped[0]) == 7 and swapped[1].numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
    both = c.program(lambda u, k: (u, k, 1.5))(x, np.int32(3))  # a constant and an array: on x's slice
    assert both[0].numpy().tolist() == [0.0, 1.0, 2.0, 3.0] and int(both[1]) == 3 and float(both[2]) == 1.5
    with pytest.raises(InvalidArgument, match="calls no jitted function and reads no buffer"):
        c.program(lambda u: u)(np.zeros(2, np.float32))


def test_a_registration_is_answered_once_its_hosts_have_compiled_it(c):
    """A call or run sent before the compiler is done would hold each of its hosts, every
    client's work queued there behind it: computations and programs are answered once
    compiled, as jax.jit compiles on its first call."""
    s = c.slice({"x": 2})
    f = c.jit(lambda v: jnp.tanh(v) @ jnp.tanh(v).T, slice=s)
    g = c.jit(lambda v: v * 3.0, slice=s)
    x = np.ones((4, 4), np.float32)
    y = f(x)  # registered, then queued
    [cid] = f.registrations
    assert c.raw_json("GET", f"/v1/computations/{cid}")["status"] == "ready"
    run = c.program(lambda v: g(f(v)))
    out = run(y)
    [traced] = run.traces
    assert c.raw_json("GET", f"/v1/programs/{traced.program_id}")["status"] == "ready"
    np.testing.assert_allclose(out.numpy(), np.asarray(jax.jit(lambda v: (jnp.tanh(v) @ jnp.tanh(v).T) * 3.0)(
        jax.jit(lambda v: jnp.tanh(v) @ jnp.tanh(v).T)(x))), rtol=1e-6)
