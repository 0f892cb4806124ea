"""In-graph control flow through the server: `while_loop`, `cond` and `fori_loop` inside
`@c.program`, run on the hosts with no round trip per iteration, equal to a local oracle
(`jax.lax` or a Python loop over `jax.jit`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hosts_settled import host_rows
from jax.sharding import PartitionSpec as P

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

X0 = np.linspace(-1.0, 1.0, 8, dtype=np.float32)


def scale(v):
    return v * 1.5 + 0.25


def shift(v):
    return jnp.sin(v) - 0.5


@pytest.fixture
def fns(c):
    return islands(c)


def islands(c):
    """Small computations on island a (`sa`) and island b (`sb`), and their local twins."""
    sa, sb = c.slice({"x": 2}, island="a"), c.slice({"y": 2}, island="b")
    return {
        "sa": sa, "sb": sb,
        "f": c.jit(scale, slice=sa, in_specs=P("x"), out_specs=P("x")),
        "g": c.jit(shift, slice=sb, in_specs=P("y"), out_specs=P("y")),
        "lt": c.jit(lambda i, n: i < n, slice=sa),
        "inc": c.jit(lambda i: i + 1, slice=sa),
        "even": c.jit(lambda i: i % 2 == 0, slice=sa),
        "lf": jax.jit(scale), "lg": jax.jit(shift),
    }


def assert_no_state_left(c):
    for name, h in host_rows(c).items():
        assert (h["runs"], h["frames"], h["mailboxes"]) == (0, 0, 0), (name, h)


def test_a_zero_trip_loop_returns_its_carry(c, fns):
    f, lt, inc = fns["f"], fns["lt"], fns["inc"]

    @c.program
    def loop(x, n):
        i, y = isthmus.while_loop(lambda s: lt(s[0], n), lambda s: (inc(s[0]), f(s[1])), (inc(n), f(x)))
        return i, y

    i, y = loop(X0, np.int32(0))
    want = jax.lax.while_loop(lambda s: s[0] < 0, lambda s: (s[0] + 1, fns["lf"](s[1])),
                              (jnp.int32(1), fns["lf"](X0)))
    assert int(i.numpy()) == int(want[0]) == 1
    np.testing.assert_array_equal(y.numpy(), np.asarray(want[1]))


def collatz_next(n):
    return jnp.where(n % 2 == 0, n // 2, 3 * n + 1)


def test_a_data_dependent_trip_count_collatz(c, fns):
    sa = fns["sa"]
    step = c.jit(collatz_next, slice=sa)
    not_one = c.jit(lambda n: n != 1, slice=sa)
    inc = fns["inc"]

    @c.program
    def collatz(n, zero):
        return isthmus.while_loop(lambda s: not_one(s[0]), lambda s: (step(s[0]), inc(s[1])), (inc(n), zero))

    def steps(n):
        k = 0
        while n != 1:
            n, k = (n // 2 if n % 2 == 0 else 3 * n + 1), k + 1
        return k

    zero = c.put(np.int32(0), sa)
    for start in (1, 6, 27, 97):
        _, k = collatz(c.put(np.int32(start - 1), sa), zero)
        assert int(k.numpy()) == steps(start), start


def test_a_loop_whose_body_spans_islands_a_and_b(c, fns):
    f, g, lt, inc = fns["f"], fns["g"], fns["lt"], fns["inc"]

    @c.program
    def loop(x, n):
        zero = c.put(np.int32(0), fns["sa"])
        return isthmus.while_loop(lambda s: lt(s[0], n), lambda s: (inc(s[0]), g(f(s[1]))), (zero, f(x)))[1]

    out = loop(X0, np.int32(5))
    want = fns["lf"](X0)
    for _ in range(5):
        want = fns["lg"](fns["lf"](want))
    np.testing.assert_array_equal(out.numpy(), np.asarray(want))
    assert_no_state_left(c)
    # The lowered per-host graphs show each host's state machine: the five primitives, and
    # the predicate island a sends island b each iteration.
    program_id = loop.traces[0].program_id
    shown = c.raw_json("GET", f"/v1/programs/{program_id}/text")
    assert "while" in shown["text"] and "send" in shown["lowered"]
    texts = {p["host"]: "\n".join(p["text"]) for p in shown["plans"]}
    (on_b,) = [t for h, t in texts.items() if h in fns["sb"].hosts]
    for primitive in ("enter", "merge", "switch", "next_iteration", "exit", "recv"):
        assert all(primitive in t for t in texts.values()), primitive
    assert "tag p." in on_b


def test_cond_inside_while_chooses_between_islands(c, fns):
    f, g, lt, inc, even = fns["f"], fns["g"], fns["lt"], fns["inc"], fns["even"]

    @c.program
    def loop(x, zero, n):
        def body(s):
            i, v = s
            return inc(i), isthmus.cond(even(i), g, f, v)  # even: island b, odd: island a
        return isthmus.while_loop(lambda s: lt(s[0], n), body, (zero, f(x)))[1]

    sa = fns["sa"]
    out = loop(X0, c.put(np.int32(0), sa), c.put(np.int32(7), sa))
    want = fns["lf"](X0)
    for i in range(7):
        want = fns["lg"](want) if i % 2 == 0 else fns["lf"](want)
    np.testing.assert_array_equal(out.numpy(), np.asarray(want))
    assert_no_state_left(c)


def test_one_operand_passed_twice_to_a_cond_goes_where_each_use_wants_it(c, fns):
    f, g, lf, lg = fns["f"], fns["g"], fns["lf"], fns["lg"]
    spread = c.jit(lambda v: v - v.mean(), slice=fns["sa"])  # island a, replicated

    @c.program
    def both(x, pr):  # x's two uses: P("x") on island a, P("y") on island b, P() on island a
        return isthmus.cond(pr, lambda u, w, d: (f(u), g(w), spread(d["v"])), lambda u, w, d: (u, w, d["v"]),
                            x, x, {"v": x})

    for pr in (True, False):
        got = both(X0, np.bool_(pr))
        want = jax.lax.cond(pr, lambda u, w, d: (lf(u), lg(w), d["v"] - d["v"].mean()),
                            lambda u, w, d: (u, w, d["v"]), X0, X0, {"v": X0})
        for o, w in zip(got, want, strict=True):
            np.testing.assert_allclose(o.numpy(), np.asarray(w), rtol=1e-6)


def test_while_inside_cond_the_untaken_branch_hosts_finish(c, fns):
    f, g, lt, inc = fns["f"], fns["g"], fns["lt"], fns["inc"]
    positive = c.jit(lambda v: v[0] > 0, slice=fns["sa"], in_specs=P("x"))
    zero = c.put(np.int32(0), fns["sa"])

    @c.program
    def choose(x, n):
        y = f(x)
        looped = lambda v: isthmus.while_loop(lambda s: lt(s[0], n), lambda s: (inc(s[0]), g(s[1])),  # noqa: E731
                                              (zero, g(v)))[1]
        return isthmus.cond(positive(y), looped, f, y)

    for x in (X0, -X0):
        out = choose(x, np.int32(3))
        y = fns["lf"](x)
        if y[0] > 0:
            want = fns["lg"](y)
            for _ in range(3):
                want = fns["lg"](want)
        else:
            want = fns["lf"](y)
        np.testing.assert_array_equal(out.numpy(), np.asarray(want))
        assert_no_state_left(c)


def test_nested_while_whose_inner_bound_is_the_outer_counter(c, fns):
    f = fns["f"]

    @c.program
    def nested(x):
        return isthmus.fori_loop(0, 4, lambda i, v: isthmus.fori_loop(0, i, lambda j, w: f(w), v), f(x))

    out = nested(X0)
    want = fns["lf"](X0)
    for i in range(4):
        for _ in range(i):
            want = fns["lf"](want)
    np.testing.assert_array_equal(out.numpy(), np.asarray(want))


def test_a_loop_invariant_captured_from_outside(c, fns):
    sa, sb = fns["sa"], fns["sb"]
    add = c.jit(lambda v, w: v + w, slice=sa, in_specs=P("x"), out_specs=P("x"))
    w = c.put(np.arange(8, dtype=np.float32), sb, P("y"))  # on island b: moved to a once

    @c.program
    def loop(x):
        return isthmus.fori_loop(0, 6, lambda i, v: add(v, w), fns["f"](x))

    out = loop(X0)
    want = fns["lf"](X0)
    for _ in range(6):
        want = want + np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(out.numpy(), np.asarray(want))
    assert_no_state_left(c)


def test_a_loop_carrying_a_pytree_and_fori_loop(c, fns):
    f, g = fns["f"], fns["g"]
    to_b = c.jit(lambda v: v, slice=fns["sb"], in_specs=P("y"), out_specs=P("y"))

    @c.program
    def loop(x):
        init = {"a": f(x), "pair": (to_b(x), fns["inc"](c.put(np.int32(0), fns["sa"])))}
        body = lambda i, s: {"a": f(s["a"]), "pair": (g(s["pair"][0]), fns["inc"](i))}  # noqa: E731
        return isthmus.fori_loop(2, 7, body, init)

    out = loop(X0)
    a, b = fns["lf"](X0), X0
    for _ in range(2, 7):
        a, b = fns["lf"](a), fns["lg"](b)
    np.testing.assert_array_equal(out["a"].numpy(), np.asarray(a))
    np.testing.assert_array_equal(out["pair"][0].numpy(), np.asarray(b))
    assert int(out["pair"][1].numpy()) == 7


def test_raw_arguments_and_numeric_predicates_as_jax_lax_takes_them(c, fns):
    """`fori_loop` and `cond` on program arguments no jitted function has read yet, a carry
    leaf only carried along, and predicates that are numbers (true when not 0), constants or
    arguments: each equal to `jax.lax`'s."""
    f, g, lf, lg = fns["f"], fns["g"], fns["lf"], fns["lg"]
    minus_one = c.jit(lambda v: jnp.int32(-1), slice=fns["sa"])
    key = np.array([3, 4], np.uint32)

    fori = c.program(lambda x, k: isthmus.fori_loop(0, 4, lambda i, s: (s[0], f(s[1])), (k, x)))
    k_out, y = fori(X0, key)
    np.testing.assert_array_equal(k_out.numpy(), key)
    np.testing.assert_array_equal(y.numpy(), jax.lax.fori_loop(0, 4, lambda i, v: lf(v), X0))

    pick = c.program(lambda x, p: isthmus.cond(p, f, g, x))
    for p in (np.bool_(True), np.bool_(False), np.int32(-3), np.int32(0), np.float32(0.5)):
        want = jax.lax.cond(p, lf, lg, X0)
        np.testing.assert_allclose(pick(X0, p).numpy(), want, rtol=1e-6, err_msg=f"pred {p!r}")
    negative = c.program(lambda x: isthmus.cond(minus_one(x), f, g, x))  # lax.cond: -1 is true
    np.testing.assert_allclose(negative(X0).numpy(), jax.lax.cond(jnp.int32(-1), lf, lg, X0), rtol=1e-6)
    constant = c.program(lambda x: isthmus.cond(False, f, lambda v: v, f(x)))
    np.testing.assert_allclose(constant(X0).numpy(), lf(X0), rtol=1e-6)
    with pytest.raises(isthmus.InvalidArgument, match=r"cond: pred must be a bool or numeric scalar.*"
                                                       r"float32\[8\]"):
        c.program(lambda x: isthmus.cond(x, f, g, x))(X0)


