"""Read what the server must know of a `jax.export` artifact, without compiling it."""

from __future__ import annotations

from dataclasses import dataclass

from ir import Aval, InvalidArgument, dtype_name


@dataclass(frozen=True)
class ArtifactInfo:
    in_avals: tuple[Aval, ...]
    out_avals: tuple[Aval, ...]
    platforms: tuple[str, ...]
    nr_devices: int


def _aval(a: object, what: str) -> Aval:
    shape = getattr(a, "shape", ())
    if not all(isinstance(d, int) for d in shape):
        raise InvalidArgument(f"artifact: {what} has a symbolic shape {shape}; shapes must be static")
    return Aval(tuple(shape), dtype_name(a.dtype))


def inspect_artifact(artifact: bytes, slice_size: int, platform: str) -> ArtifactInfo:
    import jax

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
    return info
