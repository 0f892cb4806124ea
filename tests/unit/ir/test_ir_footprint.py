"""`HostPlan.held`: the most bytes of its own values a run holds on a host at once."""

import pytest
from ir_placed import on

from ir import Aval, HostPlan, ProgramBuilder
from ir.passes import host_plans, lower
from ir.passes.footprint import held_bytes
from ir.plan import Compute, Enter, Exit, Merge, NextIteration, Send, Switch

pytestmark = pytest.mark.unit

MB = Aval((1 << 18,), "float32")  # 1 MiB
MIB = 1 << 20
ONE = {"s": on("a", "a0", 0)}


def one_host(program) -> HostPlan:
    (plan,) = host_plans(lower(program, ONE, check=True)).values()
    return plan


@pytest.mark.parametrize("length", [2, 16, 128])
def test_a_chain_holds_two_values_at_once_however_long(length):
    b = ProgramBuilder()
    s = b.slice("s", {"x": 1})
    v = b.arg(MB, (), s)
    for k in range(length):
        (v,) = b.compute(f"f{k}", b"f", s, [v], [(MB, ())])
    b.result(v)
    # a step's input and output; the last output is the result, counted as the run's output
    assert one_host(b.build()).held == (MIB if length == 2 else 2 * MIB)


def test_a_value_read_late_is_held_until_then():
    b = ProgramBuilder()
    s = b.slice("s", {"x": 1})
    x = b.arg(MB, (), s)
    (a,) = b.compute("f", b"f", s, [x], [(MB, ())])
    (c,) = b.compute("g", b"g", s, [a], [(MB, ())])
    (d,) = b.compute("h", b"h", s, [c], [(MB, ())])
    (e,) = b.compute("k", b"k", s, [a, d], [(Aval((), "float32"), ())])
    b.result(e)
    assert one_host(b.build()).held == 3 * MIB  # a, c and d while h runs


def test_a_value_counts_its_shard_times_the_hosts_devices():
    b = ProgramBuilder()
    s = b.slice("s", {"x": 4})
    x = b.arg(Aval((4, 1 << 18), "float32"), ("x", None), s)  # 4 MiB, 1 MiB a device
    (sharded,) = b.compute("f", b"f", s, [x], [(Aval((4, 1 << 18), "float32"), ("x", None))])
    (replicated,) = b.compute("g", b"g", s, [sharded], [(MB, ())])  # 1 MiB on each of 4 devices
    (out,) = b.compute("h", b"h", s, [replicated], [(Aval((), "float32"), ())])
    b.result(out)
    (plan,) = host_plans(lower(b.build(), {"s": on("a", "a0", 0, 1, 2, 3)}, check=True)).values()
    assert plan.held == 8 * MIB


def loop(parallel: int) -> HostPlan:
    """while keep_going(y, n): y, n = step(y, n), one 1 MiB value carried."""
    b = ProgramBuilder()
    s = b.slice("s", {"x": 1})
    i32 = Aval((), "int32")
    y, n = b.arg(MB, (), s), b.arg(i32, (), s)
    cond = b.sub()
    cy, cn = cond.arg(MB, (), s), cond.arg(i32, (), s)
    cond.result(*cond.compute("keep_going", b"keep_going", s, [cy, cn], [(Aval((), "bool"), ())]))
    body = b.sub()
    by, bn = body.arg(MB, (), s), body.arg(i32, (), s)
    (by2,) = body.compute("step", b"step", s, [by], [(MB, ())])
    (bn2,) = body.compute("inc", b"inc", s, [bn], [(i32, ())])
    body.result(by2, bn2)
    z, _ = b.while_([y, n], cond.graph(), body.graph(), parallel)
    (out,) = b.compute("sum", b"sum", s, [z], [(Aval((), "float32"), ())])
    b.result(out)
    return one_host(b.build())


@pytest.mark.parametrize("parallel", [1, 4])
def test_what_a_loop_makes_counts_once_per_iteration_open_and_once_more(parallel):
    # the body's 1 MiB value (plus its 4-byte counter and 1-byte predicate), kept until the
    # loop's Exit, in parallel + 1 copies; the exit value aliases it and is read after
    assert loop(parallel).held == (parallel + 1) * (MIB + 4 + 1)


def test_control_steps_alias_what_they_pass_on():
    size = {"x": MIB, "a": MIB, "b": 2 * MIB}.get
    plan = HostPlan(
        "a0", ((0, "x"), (1, "p")),
        (Compute("k", ("x",), ("a",), "f"),  # a: 1 MiB
         Enter("w", ("a", "p"), ("ea", "ep")),
         Merge("w", (("ea", "na"),), ("ma",)),
         Switch("ep", ("ma",), (("xa",), ("ba",)), ("%w.exit", "%w.body")),
         Compute("k2", ("ba",), ("b",), "g"),  # b: 2 MiB, made in the loop
         NextIteration("w", "ep", ("b",), ("na",)),
         Exit("w", ("xa",), ("out",)),
         Send("out", ("b0",), "t")),
        tuple(range(8)), (), ())
    # in the loop: a (entered) and b in two copies; after it, `out` is a or b: a send of 1 MiB
    assert held_bytes(plan, lambda v: size(v, 0), lambda v: size(v, 0)) == MIB + 2 * 2 * MIB