def test_constants_as_a_nested_loop_s_carry_and_as_results_as_jax_lax_takes_them(c, fns):
    """A literal `init_val` of a loop inside another loop's body, a literal branch result and
    body result, and a literal predicate: placed where their loop or branch runs."""
    f, g, lf, lg, inc = fns["f"], fns["g"], fns["lf"], fns["lg"], fns["inc"]
    below2 = c.jit(lambda i: i < 2, slice=fns["sa"])
    positive = c.jit(lambda v: v.sum() > 0, slice=fns["sa"], in_specs=P("x"))

    def inner(x):  # twice f, counted from a literal 0
        return isthmus.while_loop(lambda s: below2(s[0]), lambda s: (inc(s[0]), f(s[1])), (np.int32(0), x))[1]

    nested = c.program(lambda x: isthmus.fori_loop(0, 3, lambda i, v: inner(v), x))
    want = X0
    for _ in range(6):
        want = lf(want)
    np.testing.assert_array_equal(nested(X0).numpy(), np.asarray(want))

    zeros = np.zeros(8, np.float32)
    for flip in (1.0, -1.0):
        branch = c.program(lambda x: isthmus.cond(positive(f(x)), lambda v: zeros, g, f(x)))
        x = X0 * np.float32(flip) + np.float32(flip)
        want = jax.lax.cond(jnp.sum(lf(x)) > 0, lambda v: jnp.zeros(8, jnp.float32), lg, lf(x))
        np.testing.assert_allclose(branch(x).numpy(), want, rtol=1e-6)
        taken = c.program(lambda x: isthmus.cond(positive(f(x)), g, lambda v: zeros, f(x)))
        want = jax.lax.cond(jnp.sum(lf(x)) > 0, lg, lambda v: jnp.zeros(8, jnp.float32), lf(x))
        np.testing.assert_allclose(taken(x).numpy(), want, rtol=1e-6)

    body = lambda i, s: (f(s[0]), np.float32(7))  # noqa: E731
    y, seven = c.program(lambda x: isthmus.fori_loop(0, 3, body, (x, np.float32(0))))(X0)
    np.testing.assert_array_equal(y.numpy(), np.asarray(lf(lf(lf(X0)))))
    assert float(seven) == 7.0
    never = c.program(lambda x: isthmus.while_loop(lambda v: np.bool_(False), f, x))
    np.testing.assert_array_equal(never(X0).numpy(), X0)


