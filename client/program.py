"""`Client.program`: trace a function of jitted calls into one IR program, register it, run it.

Calling a `ProgramFunction` traces it once per input signature (the tree, and per leaf its
shape, dtype and weak type, or for a `Buffer` its slice and spec too), registers the program
with the server, and then queues one run per call (`client.session`): nothing waits for
the server. The outputs come back at once as `Buffer` futures, in the function's pytree,
typed as the server registered the program's results.

While a program is being traced, its own Python code only passes values between jitted
functions and control flow: an array operation on a traced value is refused, naming the
operation and where it goes (a `c.jit` function). A program called by a program being traced
is part of it, inlined, as a `jax.jit` function called by another is.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Protocol

import jax
import numpy as np

from client.arrays import PLAIN, View, as_array, leaf_array
from client.buffer import Buffer
from client.exported import split_float0, with_fixed
from client.jit import SIGNATURES_KEPT, default_name
from client.registrations import LetGo, Registrations
from client.slices import Output, Slice
from client.trace import DATA_LESS, Trace, Traced, current_trace, tracing
from ir import Aval, InvalidArgument, Program, Spec, Type, print_program, to_wire
from ir.ops import check_parallel_iterations

DISPATCH = ("parallel", "sequential")


class Runs(LetGo, Protocol):
    """What a `ProgramFunction` asks of the session that runs it (`client.session.Session`)."""

    slices: dict[str, Slice]  # the client's slices, by id
    deleted_slices: dict[str, None]  # the newest slices the client deleted

    def run(self, program_id: str, inputs: list[str], dispatch: str | None,
            outputs: list[Output], trace: bool = False) -> list[Buffer]: ...
    def put(self, array: np.ndarray, slice_id: str, spec: Spec, view: View = PLAIN) -> Buffer: ...
    def register(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class Registered:
    """One signature of a program: registered on the server, with what each run needs."""

    program_id: str
    program: Program
    arg_types: list[Type]
    bound: list[Buffer]  # closed-over inputs, uploaded once, passed with every run
    out_tree: Any
    outputs: list[Output]  # per computed result
    fixed: list[tuple[int, np.ndarray]]  # results known when traced (float0), by position


class ProgramFunction:
    def __init__(self, session: Runs, fn: Callable[..., Any], dispatch: str | None = None,
                 name: str | None = None, fuse: bool | None = None, parallel_iterations: int = 1,
                 trace: bool = False) -> None:
        if dispatch is not None and dispatch not in DISPATCH:
            raise ValueError(f"dispatch: expected one of {DISPATCH} or None, got {dispatch!r}")
        self.parallel_iterations = check_parallel_iterations(parallel_iterations)
        self._session = session
        self.fn = fn
        self.dispatch = dispatch
        self.trace_runs = bool(trace)  # each run traced (`Client.trace`)
        self.fuse = fuse
        self.name = name or default_name(fn, "program")
        # the newest signatures' programs, let go of once evicted or this is gone
        self._cache: Registrations[Registered] = Registrations(
            self, session, "programs", attrgetter("program_id"))
        self._lock = threading.RLock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current_trace() is not None:  # called by a program being traced: part of it, inline
            return self.fn(*args, **kwargs)
        with self._lock:  # from the lookup until the run is queued, as `Function._call`
            items, traced = self._signature((args, kwargs))
            inputs = [
                x.live() if isinstance(x, Buffer)
                else self._session.put(x[0], t.slice, t.spec, x[1])
                for x, t in zip(items, traced.arg_types[:len(items)], strict=True)
            ] + [b.live() for b in traced.bound]  # (a closed-over buffer deleted since is named)
            outs = self._session.run(traced.program_id, [b.id for b in inputs], self.dispatch, traced.outputs,
                                     self.trace_runs)
        return with_fixed(traced.out_tree, traced.fixed, outs)

    def _signature(self, args: tuple[tuple[Any, ...], dict[str, Any]]
                   ) -> tuple[list[Buffer | tuple[np.ndarray, View]], Registered]:
        """The leaves of `(args, kwargs)`, and their signature's traced program (traced if new)."""
        leaves, in_tree = jax.tree_util.tree_flatten(args)
        items = [x.live(self._session) if isinstance(x, Buffer) else leaf_array(x, args, i, self.name)
                 for i, x in enumerate(leaves)]
        sig = (in_tree, tuple(
            ("buffer", x.aval, x.spec, x.slice_id, x.key) if isinstance(x, Buffer)
            else ("array", x[0].shape, x[0].dtype.str, x[0].dtype.name, x[1])  # (float8s share a str)
            for x in items
        ))
        traced = self._cache.get(sig)
        if traced is None:
            traced, _ = self._cache.add(sig, lambda: self._trace(items, in_tree), SIGNATURES_KEPT)
        return items, traced

    def trace(self, *args: Any, **kwargs: Any) -> Program:
        """The IR program these arguments trace to (traced and registered if new)."""
        with self._lock:
            return self._signature((args, kwargs))[1].program

    def show(self, *args: Any, **kwargs: Any) -> str:
        """The text form of the program these arguments trace to."""
        return print_program(self.trace(*args, **kwargs))

    def _trace(self, items: list[Buffer | tuple[np.ndarray, View]], in_tree: Any) -> Registered:
        trace = Trace(self._session.slices, parallel_iterations=self.parallel_iterations,
                      deleted=self._session.deleted_slices)
        traced_args = [trace.argument(x) if isinstance(x, Buffer) else trace.argument(*x) for x in items]
        with tracing(trace):
            args, kwargs = jax.tree_util.tree_unflatten(in_tree, traced_args)
            try:
                out = self.fn(*args, **kwargs)
            except TypeError as e:  # a jax.numpy or lax function given a traced value, say
                if "client.trace.Traced" not in str(e):  # (its class, as JAX names it)
                    raise
                said = str(e).rstrip(".")
                raise InvalidArgument(f"{self.name}: {said}. {DATA_LESS[0].upper()}{DATA_LESS[1:]}") from e
        out_leaves, out_tree = jax.tree_util.tree_flatten(out)
        out_leaves, fixed = split_float0(out_leaves)
        program, arg_types = trace.finish(out_leaves)
        # each a Traced, a Buffer or a constant: `finish` checked
        views = [x.shown if isinstance(x, Traced | Buffer) else as_array(x)[1] for x in out_leaves]
        bound = [
            x.live(self._session) if isinstance(x, Buffer) else self._session.put(x, t.slice, t.spec)
            for x, t in zip(trace.bound, arg_types[len(items):], strict=True)
        ]
        record = self._session.register("/v1/programs",
                                        {"program": to_wire(program), "name": self.name, "fuse": self.fuse})
        outputs = [(r["slice_id"], Aval(tuple(r["shape"]), r["dtype"]), Spec.from_json(r["spec"]), view)
                   for r, view in zip(record["results"], views, strict=True)]
        return Registered(record["id"], program, arg_types, bound, out_tree, outputs, fixed)

    @property
    def traces(self) -> tuple[Registered, ...]:
        """Its kept signatures' traced programs, oldest first: each one's IR program and the
        id the server registered it under."""
        return tuple(self._cache.values())

    def __repr__(self) -> str:
        return f"isthmus.ProgramFunction({self.name})"
