"""Programs shared by the IR tests, built with `ProgramBuilder`."""

from __future__ import annotations

import pytest

from ir import Aval, Program, ProgramBuilder

F32 = "float32"


def build_example() -> Program:
    """Three computations over two slices on islands a and b, with one transfer between them."""
    b = ProgramBuilder()
    s0 = b.slice("s0", {"data": 2, "model": 2}, island="a")
    s1 = b.slice("s1", {"x": 4}, island="b")
    w = b.arg(Aval((8, 16), F32), (None, "model"), s0)
    x = b.arg(Aval((4, 8), F32), ("data", None), s0)
    (h,) = b.compute("layer", b"layer", s0, [x, w], [(Aval((4, 16), F32), ("data", None))])
    (g,) = b.compute("norm", b"norm", s0, [h], [(Aval((4, 16), F32), ("data", None))])
    t = b.transfer(g, ("x", None), s1)
    (y,) = b.compute("head", b"head", s1, [t], [(Aval((4, 16), F32), ("x", None))])
    b.result(y)
    return b.build()


def build_control_flow() -> Program:
    """A while loop over a computation, then a three-way cond on an int32 predicate."""
    b = ProgramBuilder()
    s = b.slice("s1", {"x": 4})
    v = Aval((4, 16), F32)
    y = b.arg(v, ("x", None), s)
    n = b.arg(Aval((), "int32"), (), s)
    cond = b.sub()
    cy, cn = cond.arg(v, ("x", None), s), cond.arg(Aval((), "int32"), (), s)
    (p,) = cond.compute("keep_going", b"keep_going", s, [cy, cn], [(Aval((), "bool"), ())])
    cond.result(p)
    body = b.sub()
    by, bn = body.arg(v, ("x", None), s), body.arg(Aval((), "int32"), (), s)
    (by2, bn2) = body.compute("step", b"step", s, [by, bn], [(v, ("x", None)), (Aval((), "int32"), ())])
    body.result(by2, bn2)
    z, k = b.while_([y, n], cond.graph(), body.graph())
    branches = []
    for name in ("zero", "one", "two"):
        br = b.sub()
        a = br.arg(v, ("x", None), s)
        (o,) = br.compute(name, name.encode(), s, [a], [(v, ("x", None))])
        br.result(o)
        branches.append(br.graph())
    (r,) = b.cond(k, [z], branches)
    b.result(r, k)
    return b.build()


@pytest.fixture
def example() -> Program:
    return build_example()


@pytest.fixture
def control_flow() -> Program:
    return build_control_flow()