def test_fori_loop_bounds_and_weak_carries_are_typed_as_jax_lax_types_them(c, fns):
    """The counter takes the bounds' dtype, a Python int's promoted to the other bound's;
    constant bounds count a known trip with a weakly typed int counter; bounds of unequal
    types are refused; a Python scalar carry takes the type the body gives it."""
    sa = fns["sa"]
    add = c.jit(lambda i, v: v + i, slice=sa)
    to16 = c.jit(lambda v: (v * 2).astype(jnp.float16), slice=sa)

    def lax(lower, upper, body, init):
        return jax.jit(lambda v: jax.lax.fori_loop(lower, upper, body, v))(init)

    def same(got, want):
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        np.testing.assert_array_equal(got.numpy(), np.asarray(want))

    lo, hi, zero16 = np.int16(0), np.int16(3), np.int16(0)
    plus = lambda i, v: v + i  # noqa: E731
    same(c.program(lambda v: isthmus.fori_loop(lo, hi, add, v))(zero16), lax(lo, hi, plus, zero16))
    same(c.program(lambda h, v: isthmus.fori_loop(0, h, add, v))(hi, zero16),
         jax.jit(lambda h, v: jax.lax.fori_loop(0, h, plus, v))(hi, zero16))
    same(c.program(lambda low, v: isthmus.fori_loop(low, 3, add, v))(lo, zero16),
         jax.jit(lambda low, v: jax.lax.fori_loop(low, 3, plus, v))(lo, zero16))
    same(c.program(lambda v: isthmus.fori_loop(np.float32(0), np.float32(2.5), add, v))(np.float32(0)),
         lax(np.float32(0), np.float32(2.5), plus, np.float32(0)))
    for bad in (lambda v: isthmus.fori_loop(0, np.float32(2.5), add, v),
                lambda v: isthmus.fori_loop(np.int16(0), np.int32(3), add, v)):
        with pytest.raises(isthmus.InvalidArgument, match="lower and upper must have equal types"):
            c.program(bad)(np.float32(0))
    with pytest.raises(isthmus.InvalidArgument, match="lower and upper must have equal types"):
        c.program(lambda h, v: isthmus.fori_loop(0, h, add, v))(np.float32(2.5), np.float32(0))
    with pytest.raises(isthmus.InvalidArgument, match="upper bound 2147483649 does not fit"):
        c.program(lambda v: isthmus.fori_loop(2**31 - 2, 2**31 + 1, add, v))(np.int32(0))

    twice = lambda i, v: (v * 2).astype(jnp.float16)  # noqa: E731
    same(c.program(lambda x: (x, isthmus.fori_loop(0, 3, lambda i, v: to16(v), 1.0)))(X0)[1],
         jax.jit(lambda: jax.lax.fori_loop(0, 3, twice, 1.0))())
    same(c.program(lambda v: isthmus.fori_loop(0, 3, lambda i, u: to16(u), v))(1.0),
         jax.jit(lambda v: jax.lax.fori_loop(0, 3, twice, v))(1.0))
