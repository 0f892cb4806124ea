"""Loops whose hosts run several iterations at once (`parallel_iterations`), through the
server: equal to the local oracle, no state left on any host, and the option checked at the
client and at the server (a failure in iteration k: `test_control_flow_runs`)."""

import re

import jax
import numpy as np
import pytest
from test_control_flow import X0, assert_no_state_left, islands, scale, shift

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

lf, lg = jax.jit(scale), jax.jit(shift)


@pytest.fixture
def fns(c):
    return islands(c)


def plan_texts(c, program):
    program_id = program.traces[0].program_id
    return "\n".join(line for p in c.raw_json("GET", f"/v1/programs/{program_id}/text")["plans"]
                     for line in p["text"])


@pytest.mark.parametrize("parallel", [2, 16])
def test_a_two_island_loop_with_a_branch_and_a_pytree(c, fns, parallel):
    f, g, even = fns["f"], fns["g"], fns["even"]

    @c.program(parallel_iterations=parallel)
    def loop(x):
        def body(i, s):
            return {"v": isthmus.cond(even(i), g, f, s["v"]), "w": g(s["w"])}
        return isthmus.fori_loop(0, 9, body, {"v": f(x), "w": g(x)})

    out = loop(X0)
    v, w = lf(X0), lg(X0)
    for i in range(9):
        v, w = (lg(v) if i % 2 == 0 else lf(v)), lg(w)
    np.testing.assert_array_equal(out["v"].numpy(), np.asarray(v))
    np.testing.assert_array_equal(out["w"].numpy(), np.asarray(w))
    assert f"parallel_iterations {parallel}" in plan_texts(c, loop)
    assert_no_state_left(c)
    zero = loop(X0 * 0)  # and again, on other values: nothing of the last run is read
    np.testing.assert_array_equal(zero["w"].numpy(), np.asarray(_times(lg, 10, X0 * 0)))
    assert not re.search(r"parallel_iterations 1\b", plan_texts(c, loop))  # 1 is not shown


def _times(fn, n, x):
    for _ in range(n):
        x = fn(x)
    return x


def test_zero_trips_nested_loops_and_a_loop_that_says_one_at_a_time(c, fns):
    f, g = fns["f"], fns["g"]

    @c.program(parallel_iterations=4)
    def nested(x, n):
        inner = lambda i, v: isthmus.fori_loop(0, i, lambda j, w: g(w), v)  # noqa: E731
        outer = isthmus.fori_loop(0, 4, lambda i, v: inner(i, f(v)), g(x))
        alone = isthmus.fori_loop(0, n, lambda i, v: f(v), outer, parallel_iterations=1)
        return alone

    for n in (0, 3):
        out = nested(X0, np.int32(n))
        want = lg(X0)
        for i in range(4):
            want = lf(want)
            for _ in range(i):
                want = lg(want)
        np.testing.assert_array_equal(out.numpy(), np.asarray(_times(lf, n, want)))
    text = plan_texts(c, nested)
    assert text.count("parallel_iterations 4") >= 2 and not re.search(r"parallel_iterations 1\b", text)
    assert_no_state_left(c)


@pytest.mark.parametrize("bad", [0, 65, 2.5, True, "4"])
def test_a_bad_parallel_iterations_is_refused_by_name(c, fns, bad):
    with pytest.raises(isthmus.InvalidArgument, match="parallel_iterations"):
        c.program(lambda x: x, parallel_iterations=bad)
    f = fns["f"]
    with pytest.raises(isthmus.InvalidArgument, match="parallel_iterations"):
        c.program(lambda x: isthmus.fori_loop(0, 3, lambda i, v: f(v), f(x), parallel_iterations=bad)
                  ).trace(X0)


def test_a_hostile_parallel_iterations_is_a_400_naming_the_field(c, fns):
    f = fns["f"]
    prog = c.program(lambda x: isthmus.fori_loop(0, 3, lambda i, v: f(v), f(x), parallel_iterations=2))
    wire = __import__("ir").to_wire(prog.trace(X0))
    loop = next(n for n in wire["graph"]["nodes"] if n["op"] == "while")
    for bad in (10**9, -1, "many", True):
        loop["attrs"]["parallel_iterations"] = bad
        with pytest.raises(isthmus.InvalidArgument, match="parallel_iterations"):
            c.raw_json("POST", "/v1/programs", json={"program": wire})
