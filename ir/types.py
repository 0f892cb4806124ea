"""Values shared by the IR and the wire: abstract values, partition specs, mesh axes.

They are frozen, validate themselves on construction, and convert to and from plain JSON
values (`to_json` / `from_json`), which is how they travel: never as pickles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ir.errors import InvalidArgument

DTYPES: dict[str, np.dtype] = {
    name: np.dtype(name)
    for name in (
        "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
        "float16", "float32", "float64", "complex64", "complex128",
    )
}
# JAX's narrow floats, from ml_dtypes. Sub-byte types (int4, float4) are not carried: XLA
# packs two to a byte, which a value received as numpy bytes does not match.
for _name in ("bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
              "float8_e4m3b11fnuz", "float8_e4m3", "float8_e3m4", "float8_e8m0fnu"):
    DTYPES[_name] = np.dtype(getattr(ml_dtypes, _name))

SpecEntry = str | tuple[str, ...] | None
# Bounds on what a request can describe: far above any real array or mesh, low enough that a
# hostile value fails by name rather than by the memory or time it takes.
MAX_RANK = 64
MAX_DIM = 1 << 62
MAX_MESH_AXES = 16
MAX_NAME = 64  # characters of a mesh axis name


def dtype_name(dtype: Any) -> str:
    """The wire name of a numpy/JAX dtype, refusing dtypes Isthmus does not carry."""
    name = np.dtype(dtype).name
    if name not in DTYPES:
        raise InvalidArgument(f"dtype {name!r} is not supported; expected one of {sorted(DTYPES)}")
    return name


def parse_dtype(name: str, field: str = "dtype") -> np.dtype:
    if name not in DTYPES:
        raise InvalidArgument(f"{field}: unknown dtype {name!r}; expected one of {sorted(DTYPES)}")
    return DTYPES[name]


@dataclass(frozen=True)
class Aval:
    """Shape and dtype of one array: what a computation's signature is made of."""

    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if len(self.shape) > MAX_RANK:
            raise InvalidArgument(f"shape: rank {len(self.shape)}; at most {MAX_RANK}")
        if not all(isinstance(d, int) and 0 <= d <= MAX_DIM for d in self.shape):
            raise InvalidArgument(f"shape {self.shape!r} must be a tuple of ints in [0, 2**62]")
        # numpy and XLA refuse an array whose dims (its zero ones left out) span more bytes
        # than this, even one of no elements: `(2**62, 0)` is refused here, by name
        if math.prod(d for d in self.shape if d) * parse_dtype(self.dtype).itemsize > MAX_DIM:
            raise InvalidArgument(f"shape {self.shape!r} of {self.dtype}: its dimensions span more than "
                                  "2**62 bytes, which no array can")

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPES[self.dtype].itemsize

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Aval:
        return cls(tuple(value["shape"]), value["dtype"])


@dataclass(frozen=True)
class MeshAxes:
    """The named axes of a virtual slice's mesh, in order: (("data", 2), ("model", 2))."""

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        if not self.axes:
            raise InvalidArgument("mesh: needs at least one axis, e.g. {'x': 4}")
        if len(self.axes) > MAX_MESH_AXES:
            raise InvalidArgument(f"mesh: {len(self.axes)} axes; at most {MAX_MESH_AXES}")
        names = [n for n, _ in self.axes]
        if len(set(names)) != len(names):
            raise InvalidArgument(f"mesh: axis names repeat in {names}")
        for name, size in self.axes:
            if not isinstance(name, str) or not name.isidentifier() or len(name) > MAX_NAME:
                raise InvalidArgument(f"mesh: axis name {str(name)[:MAX_NAME]!r} must be an identifier "
                                      f"of at most {MAX_NAME} characters")
            if not isinstance(size, int) or isinstance(size, bool) or size < 1:
                raise InvalidArgument(f"mesh: axis {name!r} has size {size!r}; expected int >= 1")

    @classmethod
    def of(cls, mesh: dict[str, int] | Sequence[tuple[str, int]]) -> MeshAxes:
        items = mesh.items() if isinstance(mesh, dict) else mesh
        return cls(tuple((name, size) for name, size in items))

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.axes)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(s for _, s in self.axes)

    @property
    def size(self) -> int:
        return math.prod(self.sizes)

    def to_json(self) -> dict[str, int]:
        return dict(self.axes)


@dataclass(frozen=True)
class Spec:
    """A partition spec: per array dimension, the mesh axis (or axes) it is split over."""

    entries: tuple[SpecEntry, ...] = ()

    def __post_init__(self) -> None:
        for e in self.entries:
            ok = e is None or isinstance(e, str) or (
                isinstance(e, tuple) and all(isinstance(a, str) for a in e)
            )
            if not ok:
                raise InvalidArgument(f"spec: entry {e!r} must be null, an axis name or a list")

    @classmethod
    def of(cls, spec: Any) -> Spec:
        """From a `jax.sharding.PartitionSpec`, a list, or None (fully replicated)."""
        if spec is None:
            return cls(())
        if isinstance(spec, Spec):
            return spec
        return cls(tuple(tuple(e) if isinstance(e, list | tuple) else e for e in spec))

    def axis_names(self) -> list[str]:
        out: list[str] = []
        for e in self.entries:
            out.extend([e] if isinstance(e, str) else list(e or ()))
        return out

    def check(self, aval: Aval, mesh: MeshAxes, what: str) -> None:
        """Raise unless this spec can shard `aval` over `mesh`."""
        if len(self.entries) > len(aval.shape):
            raise InvalidArgument(
                f"{what}: spec {self} has {len(self.entries)} entries but the array "
                f"{aval} has rank {len(aval.shape)}"
            )
        sizes = dict(mesh.axes)
        used = self.axis_names()
        for name in used:
            if name not in sizes:
                raise InvalidArgument(f"{what}: spec {self} names axis {name!r}; mesh has {mesh.names}")
        if len(set(used)) != len(used):
            raise InvalidArgument(f"{what}: spec {self} uses a mesh axis twice")
        for dim, e in zip(aval.shape, self.entries, strict=False):
            parts = math.prod(sizes[a] for a in ([e] if isinstance(e, str) else (e or ())))
            if dim % parts:
                raise InvalidArgument(
                    f"{what}: dimension of size {dim} of {aval} does not divide into {parts} "
                    f"shards along {e!r}"
                )

    def __str__(self) -> str:
        return "P(" + ", ".join(repr(e) for e in self.entries) + ")"

    def to_json(self) -> list[Any]:
        return [list(e) if isinstance(e, tuple) else e for e in self.entries]

    @classmethod
    def from_json(cls, value: Any, field: str = "spec") -> Spec:
        if value is None:
            return cls(())
        if not isinstance(value, list):
            raise InvalidArgument(f"{field}: expected a list such as [null, 'model'], got "
                                  f"{type(value).__name__}")
        if len(value) > MAX_RANK:
            raise InvalidArgument(f"{field}: {len(value)} entries; at most {MAX_RANK} (one per dimension)")
        for i, e in enumerate(value):  # checked flat: a nested value is refused, never walked
            names = e if isinstance(e, list) else [e]
            if e is not None and not all(isinstance(a, str) and len(a) <= MAX_NAME for a in names):
                raise InvalidArgument(f"{field}[{i}]: expected null, an axis name or a list of axis "
                                      f"names, got {type(e).__name__}")
        return cls.of(value)
