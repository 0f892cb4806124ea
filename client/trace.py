"""The program tracer: run a Python function whose calls are `c.jit` functions, record an IR program.

Contract:
- While a trace is active (`tracing()`), calling a `Function` records one `compute` node
  instead of calling the server, and returns `Traced` values standing for its outputs:
  shape and dtype known, no data. This is abstract evaluation, as a JAX trace does.
- Every IR edge is exactly typed (aval, spec, slice). When a value meets a computation
  on another slice or with another spec, the tracer records a logical `transfer` (once per
  value and target); the server's passes decide how it moves.
- A program argument given as an array is placed where its first consumer wants it; a
  `Buffer` argument keeps its slice and spec. Buffers and arrays a traced function closes
  over become extra arguments, held by the traced program and passed with every run.
- Control flow (`client.control_flow`) traces its functions in *child* traces, one per
  sub-graph: their own ops and arguments, the same value table. A child that uses a value
  of an enclosing trace captures it: the enclosing trace moves it where the use wants it
  (outside the loop, so once) and the child gets it as an extra argument.
- `finish` builds the program with `ir.ProgramBuilder`, so a traced program is verified.
"""

from __future__ import annotations

import itertools
import re
import weakref
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import jax
import numpy as np

from client import context
from client.arrays import FLOAT0, PLAIN, NotAnArray, Shaped, View, as_array, is_float0
from client.buffer import Buffer
from client.context import tracing
from client.exported import Export
from client.slices import Slice
from client.statics import StaticKey
from ir import (
    Aval,
    InvalidArgument,
    MeshAxes,
    NotFound,
    Program,
    ProgramBuilder,
    Spec,
    Type,
    content_hash,
    dtype_name,
)

__all__ = ["DATA_LESS", "Names", "Trace", "Traceable", "Traced", "current_trace", "tracing"]


def current_trace() -> Trace | None:
    """The program being traced in this context (`client.context`), if any."""
    trace = context.current_trace()
    assert trace is None or isinstance(trace, Trace), "only the tracer's traces are set as one"
    return trace


class Traceable(Protocol):
    """What the tracer asks of a jitted function called in a program (`client.jit.Function`)."""

    name: str
    slice: Slice

    def own_specs(self, placed: Sequence[tuple[str, Spec] | None]) -> tuple[Spec | None, ...]: ...
    def export(self, args: Any, kwargs: dict[str, Any], sig: Any) -> Export: ...
    def vjp(self, exported: Export, wrt: Sequence[bool], cts: Sequence[bool],
            acc: Sequence[bool] = ()) -> Any: ...


@dataclass
class _Value:
    aval: Aval
    view: View  # how the client shows it (`client.arrays`)
    type: Type | None  # None: an array argument not yet consumed
    scope: Trace | None = None  # the trace (graph) that defines it


