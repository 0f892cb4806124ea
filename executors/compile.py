"""Turn a serialized `jax.export` artifact into an executable on concrete local devices.

The artifact was exported by the client against an `AbstractMesh`; here the slice's
physical devices give the concrete `Mesh` of the same axes. The shardings the client
declared must be the ones the artifact carries, or compiling fails with both named.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ir import DeviceMesh, Spec
from ir.fused import Fused, decode_fused


def make_mesh(mesh: DeviceMesh) -> Mesh:
    """The concrete mesh: local devices by index, or, on a slice spanning the hosts of an
    island's JAX group, (process, index) pairs naming any process's devices."""
    local = jax.local_devices()
    chosen = np.array([local[d] if isinstance(d, int) else _process_devices(d[0])[d[1]]
                       for d in mesh.devices], dtype=object)
    return Mesh(chosen.reshape([s for _, s in mesh.axes]), tuple(n for n, _ in mesh.axes))


def _process_devices(process: int) -> list[Any]:
    return sorted((d for d in jax.devices() if d.process_index == process), key=lambda d: d.id)


def named(mesh: Mesh, spec: Spec) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(*spec.entries))


@functools.lru_cache(maxsize=1024)
def sharding_of(mesh: DeviceMesh, spec: Spec) -> NamedSharding:
    """A slice's sharding, built once per process: the devices a mesh names never change in
    a process, and building one costs more than a small value's placement."""
    return named(make_mesh(mesh), spec)


@dataclass(frozen=True, slots=True)
class HostArray:
    """A value received whole for devices of this process, still in host memory. A
    computation takes `array` as its argument as it is: JAX places it while it calls the
    executable, one transfer and none of `jax.device_put`'s Python (about 25 of a move's
    microseconds on a small CPU machine). Whatever else needs it on devices places it
    (`on_devices`); whatever reads it as numpy reads `array`."""

    array: np.ndarray
    sharding: NamedSharding

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        return np.asarray(self.array, dtype)


def on_devices(value: Any) -> Any:
    """A `HostArray` placed on its devices (ready); any other value as it is."""
    if isinstance(value, HostArray):
        return jax.block_until_ready(jax.device_put(value.array, value.sharding))
    return value


def host_copy(array: Any) -> np.ndarray:
    """A fully addressable array's value in host memory, C-contiguous, without leaving that
    copy on the array.

    A `jax.Array` on an accelerator keeps the host copy that `np.asarray` makes of it for as
    long as it lives. A buffer fetched once would then hold its size again in the executor's
    host memory until it is deleted, which no pool counts: a client keeping the results it
    has fetched would use twice what its claims allow (seen on an H100 machine). So the copy
    is made of a second `jax.Array` over the same device buffers, and goes with it. On CPU
    the value is the device buffer itself: JAX neither copies nor keeps anything."""
    if all(d.platform == "cpu" for d in array.sharding.device_set):
        value = np.asarray(array)
    else:
        shards = [s.data for s in array.addressable_shards]
        value = np.asarray(jax.make_array_from_single_device_arrays(array.shape, array.sharding, shards))
    return value if value.flags.c_contiguous else np.ascontiguousarray(value)  # (keeps a scalar 0-d)


def place(array: Any, mesh: DeviceMesh, spec: Spec) -> Any:
    """A host array on a slice's devices, ready; on a slice spanning hosts, this process's
    shards of it (every host of the slice places the same whole array)."""
    sharding = sharding_of(mesh, spec)
    if sharding.is_fully_addressable:
        return jax.block_until_ready(jax.device_put(array, sharding))
    placed = jax.make_array_from_callback(np.shape(array), sharding, lambda index: array[index])
    return jax.block_until_ready(placed)


