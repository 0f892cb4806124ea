"""Host plans: the lowest level of the IR, what one host runs for one program.

Contract:
- A `HostPlan` is one host's part of a lowered program: the program arguments it holds,
  its steps in the order it must run them, the program results it produces, and the
  executables it must have compiled. Values are the IR's value names, local to one run.
- Steps are plain frozen values (no Ray, no JAX): `Compute` runs a compiled executable,
  `Reshard` moves a value between device sets or shardings of this host, `Send` hands a
  value to another host, `Recv` takes one from another host (paired by `tag`).
- `order[i]` is the position of `steps[i]` in the program's one global schedule: every
  host's steps are a subsequence of it, which is what makes runs deadlock-free, and what
  sequential dispatch walks.
- A `DeviceMesh` is a slice's devices as its hosts' executors name them, with its mesh
  axes: local indices on one host; `(rank, local index)` pairs on a slice spanning the hosts
  of an island's JAX group. `ir.passes.plans.device_mesh` is the one rule that names them.
- `executable_key` names a compiled executable on a host: the artifact's content hash and
  the device mesh it is compiled for. Calls and programs share it (a call is a one-node
  program).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property

from ir.types import Spec

Axes = tuple[tuple[str, int], ...]
Device = int | tuple[int, int]  # a local index, or (rank in the island's JAX group, local index)


@dataclass(frozen=True)
class DeviceMesh:
    devices: tuple[Device, ...]  # in mesh order (row-major, as `jax.sharding.Mesh` lays them out)
    axes: Axes


def executable_key(artifact: str, mesh: DeviceMesh) -> str:
    """`<24 hex of the artifact hash>@<devices>/<mesh axes>`."""
    digest = artifact.split(":", 1)[-1][:24]
    axes = ",".join(f"{name}={size}" for name, size in mesh.axes)
    devices = ",".join(str(d) if isinstance(d, int) else f"{d[0]}:{d[1]}" for d in mesh.devices)
    return f"{digest}@{devices}/{axes}"


@dataclass(frozen=True)
class Compute:
    key: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    label: str


@dataclass(frozen=True)
class Reshard:
    input: str
    output: str
    mesh: DeviceMesh
    spec: Spec


@dataclass(frozen=True)
class Send:
    input: str
    to: tuple[str, ...]  # every host of the receiving slice
    tag: str


@dataclass(frozen=True)
class Recv:
    output: str
    sources: tuple[str, ...]  # every host of the sending slice
    tag: str
    mesh: DeviceMesh
    spec: Spec


Step = Compute | Reshard | Send | Recv


@dataclass(frozen=True)
class CompileJob:
    """An executable this host needs: `artifact` is a hash in the program's artifact table."""

    key: str
    artifact: str
    mesh: DeviceMesh
    in_specs: tuple[Spec, ...]
    out_specs: tuple[Spec, ...]


@dataclass(frozen=True)
class HostPlan:
    host: str
    args: tuple[tuple[int, str], ...]  # (program argument position, value)
    steps: tuple[Step, ...]
    order: tuple[int, ...]  # global schedule position of each step
    results: tuple[tuple[int, str], ...]  # (program result position, value)
    compiles: tuple[CompileJob, ...]

    @cached_property
    def key(self) -> str:
        """A content hash: hosts cache plans by it, so a plan travels once (computed once)."""
        return "plan:" + hashlib.sha256(repr(self).encode()).hexdigest()[:24]

    def to_json(self) -> dict[str, object]:
        """A readable dump (debugging, `isthmus program show --plans`)."""
        def step(s: Step) -> dict[str, object]:
            fields = {k: (v.to_json() if isinstance(v, Spec) else vars(v) if isinstance(v, DeviceMesh) else v)
                      for k, v in vars(s).items()}
            return {"step": type(s).__name__.lower(), **fields}

        return json.loads(json.dumps({
            "host": self.host, "args": self.args, "results": self.results,
            "steps": [step(s) | {"order": o} for s, o in zip(self.steps, self.order, strict=True)],
        }))