class Traced(Shaped):
    """A value of a program being traced: its shape and dtype, and nothing else yet."""

    __slots__ = ("_id", "_trace")

    def __init__(self, trace: Trace, value_id: int) -> None:
        self._trace = trace
        self._id = value_id

    @property
    def aval(self) -> Aval:
        return self._trace.values[self._id].aval

    @property
    def shown(self) -> View:
        return self._trace.values[self._id].view

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise InvalidArgument(
            "a value inside @program has no data yet: pass it to jitted functions, or return it"
        )

    def __repr__(self) -> str:
        t = self._trace.values[self._id].type
        return f"Traced({self.aval}{'' if t is None else f' {t.spec} @{t.slice}'})"

    def __bool__(self) -> bool:
        raise InvalidArgument(f"the truth value of {self!r}: {DATA_LESS} (a branch on a value: "
                              "isthmus.cond; a loop: isthmus.while_loop or fori_loop)")

    def __iter__(self) -> Any:
        raise InvalidArgument(f"iterating over {self!r}: {DATA_LESS}")

    __hash__ = object.__hash__  # (`==` is refused below, as on a JAX array it computes)

    def __getattr__(self, name: str) -> Any:
        """`x.sum()`, `x.T`, ...: what a `jax.Array` has and a traced value has not (an
        `AttributeError` too, for what looks before it leaps: `hasattr`, `getattr(x, n, d)`)."""
        if name in _ARRAY_ATTRIBUTES:
            raise _NoAttribute(f".{name} of {self!r}: {DATA_LESS}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class _NoAttribute(InvalidArgument, AttributeError):
    pass


# What a value inside a program can be given to: why an operation on one is refused.
DATA_LESS = ("a value inside @program has no data yet, and a program's own Python code only "
             "passes its values between c.jit functions, isthmus.while_loop, cond and fori_loop: "
             "do the operation inside a c.jit function")
_ARRAY_ATTRIBUTES = frozenset(a for a in dir(jax.Array) if not a.startswith("_")) - {
    "shape", "dtype", "ndim", "size", "aval", "view"}


def _refused(operation: str) -> Any:
    def refuse(self: Traced, *args: Any) -> Any:
        raise InvalidArgument(f"{operation} on {self!r}: {DATA_LESS}")
    return refuse


for _name, _operation in {
    "add": "+", "sub": "-", "mul": "*", "truediv": "/", "floordiv": "//", "mod": "%", "pow": "**",
    "matmul": "@", "and": "&", "or": "|", "xor": "^", "lshift": "<<", "rshift": ">>",
}.items():
    setattr(Traced, f"__{_name}__", _refused(_operation))
    setattr(Traced, f"__r{_name}__", _refused(_operation))
for _name, _operation in {
    "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "neg": "unary -",
    "pos": "unary +", "abs": "abs()", "invert": "~", "getitem": "indexing",
    "setitem": "item assignment", "float": "float()", "int": "int()", "index": "use as an index",
    "complex": "complex()",
}.items():
    setattr(Traced, f"__{_name}__", _refused(_operation))


Names = dict[int, str]  # value -> its name in the builder of its graph


class TracedOp(Protocol):
    def emit(self, trace: Trace, b: ProgramBuilder, names: Names) -> None: ...


@dataclass(frozen=True)
class _Compute:
    name: str
    artifact: bytes
    slice: Slice
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    ins: tuple[Spec, ...]
    outs: tuple[Spec, ...]

    def emit(self, trace: Trace, b: ProgramBuilder, names: Names) -> None:
        ins = [(trace.values[v].aval, spec) for v, spec in zip(self.inputs, self.ins, strict=True)]
        outs = [(trace.values[v].aval, spec) for v, spec in zip(self.outputs, self.outs, strict=True)]
        inputs = [names[v] for v in self.inputs]
        defined = b.compute(self.name, self.artifact, self.slice.id, inputs, outs, ins)
        names.update(zip(self.outputs, defined, strict=True))


@dataclass(frozen=True)
class _Transfer:
    source: int
    target: int

    def emit(self, trace: Trace, b: ProgramBuilder, names: Names) -> None:
        t = trace.values[self.target].type
        assert t is not None
        names[self.target] = b.transfer(names[self.source], t.spec, t.slice)


class Trace:
    def __init__(self, slices: Mapping[str, Slice] | None = None, parent: Trace | None = None,
                 parallel_iterations: int = 1, deleted: Collection[str] = ()) -> None:
        """`slices`: the client's slices; `deleted`: ids of slices it deleted (a buffer freed
        with one is then `NotFound`, not a stranger's)."""
        self.parent = parent
        self._deleted: Collection[str] = deleted if parent is None else parent._deleted
        self.root: Trace = self if parent is None else parent.root
        self.parallel_iterations = parallel_iterations  # the program's default for its loops
        self._known = slices or {}  # the client's slices, for buffers on a slice no call uses
        self.values: list[_Value] = [] if parent is None else parent.values
        self.args: list[int] = []  # program (or sub-graph) arguments, in order
        self.bound: list[Buffer | np.ndarray] = []  # closed-over inputs: extra arguments (root)
        self._bound_ids: dict[int, int] = {}  # id(object) -> value
        self._originals: list[Any] = []
        self._ops: list[TracedOp] = []
        self._moved: dict[tuple[int, str, Spec], int] = {}
        self._slices: dict[str, Slice] = {} if parent is None else parent._slices
        self.captures: dict[int, int] = {}  # value of the enclosing trace -> this trace's argument
        # artifact hash -> the function (weakly: a trace lives in reference cycles, and a dropped
        # function must go at once) and export it came from, for its VJP (`client.grad`)
        self.sources: dict[str, tuple[weakref.ref[Traceable], Export]] = (
            {} if parent is None else parent.sources)
        # each differentiated sub-graph's stack names, unique in the program (`client.grad`)
        self.grads: itertools.count[int] = itertools.count() if parent is None else parent.grads

    def child(self) -> Trace:
        """A trace for a sub-graph (a loop's cond or body, a branch) of this one."""
        return Trace(self._known, self)

    @property
    def slices(self) -> dict[str, Slice]:
        return self._slices

    # -- values ------------------------------------------------------------------------------

    def _new(self, aval: Aval, view: View, type: Type | None) -> int:
        self.values.append(_Value(aval, view, type, self))
        return len(self.values) - 1

    def new_value(self, aval: Aval, view: View, type: Type | None) -> int:
        """A value this trace's next op defines."""
        return self._new(aval, view, type)

    def new_arg(self, aval: Aval, view: View, type: Type | None) -> int:
        """An argument of this (sub-)graph."""
        value = self._new(aval, view, type)
        self.args.append(value)
        return value

    def traced(self, value: int) -> Traced:
        return Traced(self, value)

    def add(self, op: TracedOp) -> None:
        self._ops.append(op)

    def mine(self, value: int) -> bool:
        return self.values[value].scope is self

    def local(self, value: int) -> int:
        """`value` as this trace sees it: itself, or (from an enclosing trace) a captured
        argument of the same type; the value must be typed by then."""
        if self.mine(value):
            return value
        assert self.parent is not None
        outer = self.parent.local(value)
        if outer not in self.captures:
            v = self.values[outer]
            if v.type is None:
                raise InvalidArgument(
                    "@program: an array used inside a loop or branch has no slice yet: pass it to a "
                    "jitted function before the loop, or upload it with c.put")
            self.captures[outer] = self.new_arg(v.aval, v.view, v.type)
        return self.captures[outer]

    def typed(self, value: int) -> Type | None:
        return self.values[value].type

    def argument(self, x: Buffer | np.ndarray, view: View = PLAIN) -> Traced:
        """A program argument: a `Buffer` (typed already) or an array (typed on first use)."""
        if isinstance(x, Buffer):
            value = self._buffer(x)
        else:
            value = self._new(Aval(tuple(x.shape), dtype_name(x.dtype)), view, None)
        self.args.append(value)
        return Traced(self, value)

    def leaf(self, x: Any) -> int:
        """A value for one leaf passed to a jitted function: traced (here or in an enclosing
        trace), or closed over (an argument of the whole program)."""
        if isinstance(x, Traced):
            if x._trace.root is not self.root:
                raise InvalidArgument("a traced value from another @program was passed to this one")
            if not self._encloses(x._trace):
                raise InvalidArgument("a value traced inside a loop or branch was used outside it")
            return x._id
        if self.parent is not None:
            return self.root.leaf(x)
        if id(x) in self._bound_ids:
            return self._bound_ids[id(x)]
        if isinstance(x, Buffer):
            obj: Buffer | np.ndarray = x
            value = self._buffer(x)
        else:
            try:
                obj, view = as_array(x)
            except NotAnArray as e:
                raise InvalidArgument(f"@program: a value a jitted function reads {e}") from None
            value = self._new(Aval(tuple(obj.shape), dtype_name(obj.dtype)), view, None)
        self.bound.append(obj)
        self._originals.append(x)  # kept alive, so its id names it for the whole trace
        self._bound_ids[id(x)] = value
        return value

    def _buffer(self, x: Buffer) -> int:
        if x.slice_id in self._known:
            self._slices.setdefault(x.slice_id, self._known[x.slice_id])
        return self._new(x.aval, x.shown, Type(x.aval, x.spec, x.slice_id))

    def _encloses(self, trace: Trace) -> bool:
        t: Trace | None = self
        while t is not None and t is not trace:
            t = t.parent
        return t is trace

    def use(self, value: int, slice: Slice, spec: Spec) -> int:
        """`value` as `slice` and `spec` want it: itself, or a (shared) transfer of it. A value
        of an enclosing trace is moved there (once, outside the loop) and captured."""
        if not self.mine(value):
            assert self.parent is not None
            return self.local(self.parent.use(value, slice, spec))
        v = self.values[value]
        want = Type(v.aval, spec, slice.id)
        if v.type is None:
            v.type = want
        if v.type == want:
            return value
        key = (value, slice.id, spec)
        if key not in self._moved:
            self._moved[key] = target = self._new(v.aval, v.view, want)
            self._ops.append(_Transfer(value, target))
        return self._moved[key]

    # -- the one operation -------------------------------------------------------------------

    def apply(self, fn: Traceable, args: tuple[Any, ...], kwargs: dict[str, Any], static: StaticKey) -> Any:
        """A call of `fn` on its dynamic arguments (`static`: the static ones' values)."""
        leaves, in_tree = jax.tree_util.tree_flatten((args, kwargs), is_leaf=lambda x: isinstance(x, Traced))
        # float0 leaves (an integer input's gradient) hold no data: the export makes them
        values = [None if is_float0(x) else self.leaf(x) for x in leaves]
        sig = (in_tree, static, tuple(
            (np.shape(x), FLOAT0, PLAIN) if v is None
            else (self.values[v].aval.shape, self.values[v].aval.dtype, self.values[v].view)
            for x, v in zip(leaves, values, strict=True)
        ), fn.own_specs([None if v is None or (t := self.typed(v)) is None else (t.slice, t.spec)
                         for v in values]))
        exported = fn.export(args, kwargs, sig)
        data = [v for v in values if v is not None]
        if not exported.outputs:  # nothing to compute (`Function.__call__`)
            return exported.tree([])
        self._slices[fn.slice.id] = fn.slice
        self.root._slices[fn.slice.id] = fn.slice
        e = exported  # short, for the lines below
        inputs = tuple(self.use(v, fn.slice, spec) for v, spec in zip(data, e.in_specs, strict=True))
        outputs = tuple(
            self._new(aval, view, Type(aval, spec, fn.slice.id))
            for aval, view, spec in zip(e.out_avals, e.out_views, e.out_specs, strict=True)
        )
        name = re.sub(r"[\s(){}@%,]", "_", fn.name) or "computation"
        self.sources.setdefault(content_hash(exported.artifact), (weakref.ref(fn), exported))
        self._ops.append(_Compute(name, exported.artifact, fn.slice, inputs, outputs,
                                  tuple(exported.in_specs), tuple(exported.out_specs)))
        return exported.tree([Traced(self, v) for v in outputs])

    # -- the program -------------------------------------------------------------------------

    def finish(self, results: Sequence[Any]) -> tuple[Program, list[Type]]:
        """The traced program, and the type of every argument (user ones, then bound ones)."""
        outs = [self._result(x) for x in results]
        if not self._slices:  # (a program of buffers alone runs: its results are its inputs)
            raise InvalidArgument("@program: the function calls no jitted function and reads no buffer: "
                                  "nothing says which slice its values would live on")
        first = next(iter(self._slices.values()))
        for v in self.args + list(self._bound_ids.values()):  # unconsumed arguments
            if self.values[v].type is None:
                self.values[v].type = Type(self.values[v].aval, Spec(()), first.id)
        b = ProgramBuilder()
        for s in self._slices.values():
            b.slice(s.id, MeshAxes.of(s.mesh), s.island)
        names: Names = {}
        arguments = self.args + list(self._bound_ids.values())
        for v in arguments:
            t = self.values[v].type
            assert t is not None
            if t.slice not in self._slices and t.slice in self._deleted:
                raise NotFound(f"@program: an argument is a buffer freed with its slice {t.slice}, deleted")
            if t.slice not in self._slices:
                raise InvalidArgument(f"@program: an argument lives on slice {t.slice}, which this "
                                      "client did not create (pass buffers of this client's slices)")
            names[v] = b.arg(t.aval, t.spec, t.slice)
        self.emit_ops(b, names)
        b.result(*(names[v] for v in outs))
        types = [self.values[v].type for v in arguments]
        return b.build(), [t for t in types if t is not None]  # all typed above: the filter is for mypy

    def emit_ops(self, b: ProgramBuilder, names: Names) -> None:
        for op in self._ops:
            op.emit(self, b, names)

    def _result(self, x: Any) -> int:
        if isinstance(x, Traced):  # (one of a loop's or branch's, or another program's: refused by name)
            return self.leaf(x)
        if isinstance(x, Buffer | np.ndarray | np.generic | jax.Array | bool | int | float | complex):
            return self.leaf(x)  # a constant, as jax.jit returns one: sent with the run
        raise InvalidArgument(
            f"@program: a result must come from a jitted function, be an argument or an array; found "
            f"{type(x).__name__}"
        )
