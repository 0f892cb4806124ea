"""`Client.jit`: export a JAX function for a slice, register it once per signature, call it.

Arguments and results are pytrees. The function is exported over flat leaves with
`jax.export` against the slice's `AbstractMesh`, so the client needs no accelerator; the
tree structure stays here. `in_specs` / `out_specs` are either one spec for every leaf or a
pytree prefix of the arguments / results, as in `jax.jit`'s shardings.

A `Function` reaches the session that calls it through `Calls` alone; inside a program
being traced (`client.context`) a call becomes one node of the program instead.
"""

from __future__ import annotations

import base64
import contextlib
import inspect
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

import jax
import numpy as np
from jax.sharding import AbstractMesh, Mesh, NamedSharding, PartitionSpec, use_abstract_mesh

from client.arrays import (
    FLOAT0,
    PLAIN,
    View,
    as_array,
    call_specs,
    is_float0,
    leaf_array,
    leaf_specs,
    unwrap,
    wrap,
)
from client.buffer import Buffer
from client.context import current_trace, jitting
from client.donation import Donated
from client.exported import Export, split_float0, with_fixed
from client.registrations import LetGo, Registrations
from client.slices import Output, Slice
from client.specials import checking
from client.statics import StaticKey, Statics
from client.vjp import VjpExport, export_vjp
from ir import Aval, InvalidArgument, IsthmusError, NotFound, Spec, dtype_name, parse_dtype

# (a flag of JAX's with no public context manager; without it, artifacts only differ more)
_full_tracebacks: Any
try:
    from jax._src import config as _jax_config

    _full_tracebacks = _jax_config.include_full_tracebacks_in_locations
except (ImportError, AttributeError):  # pragma: no cover
    _full_tracebacks = None

__all__ = ["Export", "Function", "as_array", "leaf_specs"]

# Signatures of one function whose registrations are kept: the least recently called one goes
# past this (it is exported and registered again if called again), as a cache of compiled
# functions keeps a bounded number, and the server's quota counts what clients hold.
SIGNATURES_KEPT = 256
_LEAVES = inspect.Signature([inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)])
NAME_KEPT = 200  # characters of a function's name the server takes (longer ones are cut)
# the dynamic arguments' tree, the static values, per leaf its data's shape, dtype and view,
# and (without in_specs) per leaf the spec it has on the slice, if any (`Function.own_specs`)
Signature = tuple[Any, StaticKey, tuple[tuple[tuple[int, ...], str, View], ...], tuple[Spec | None, ...]]


