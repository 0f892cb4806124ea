"""A computation's reverse mode, exported from JAX: a forward that also returns its residuals,
and a backward that takes them with its outputs' cotangents (what `ir.autodiff.Rules.vjp`
gives the IR's reverse pass).

Contract:
- `export_vjp` takes a flat function (array leaves in, a tuple of array leaves out), its
  inputs' avals and specs and its outputs' specs on a slice's mesh, the inputs to
  differentiate in (`wrt`) and the outputs whose cotangents come (`cts`). The forward is
  `jax.vjp` of the function in the `wrt` inputs, returning the outputs and then the
  pullback's residual arrays (`jax.tree.flatten` of it); the backward rebuilds the pullback
  from the residuals and applies it to the cotangents given (zeros for the outputs not in
  `cts`), returning the `wrt` inputs' cotangents, each with its input's spec.
- A residual that is one of the function's inputs or outputs itself (a weight a matmul
  reads, an activation it returns) is not an output of the forward: the backward reads that
  input or output (`VjpExport.sources`), so nothing is stored twice, and a loop's invariant
  read by its backward need not be saved each iteration.
- A residual keeps one spec, the forward's output sharding and the backward's input
  sharding alike, so it never leaves its slice: its input's or output's spec, else the spec
  of the one input or output of the same aval, else replicated (correct, though XLA may
  then gather it).
- Both are exported as `Function` calls are (`jax.jit` with the shardings, `jax.export`
  for the slice's platform): artifacts the executors run as any other computation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import AbstractMesh, NamedSharding, PartitionSpec

from ir import Aval, InvalidArgument, Spec, dtype_name, parse_dtype


@dataclass(frozen=True)
class VjpExport:
    """The serialized forward and backward, each residual's aval and spec (what the backward
    takes first), and where each comes from (`ir.autodiff.sweep.Vjp.sources`)."""

    fwd: bytes
    bwd: bytes
    residuals: tuple[tuple[Aval, Spec], ...]
    sources: tuple[tuple[str, int], ...]


def export_vjp(flat: Callable[..., tuple[Any, ...]], avals: Sequence[jax.ShapeDtypeStruct],
               in_specs: Sequence[Spec], out_specs: Sequence[Spec], wrt: Sequence[bool],
               cts: Sequence[bool], mesh: AbstractMesh, platform: str,
               acc: Sequence[bool] = ()) -> VjpExport:
    """The forward and backward of `flat` (see the module); with `acc` (a mask over the `wrt`
    inputs), the backward takes one more input per masked one after the cotangents, and
    returns that input's cotangent added to it (an accumulator, as a loop's invariant keeps)."""
    if len(wrt) != len(avals) or len(in_specs) != len(avals) or not any(wrt):
        raise InvalidArgument(f"vjp: expected a wrt mask over the {len(avals)} inputs, one set; got {wrt}")
    which = [i for i, w in enumerate(wrt) if w]
    box: list[Any] = []

    def traced(*xs: Any) -> tuple[Any, ...]:
        """The outputs and every residual, with where each residual comes from (in `box`)."""
        def of(*d: Any) -> tuple[Any, ...]:
            full = list(xs)
            for i, v in zip(which, d, strict=True):
                full[i] = v
            return tuple(flat(*full))

        ys, pullback = jax.vjp(of, *(xs[i] for i in which))
        residuals, tree = jax.tree_util.tree_flatten(pullback)
        box[:] = [tree, _sources(residuals, xs, ys)]
        return (*ys, *residuals)

    def fwd(*xs: Any) -> tuple[Any, ...]:
        """The outputs, then the residuals that are neither an input nor an output."""
        made = traced(*xs)
        ys = made[:len(out_specs)]
        return (*ys, *(r for r, (kind, _) in zip(made[len(ys):], box[1], strict=True) if kind == "res"))

    shapes = jax.eval_shape(traced, *avals)
    outs = len(out_specs)
    if len(cts) != outs or len(shapes) < outs:
        raise InvalidArgument(f"vjp: expected a cts mask over the {outs} outputs, got {cts}")
    tree, sources = box
    out_avals = [_aval(s) for s in shapes[:outs]]
    res_avals = [_aval(s) for s in shapes[outs:]]
    known = [*zip(map(_aval, avals), in_specs, strict=True), *zip(out_avals, out_specs, strict=True)]
    res_specs = [in_specs[i] if kind == "in" else out_specs[i] if kind == "out" else _residual_spec(a, known)
                 for a, (kind, i) in zip(res_avals, sources, strict=True)]
    res_shapes = list(shapes[outs:])
    ct_shapes = [shapes[k] for k in range(outs) if cts[k]]

    added = list(acc) or [False] * len(which)
    if len(added) != len(which):
        raise InvalidArgument(f"vjp: expected an acc mask over the {len(which)} inputs differentiated, "
                              f"got {acc}")

    def bwd(*given: Any) -> tuple[Any, ...]:
        pullback = jax.tree_util.tree_unflatten(tree, list(given[:len(res_shapes)]))
        it = iter(given[len(res_shapes):])
        ct = tuple(next(it) if cts[k] else jnp.zeros(shapes[k].shape, shapes[k].dtype) for k in range(outs))
        return tuple(g + next(it) if a else g for g, a in zip(pullback(ct), added, strict=True))

    def sharding(spec: Spec) -> NamedSharding:
        return NamedSharding(mesh, PartitionSpec(*spec.entries))

    fwd_specs = [*out_specs, *(r for r, (kind, _) in zip(res_specs, sources, strict=True) if kind == "res")]
    bwd_out = [in_specs[i] for i in which]
    bwd_in = [*res_specs, *(out_specs[k] for k in range(outs) if cts[k]),
              *(s for s, a in zip(bwd_out, added, strict=True) if a)]
    acc_shapes = [avals[i] for i, a in zip(which, added, strict=True) if a]
    exported_fwd = _export(fwd, avals, [sharding(s) for s in in_specs], [sharding(s) for s in fwd_specs],
                           platform)
    if box[1] != sources:  # (traced twice: the same function, the same residuals)
        raise InvalidArgument(f"vjp: the residuals' sources changed between traces: {sources} then {box[1]}")
    return VjpExport(
        exported_fwd,
        _export(bwd, [*res_shapes, *ct_shapes, *acc_shapes], [sharding(s) for s in bwd_in],
                [sharding(s) for s in bwd_out], platform),
        tuple(zip(res_avals, res_specs, strict=True)), sources)


def _sources(residuals: Sequence[Any], inputs: Sequence[Any],
             outputs: Sequence[Any]) -> tuple[tuple[str, int], ...]:
    """Per residual: `("in", i)` where it is input i itself (a traced value, by identity),
    `("out", k)` where it is output k, else `("res", j)`, the j-th of those computed."""
    made, out = 0, []
    for r in residuals:
        source = next((("in", i) for i, x in enumerate(inputs) if r is x), None) or \
            next((("out", k) for k, y in enumerate(outputs) if r is y), None)
        if source is None:
            source, made = ("res", made), made + 1
        out.append(source)
    return tuple(out)


def export_fill(aval: Aval, spec: Spec, value: float, mesh: AbstractMesh, platform: str) -> bytes:
    """A computation of no inputs: an array of `aval` filled with `value` (a cotangent's zeros,
    the loss's seed)."""
    dtype = parse_dtype(aval.dtype)
    return _export(lambda: (jnp.full(aval.shape, value, dtype),), [], [],
                   [NamedSharding(mesh, PartitionSpec(*spec.entries))], platform)


def export_add(aval: Aval, spec: Spec, n: int, mesh: AbstractMesh, platform: str) -> bytes:
    """A computation of `n` inputs of `aval`: their sum (a value's cotangents, added)."""
    sharding = NamedSharding(mesh, PartitionSpec(*spec.entries))
    shape = jax.ShapeDtypeStruct(aval.shape, parse_dtype(aval.dtype))

    def add(*parts: Any) -> tuple[Any, ...]:
        total = parts[0]
        for part in parts[1:]:
            total = total + part
        return (total,)

    return _export(add, [shape] * n, [sharding] * n, [sharding], platform)


def _export(fn: Callable[..., Any], avals: Sequence[Any], ins: Sequence[NamedSharding],
            outs: Sequence[NamedSharding], platform: str) -> bytes:
    jitted = jax.jit(fn, in_shardings=tuple(ins), out_shardings=tuple(outs))
    avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False)) for a in avals]
    return bytes(jax.export.export(jitted, platforms=[platform])(*avals).serialize())


def _aval(shape: Any) -> Aval:
    return Aval(tuple(shape.shape), dtype_name(shape.dtype))


def _residual_spec(aval: Aval, known: Sequence[tuple[Aval, Spec]]) -> Spec:
    """The spec of the one input or output of the same aval, else replicated."""
    same = {spec for a, spec in known if a == aval}
    return next(iter(same)) if len(same) == 1 else Spec.of(())