def compile_artifact(
    artifact: bytes, mesh: Mesh, in_specs: Sequence[Spec], out_specs: Sequence[Spec]
) -> Callable[..., Any]:
    """Deserialize, check the declared shardings against the artifact, and compile."""
    fused = decode_fused(artifact)
    if fused is not None:
        return _compile_fused(fused, mesh, in_specs, out_specs)
    exported = jax.export.deserialize(bytearray(artifact))
    in_sh = [named(mesh, s) for s in in_specs]
    out_sh = [named(mesh, s) for s in out_specs]
    if len(in_sh) != len(exported.in_avals) or len(out_sh) != len(exported.out_avals):
        raise ValueError(
            f"declared {len(in_sh)} inputs / {len(out_sh)} outputs; the artifact has "
            f"{len(exported.in_avals)} / {len(exported.out_avals)}"
        )
    typed = Mesh(mesh.devices, mesh.axis_names, axis_types=export_axis_types(exported, mesh.axis_types))
    _check_shardings("input", exported.in_shardings_jax(typed), in_sh, exported.in_avals)
    _check_shardings("output", exported.out_shardings_jax(typed), out_sh, exported.out_avals)
    jitted = jax.jit(_flat(exported), in_shardings=tuple(in_sh), out_shardings=tuple(out_sh))
    args = [
        jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
        for a, s in zip(exported.in_avals, in_sh, strict=True)
    ]
    return jitted.lower(*args).compile()


def _flat(exported: Any) -> Callable[..., tuple[Any, ...]]:
    """The exported function over its flat inputs, returning its flat outputs: what the
    executors call. (The client exports functions of that form; an artifact exported by
    hand may take a pytree and return one, a single array say.)"""
    def flat(*leaves: Any) -> tuple[Any, ...]:
        args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, leaves)
        return tuple(jax.tree_util.tree_leaves(exported.call(*args, **kwargs)))

    return flat


def export_axis_types(exported: Any, default: tuple[Any, ...]) -> tuple[Any, ...]:
    """The axis types an artifact was traced with, which JAX wants of a mesh its shardings
    are read on: a function traced on Explicit axes carries its mesh in its avals' types;
    otherwise `default`. The executable runs the same shardings whichever the types."""
    for aval in (*exported.in_avals, *exported.out_avals):
        carried = getattr(getattr(aval, "sharding", None), "mesh", None)
        if carried is not None and carried.axis_names:
            return tuple(carried.axis_types)
    return default


def _compile_fused(fused: Fused, mesh: Mesh, in_specs: Sequence[Spec],
                   out_specs: Sequence[Spec]) -> Callable[..., Any]:
    """One executable calling the parts in order; each part's shardings were checked alone."""
    parts = [jax.export.deserialize(bytearray(p)) for p in fused.parts]
    in_sh = tuple(named(mesh, s) for s in in_specs)

    def composite(*args: Any) -> tuple[Any, ...]:
        values: dict[Any, Any] = {("in", k): a for k, a in enumerate(args)}
        for j, call in enumerate(fused.calls):
            outs = parts[call.part].call(*(values[r] for r in call.inputs))
            values.update({("out", j, k): o for k, o in enumerate(outs)})
        return tuple(values[r] for r in fused.outputs)

    jitted = jax.jit(composite, in_shardings=in_sh, out_shardings=tuple(named(mesh, s) for s in out_specs))
    avals = _fused_avals(parts, fused)
    args = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s) for a, s in zip(avals, in_sh, strict=True)]
    return jitted.lower(*args).compile()


def _fused_avals(parts: Sequence[Any], fused: Fused) -> list[Any]:
    """The fused computation's input avals, from the parts that read them."""
    avals: dict[int, Any] = {}
    for call in fused.calls:
        for ref, aval in zip(call.inputs, parts[call.part].in_avals, strict=True):
            if ref[0] == "in":
                avals.setdefault(ref[1], aval)
    return [avals[k] for k in range(len(avals))]


def _check_shardings(what: str, carried: Sequence[Any], declared: Sequence[NamedSharding],
                     avals: Sequence[Any]) -> None:
    for i, (c, d, aval) in enumerate(zip(carried, declared, avals, strict=True)):
        if c is not None and not c.is_equivalent_to(d, len(aval.shape)):
            raise ValueError(
                f"{what} {i}: the artifact is sharded {getattr(c, 'spec', c)}, "
                f"but {d.spec} was declared"
            )