class Calls(LetGo, Protocol):
    """What a `Function` asks of the session that calls it (`client.session.Session`)."""

    deleted_slices: dict[str, None]  # the newest slices the client deleted

    def call(self, computation_id: str, inputs: list[str], outputs: list[Output],
             donated: Sequence[Buffer] = ()) -> list[Buffer]: ...
    def put(self, array: np.ndarray, slice_id: str, spec: Spec, view: View = PLAIN) -> Buffer: ...
    def register(self, path: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def check_specials(self, name: str, slice: Slice, outs: Sequence[Buffer], nans: bool,
                       infs: bool) -> None: ...


class Function:
    def __init__(self, session: Calls | None, fn: Callable[..., Any], slice: Slice,
                 in_specs: Any = None, out_specs: Any = None, name: str | None = None,
                 statics: Statics | None = None, donated: Donated | None = None) -> None:
        self._session = session  # None: traced inside programs only (the tests of the tracer)
        self.fn = fn
        self.slice = slice
        self.in_specs = in_specs  # a prefix of the dynamic positional arguments, or one spec
        self.out_specs = out_specs
        self.statics = statics or Statics()
        self.donated = donated or Donated()
        self.name = name or default_name(fn, "computation")
        self._exports: dict[Signature, Export] = {}
        # the newest signatures' computations, let go of once evicted or this is gone
        self._registered: Registrations[str] | None = (
            None if session is None else Registrations(self, session, "computations", str))
        self._lock = threading.RLock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        donated = self.donated.buffers(args, kwargs)
        args, kwargs, static = self.statics.split(args, kwargs)
        trace = current_trace()
        if trace is not None:  # inside `@c.program`: becomes one node of the program
            return trace.apply(self, args, kwargs, static)
        leaves, in_tree = jax.tree_util.tree_flatten((args, kwargs))
        arrays: list[Buffer | tuple[np.ndarray, View]] = [
            x.live(self._session) if isinstance(x, Buffer)
            else (np.zeros(np.shape(x), jax.dtypes.float0), PLAIN) if is_float0(x)
            else leaf_array(x, (args, kwargs), i, self.name)
            for i, x in enumerate(leaves)
        ]
        sig: Signature = (in_tree, static, tuple(
            (a.aval.shape, a.aval.dtype, a.shown) if isinstance(a, Buffer)
            else (a[0].shape, FLOAT0 if is_float0(a[0]) else dtype_name(a[0].dtype), a[1])
            for a in arrays
        ), self.own_specs([(a.slice_id, a.spec) if isinstance(a, Buffer) else None for a in arrays]))
        exported = self.export(args, kwargs, sig)
        if any(d == FLOAT0 for _, d, _ in sig[2]):  # known when traced: not sent
            arrays = [a for a, (_, d, _) in zip(arrays, sig[2], strict=True) if d != FLOAT0]
        # without array results there is nothing to compute: a JAX function has no other effect
        if not exported.outputs:
            for b in donated:
                b.delete()
            return exported.tree([])
        outs = self._call(sig, exported, arrays, donated)  # the call frees them
        nans, infs = checking()
        if nans or infs:  # JAX's jax_debug_nans / jax_debug_infs (`client.specials`)
            assert self._session is not None
            self._session.check_specials(self.name, self.slice, outs, nans, infs)
        return exported.tree(outs)

    def _call(self, sig: Signature, exported: Export, arrays: list[Buffer | tuple[np.ndarray, View]],
              donated: Sequence[Buffer] = ()) -> list[Buffer]:
        """Queue one call of `exported` (registered on first use) on `arrays`, taking over
        the `donated` buffers (`client.donation`)."""
        session, registered = self._session, self._registered
        assert session is not None and registered is not None, \
            "a Function made without a session can only be traced"
        if self.slice.id in session.deleted_slices:  # as a buffer freed with it says
            raise NotFound(f"{self.name}: its slice {self.slice.id} was deleted, and its computations "
                           "with it")
        # One thread at a time from the lookup until the call is queued: a signature evicted
        # by another thread is let go of only after this call of it (`Session.let_go`).
        with self._lock:
            computation = registered.get(sig)
            if computation is None:
                computation, evicted = registered.add(sig, lambda: self._register(session, exported),
                                                      SIGNATURES_KEPT)
                self._exports.pop(evicted, None)
            # Uploads are queued before the call; their release (when dropped) comes after it.
            inputs = [x if isinstance(x, Buffer) else session.put(x[0], self.slice.id, spec, x[1])
                      for x, spec in zip(arrays, exported.in_specs, strict=True)]
            return session.call(computation, [b.id for b in inputs], exported.outputs, donated)

    def own_specs(self, placed: Sequence[tuple[str, Spec] | None]) -> tuple[Spec | None, ...]:
        """Without `in_specs`, each argument already on the slice (its slice id and spec in
        `placed`) is taken with its spec, as `jax.jit` takes a committed array's sharding
        without `in_shardings`; the others (local arrays, values of other slices) are
        replicated. `()` where `in_specs` says."""
        if self.in_specs is not None:
            return ()
        return tuple(p[1] if p is not None and p[0] == self.slice.id else None for p in placed)

    def export(self, args: Any, kwargs: dict[str, Any], sig: Signature) -> Export:
        """The artifact for one signature (cached): `args` and `kwargs` give the pytree its
        specs follow."""
        if sig not in self._exports:
            self._exports[sig] = self._export_in_context(args, kwargs, sig)
        return self._exports[sig]

    def _export_in_context(self, args: Any, kwargs: dict[str, Any], sig: Signature) -> Export:
        """Traced with the slice as the context mesh, as `jax.set_mesh` makes one: a bare
        PartitionSpec in `with_sharding_constraint`, and `shard_map` without `mesh=`, name
        its axes. A function that names a mesh of its own, which JAX refuses under a context
        that differs from it (a concrete `Mesh` given to `shard_map`), is traced again
        without one; if that fails too, the first error is the one raised."""
        with jitting(self.name):  # a buffer it closes over is refused by name
            try:
                with use_abstract_mesh(self.slice.abstract_mesh):
                    return self._export(args, kwargs, *sig)
            except IsthmusError:
                raise
            except Exception as in_context:
                try:  # its own mesh must still be the slice's (axis types aside), as under jax.jit
                    return self._export(args, kwargs, *sig, own_mesh=True)
                except Exception:
                    raise in_context from None

    def _export(self, args: Any, kwargs: dict[str, Any], in_tree: Any, static: StaticKey,
                leaves: Sequence[tuple[tuple[int, ...], str, View]], own: Sequence[Spec | None],
                own_mesh: bool = False) -> Export:
        """The export of one signature; `own_mesh`: traced outside the slice's context, so a
        mesh the function names that is not the slice's in axis names and sizes (a shard_map
        first traced for another slice keeps that one's) is refused."""
        s = self.slice
        mesh = s.abstract_mesh
        # float0 leaves (integer inputs' gradients) hold no data: made inside, as constants
        zero = [dtype == FLOAT0 for _, dtype, _ in leaves]
        given = call_specs(self.in_specs, args, kwargs)
        if own:  # (no in_specs: what is on the slice keeps its spec)
            given = [spec if mine is None else mine for spec, mine in zip(given, own, strict=True)]
        in_specs = [spec for spec, z in zip(given, zero, strict=True) if not z]
        every, leaves = leaves, [leaf for leaf, z in zip(leaves, zero, strict=True) if not z]
        axes = s.mesh_axes
        for i, (spec, (shape, dtype, _)) in enumerate(zip(in_specs, leaves, strict=True)):
            spec.check(Aval(tuple(shape), dtype), axes, f"in_specs (leaf {i})")

        def sharding(spec: Spec) -> NamedSharding:
            return NamedSharding(mesh, PartitionSpec(*spec.entries))

        # on Explicit axes a sharding is part of the type, so the arguments carry theirs
        avals = [jax.ShapeDtypeStruct(shape, parse_dtype(dtype), weak_type=view.weak,
                                      sharding=sharding(spec) if s.explicit else None)
                 for (shape, dtype, view), spec in zip(leaves, in_specs, strict=True)]
        views = [view for _, _, view in every]
        out_box: list[Any] = []
        # `flat` is kept with the export (`Export.source`, for its VJP): it holds the function,
        # not this `Function`, which holds the export (a cycle would outlive a dropped one)
        fn = self.fn

        def flat(*flat_args: Any) -> tuple[Any, ...]:
            given = iter(flat_args)
            full = [np.zeros(shape, jax.dtypes.float0) if z else next(given)
                    for (shape, _, _), z in zip(every, zero, strict=True)]
            wrapped = [wrap(a, v) for a, v in zip(full, views, strict=True)]
            given_args, given_kwargs = jax.tree_util.tree_unflatten(in_tree, wrapped)
            fargs, fkwargs = Statics.join(given_args, given_kwargs, static)
            out_leaves, out_tree = jax.tree_util.tree_flatten(fn(*fargs, **fkwargs))
            # float0 results (the gradients of integer inputs) hold no data: made here, as jax.jit does
            kept, fixed = split_float0(out_leaves)
            data, out_views = zip(*map(unwrap, kept), strict=True) if kept else ((), ())
            out_box[:] = [out_tree, list(out_views), [_type_spec(d) for d in data] if s.explicit else [],
                          tuple(fixed)]
            return tuple(data)

        # JAX's errors while tracing name the user's function and where it is, not this
        # wrapper; its arguments are leaves, named `args[i]` (the user's own names would not
        # line up with them).
        flat.__wrapped__ = self.fn  # type: ignore[attr-defined]
        flat.__signature__ = _LEAVES  # type: ignore[attr-defined]
        shapes = jax.eval_shape(flat, *avals)
        if own_mesh:
            named = {tuple(dict(m.shape).items()) for m in meshes(jax.make_jaxpr(flat)(*avals))}
            if named - {tuple(dict(s.mesh_axes.axes).items())}:
                raise InvalidArgument(f"{self.name}: it names a mesh of {sorted(named)}, not the slice's")
        out_tree, out_views, type_specs, fixed = out_box
        if self.out_specs is None and s.explicit:  # results keep their types' shardings
            out_specs = [Spec.of(spec) for spec in type_specs]
        else:  # (one spec per leaf, the fixed ones' left out)
            each = leaf_specs(self.out_specs, with_fixed(out_tree, fixed, shapes), "out_specs")
            at = {i for i, _ in fixed}
            out_specs = [spec for i, spec in enumerate(each) if i not in at]
        out_avals = [Aval(tuple(a.shape), dtype_name(a.dtype)) for a in shapes]
        for i, (spec, a) in enumerate(zip(out_specs, out_avals, strict=True)):
            spec.check(a, axes, f"out_specs (leaf {i})")

        jitted = jax.jit(flat, in_shardings=tuple(map(sharding, in_specs)),
                         out_shardings=tuple(map(sharding, out_specs)))
        try:
            # Each operation's location is its line in the function, not the chain of calls
            # that led there: the same function exported from two call sites (or processes)
            # is the same artifact, which the server registers once.
            with _full_tracebacks(False) if _full_tracebacks is not None else contextlib.nullcontext():
                artifact = bytes(jax.export.export(jitted, platforms=[s.export_platform])(*avals).serialize())
        except Exception:
            callbacks = sorted(host_callbacks(jax.make_jaxpr(flat)(*avals)))
            if not callbacks:
                raise
            raise InvalidArgument(
                f"{self.name}: its host callbacks ({', '.join(callbacks)}) cannot run on the executors: "
                "jax.export cannot carry the Python functions they call. Remove jax.debug.print, "
                "jax.pure_callback or io_callback from it, or run that part in the client") from None
        outputs = [(s.id, a, sp, v) for a, sp, v in zip(out_avals, out_specs, out_views, strict=True)]
        return Export(artifact, in_specs, out_specs, out_avals, out_views, out_tree, outputs, fixed,
                      source=(flat, avals))

    def vjp(self, exported: Export, wrt: Sequence[bool], cts: Sequence[bool],
            acc: Sequence[bool] = ()) -> VjpExport:
        """One exported signature's forward with residuals and its backward (`client.vjp`),
        traced as the signature was: with the slice as the context mesh, else without."""
        flat, avals = exported.source
        s = self.slice

        def export() -> VjpExport:
            return export_vjp(flat, avals, exported.in_specs, exported.out_specs, wrt, cts, s.abstract_mesh,
                              s.export_platform, acc)

        with jitting(self.name):
            try:
                with use_abstract_mesh(s.abstract_mesh):
                    return export()
            except IsthmusError:
                raise
            except Exception as in_context:
                try:
                    return export()
                except Exception:
                    raise in_context from None

    def _register(self, session: Calls, exported: Export) -> str:
        try:
            record = session.register("/v1/computations", {
                "slice_id": self.slice.id,
                "artifact": base64.b64encode(exported.artifact).decode(),
                "in_specs": [sp.to_json() for sp in exported.in_specs],
                "out_specs": [sp.to_json() for sp in exported.out_specs],
                "name": self.name,
            })
        except InvalidArgument as e:
            if "body: larger than" not in str(e):
                raise
            raise InvalidArgument(
                f"{self.name}: its exported program is {len(exported.artifact)} bytes, past what the server "
                f"takes ({e}). Arrays the function closes over are embedded in it: pass large ones as "
                "arguments instead") from None
        return record["id"]

    @property
    def registrations(self) -> tuple[str, ...]:
        """The ids of the computations its kept signatures registered on the server, oldest
        first (none before it is first called): what the REST API names them by."""
        return () if self._registered is None else tuple(self._registered.values())

    @property
    def exports(self) -> tuple[Export, ...]:
        """Its exported signatures (each one's artifact, specs and avals), oldest first."""
        return tuple(self._exports.values())

    def __repr__(self) -> str:
        return f"isthmus.Function({self.name} on {self.slice.id})"


def _type_spec(value: Any) -> Any:
    """The spec of a traced value's type (its sharding on a mesh with Explicit axes: the
    result of `jax.eval_shape` loses it where the mesh also has Auto axes)."""
    return getattr(getattr(jax.typeof(value), "sharding", None), "spec", None)


def equations(jaxpr: Any) -> Iterator[Any]:
    """The equations of `jaxpr` and of the jaxprs inside it."""
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        yield eqn
        for param in eqn.params.values():
            for inner in param if isinstance(param, tuple | list) else (param,):
                if hasattr(inner, "eqns") or hasattr(getattr(inner, "jaxpr", None), "eqns"):
                    yield from equations(inner)


def host_callbacks(jaxpr: Any) -> set[str]:
    """The names of the primitives of `jaxpr` (and of the jaxprs inside it) that call back
    into the Python process that traced it."""
    return {e.primitive.name for e in equations(jaxpr)
            if "callback" in e.primitive.name or e.primitive.name == "debug_print"}


def meshes(jaxpr: Any) -> list[Any]:
    """The meshes the equations of `jaxpr` name (a shard_map's, say)."""
    return [v for e in equations(jaxpr) for v in e.params.values() if isinstance(v, Mesh | AbstractMesh)]


def default_name(fn: Any, fallback: str) -> str:
    """A function's `__name__` as the server takes it: cut to `NAME_KEPT` characters."""
    return str(getattr(fn, "__name__", fallback))[:NAME_KEPT] or fallback
