"""Read what the server must know of a client's `jax.export` artifact, without compiling it.

Contract: `inspect_artifact` returns an `ArtifactInfo` only for an artifact that passed
`server.artifact_policy` (no custom call outside jax.export's stable targets, no host
transfer or callback, no waived safety check, at most `max_ops` operations, at most
`max_bytes` bytes) and fits the slice (platform, device count, mesh axes); otherwise it
raises `InvalidArgument` naming the op, target or field. The artifact is read in a reader
process (`server.artifact_reader`), so bytes that crash MLIR's reader cost a 400, never the
server.

A fused artifact (`ir.fused`) is refused here: the `fuse` pass builds those on the server
from parts that were each inspected, and executors compile any artifact that starts like
one as fused, so a client may not send one.
"""

from __future__ import annotations

import atexit
import base64
import binascii
import functools
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ir import Aval, InvalidArgument, MeshAxes, Spec
from server.artifact_reader import ArtifactReader
from server.errors import PayloadTooLarge

if TYPE_CHECKING:
    from resource_manager import Slice


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


def _normal(spec: Spec) -> tuple[Any, ...]:
    entries = [e[0] if isinstance(e, tuple) and len(e) == 1 else (None if e == () else e)
               for e in spec.entries]
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def inspect_artifact(artifact: bytes, mesh: MeshAxes, platform: str, *, max_bytes: int | None = None,
                     max_ops: int | None = None, reader: ArtifactReader | None = None) -> ArtifactInfo:
    """Read a client's artifact for a slice of `mesh` on `platform`, or raise InvalidArgument
    naming what is wrong with it (PayloadTooLarge, a kind of it, over `max_bytes`)."""
    if max_bytes is not None and len(artifact) > max_bytes:
        # What makes an artifact large is nearly always an array its function closes over:
        # jax.export embeds it in the program as a constant.
        raise PayloadTooLarge(f"artifact: {len(artifact)} bytes; at most {max_bytes} (max_artifact_mb). "
                              "Arrays the function closes over are embedded in its exported program: "
                              "pass large ones as arguments instead")
    if artifact.startswith(b"{"):  # what ir.fused reads as fused; see the module docstring
        raise InvalidArgument("artifact: a fused artifact is made by the server from checked "
                              "parts, never sent; send the parts' jax.export artifacts")
    info = (reader or shared_reader()).read(artifact, mesh, platform, max_ops)
    return ArtifactInfo(
        tuple(Aval.from_json(a) for a in info["in_avals"]),
        tuple(Aval.from_json(a) for a in info["out_avals"]),
        tuple(info["platforms"]),
        int(info["nr_devices"]),
        tuple(None if s is None else Spec.of(s) for s in info["in_specs"]),
        tuple(None if s is None else Spec.of(s) for s in info["out_specs"]),
    )


@functools.cache
def shared_reader() -> ArtifactReader:
    """The process's reader, for callers that hold none: its child is started on first use
    and stopped when this process exits."""
    reader = ArtifactReader()
    atexit.register(reader.close)
    return reader


def decode_artifact(artifact_b64: str) -> bytes:
    """A registration's artifact bytes, from its base64."""
    try:
        return base64.b64decode(artifact_b64, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument("artifact: not valid base64") from None


def registration_digest(artifact_b64: str, rest: list[Any]) -> bytes:
    """A digest of what a registration says: its artifact, slice, specs and name."""
    h = hashlib.sha256(json.dumps(rest).encode())
    h.update(artifact_b64.encode())
    return h.digest()


def declared_specs(values: list[Any], avals: Sequence[Aval], s: Slice, field: str) -> tuple[Spec, ...]:
    """A registration's `in_specs` / `out_specs`, one per array, each fitting the slice."""
    if len(values) != len(avals):
        raise InvalidArgument(f"{field}: {len(values)} specs for {len(avals)} arrays")
    specs = tuple(Spec.from_json(v, f"{field}[{i}]") for i, v in enumerate(values))
    for i, (spec, aval) in enumerate(zip(specs, avals, strict=True)):
        spec.check(aval, s.mesh, f"{field}[{i}]")
    return specs
