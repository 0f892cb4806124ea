"""Read what the server must know of a `jax.export` artifact, without compiling it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ir import Aval, InvalidArgument, MeshAxes, Spec, dtype_name


@dataclass(frozen=True)
class ArtifactInfo:
    in_avals: tuple[Aval, ...]
    out_avals: tuple[Aval, ...]
    platforms: tuple[str, ...]
    nr_devices: int
    in_specs: tuple[Spec | None, ...]  # None: the artifact does not fix the sharding
    out_specs: tuple[Spec | None, ...]

    def check_specs(self, ins: Sequence[Spec], outs: Sequence[Spec], what: str) -> None:
        """Declared specs must be the artifact's own: a wrong claim is refused here, by name."""
        pairs = (("in_specs", ins, self.in_specs), ("out_specs", outs, self.out_specs))
        for field, declared, carried in pairs:
            for i, (d, c) in enumerate(zip(declared, carried, strict=True)):
                if c is not None and _normal(d) != _normal(c):
                    raise InvalidArgument(
                        f"{what}{field}[{i}]: declared {d}, but the artifact is sharded {c}"
                    )


def _aval(a: object, what: str) -> Aval:
    shape = getattr(a, "shape", ())
    if not all(isinstance(d, int) for d in shape):
        raise InvalidArgument(f"artifact: {what} has a symbolic shape {shape}; shapes must be static")
    return Aval(tuple(shape), dtype_name(a.dtype))


def _normal(spec: Spec) -> tuple[Any, ...]:
    entries = [e[0] if isinstance(e, tuple) and len(e) == 1 else (None if e == () else e)
               for e in spec.entries]
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def _specs(shardings: Sequence[Any]) -> tuple[Spec | None, ...]:
    return tuple(None if s is None or not hasattr(s, "spec") else Spec.of(s.spec) for s in shardings)


def inspect_artifact(artifact: bytes, mesh: MeshAxes, platform: str) -> ArtifactInfo:
    import jax
    from jax.sharding import AbstractMesh

    slice_size = mesh.size

    try:
        exported = jax.export.deserialize(bytearray(artifact))
    except Exception as e:  # any parse failure is the caller's bad artifact
        raise InvalidArgument(
            f"artifact: not a serialized jax.export artifact ({type(e).__name__}: {e})"[:400]
        ) from None
    info = ArtifactInfo(
        tuple(_aval(a, f"input {i}") for i, a in enumerate(exported.in_avals)),
        tuple(_aval(a, f"output {i}") for i, a in enumerate(exported.out_avals)),
        tuple(p.lower() for p in exported.platforms),
        exported.nr_devices,
        (), (),
    )
    wanted = {"gpu": ("cuda", "rocm")}.get(platform, (platform,))
    if not set(wanted) & set(info.platforms):
        raise InvalidArgument(
            f"artifact: exported for platforms {list(info.platforms)}; the slice runs on {platform}"
        )
    if info.nr_devices != slice_size:
        raise InvalidArgument(
            f"artifact: exported for {info.nr_devices} devices; the slice has {slice_size}"
        )
    abstract = AbstractMesh(mesh.sizes, mesh.names)
    try:
        ins, outs = _specs(exported.in_shardings_jax(abstract)), _specs(exported.out_shardings_jax(abstract))
    except Exception as e:  # shardings over other axes: the artifact was made for another mesh
        message = f"artifact: its shardings do not fit the slice's mesh {mesh.to_json()}: {e}"
        raise InvalidArgument(message[:400]) from None
    return ArtifactInfo(info.in_avals, info.out_avals, info.platforms, info.nr_devices, ins, outs)
