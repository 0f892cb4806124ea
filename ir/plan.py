"""Host plans: the lowest level of the IR, what one host runs for one program.

Contract:
- A `HostPlan` is one host's part of a lowered program: the program arguments it holds,
  its steps in the order it must run them, the program results it produces, and the
  executables it must have compiled. Values are the IR's value names, local to one run.
- Steps are plain frozen values (no Ray, no JAX): `Compute` runs a compiled executable,
  `Reshard` moves a value between device sets or shardings of this host, `Send` hands a
  value to another host, `Recv` takes one from another host (paired by `tag`), `Push` saves
  a value on a per-run stack in one loop's iterations and `Pop` takes it back, last first, in
  another's (reverse mode's residuals).
- In-graph control flow lowers to the five primitives of TensorFlow's dynamic control flow
  (Yu et al., EuroSys 2018), each applied to a tuple of values at once: `Enter` a frame,
  `Merge` (a loop head: the entered values in iteration 0, the `NextIteration` values
  after; after a conditional: the one live input), `Switch` (the inputs go to the branch
  the predicate names, every other branch gets dead values), `NextIteration` (the carry of
  the next iteration; the frame jumps back to its `Merge` while the predicate is true) and
  `Exit` (leave the frame). Values carry `(is_dead, tag)`: a step whose `guards` entry
  names a dead value, or that reads one, defines dead values without running. Inside a
  frame, send and receive keys carry the frame and iteration (`ir.plan.frame_tag`).
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
    # A loop's or branch's predicate, which only control steps read: kept in host memory,
    # never placed on a device (placing it would cost more than reading it).
    on_host: bool = False


@dataclass(frozen=True)
class Enter:
    """Values into `frame`; the first step of this host's part of the frame (its iteration 0).
    `parallel`: how many of the frame's iterations the host may run at once."""

    frame: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    parallel: int = 1


@dataclass(frozen=True)
class Merge:
    """`frame` set: a loop head, `outputs[i]` is `inputs[i][0]` (entered) in iteration 0 and
    `inputs[i][1]` (the previous `NextIteration`) after. `frame` None: the end of a
    conditional, `outputs[i]` is the live one of `inputs[i]` (one per branch), or dead."""

    frame: str | None
    inputs: tuple[tuple[str, ...], ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Switch:
    """`outputs[b]` (one tuple per branch) get `inputs` for the branch `b` the predicate names
    (a bool: 0 false, 1 true; an int32: clamped to the branches), and `pivots[b]` a live
    token; the other branches get dead values. A dead or failed predicate makes every branch
    dead or failed."""

    pred: str
    inputs: tuple[str, ...]
    outputs: tuple[tuple[str, ...], ...]
    pivots: tuple[str, ...]


@dataclass(frozen=True)
class NextIteration:
    """`outputs` := `inputs` for the next iteration of `frame`; while `pred` is live and
    true, the frame goes on at its `Merge` with the iteration tag increased."""

    frame: str
    pred: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Exit:
    """Values out of `frame`; the frame's last step on this host (its state is freed). With
    `trips`, a loop that ran (its predicate not dead) saves how many iterations it ran on
    that stack, keyed as a `Push` of depth `trips_depth` (a `REPEAT` takes it back)."""

    frame: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    trips: str | None = None
    trips_depth: int = 0


@dataclass(frozen=True)
class Count:
    """`output` := whether the frame's iteration is below `trips` (a count the frame was
    entered with): the local predicate of a `REPEAT`, no computation and no send."""

    frame: str
    trips: str
    output: str


@dataclass(frozen=True)
class Push:
    """Save `input` on the run's `stack`, keyed by the iterations of the `depth` innermost
    open frames (the frames around those are its context); a dead value saves nothing."""

    input: str
    stack: str
    depth: int
    swap: bool = True  # it may move to host memory past the host's device budget


@dataclass(frozen=True)
class Pop:
    """`output` := the value of the run's `stack` with the greatest key in the context of the
    frames around the `depth` innermost open ones, taken off the stack."""

    output: str
    stack: str
    depth: int


Step = Compute | Reshard | Send | Recv | Enter | Merge | Switch | NextIteration | Exit | Count | Push | Pop
ControlStep = Enter | Merge | Switch | NextIteration | Exit | Count


def reads(step: Step) -> tuple[str, ...]:
    """The values a step reads (its guard, which `HostPlan.guard` names, aside)."""
    match step:
        case Compute() | Enter() | Exit():
            return step.inputs
        case Reshard() | Send() | Push():
            return (step.input,)
        case Merge():
            return tuple(v for values in step.inputs for v in values)
        case Switch() | NextIteration():
            return (step.pred, *step.inputs)
        case Count():
            return (step.trips,)
    return ()


def defines(step: Step) -> tuple[str, ...]:
    """The values a step defines (a failed or dead step defines them as such)."""
    match step:
        case Compute() | Enter() | Exit() | Merge() | NextIteration():
            return step.outputs
        case Reshard() | Recv() | Pop() | Count():
            return (step.output,)
        case Switch():
            return (*(v for values in step.outputs for v in values), *step.pivots)
    return ()


def frame_tag(tag: str, frames: tuple[tuple[str, int], ...]) -> str:
    """A send/receive key inside frames: the tag, then each enclosing frame and iteration."""
    return tag + "".join(f"/{frame}:{k}" for frame, k in frames)


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
    guards: tuple[str | None, ...] = ()  # per step: a pivot that must be live, or None; () none
    held: int = 0  # bytes of its own values a run holds here at once, at most (`ir.passes.footprint`)

    def guard(self, i: int) -> str | None:
        return self.guards[i] if self.guards else None

    def used(self, i: int) -> tuple[str, ...]:
        """What step i reads, its guard (the pivot of its branch) included."""
        guard = self.guard(i)
        return reads(self.steps[i]) + ((guard,) if guard else ())

    @cached_property
    def loops(self) -> bool:
        """Whether the plan has a loop or a branch (guarded steps or control steps); worked
        out once per plan, not per run."""
        return bool(self.guards) or any(isinstance(s, ControlStep) for s in self.steps)

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
            "host": self.host, "args": self.args, "results": self.results, "held": self.held,
            "steps": [step(s) | {"order": o} | ({"guard": g} if g else {})
                      for s, o, g in zip(self.steps, self.order, self.guards or (None,) * len(self.steps),
                                         strict=True)],
            "text": self.text(),
        }))

    def text(self) -> list[str]:
        """The plan as lines, one step a line, frames indented: the per-host state machines."""
        lines, depth = [], 1
        for i, s in enumerate(self.steps):
            if isinstance(s, Exit):
                depth -= 1
            guard = self.guard(i)
            lines.append("  " * depth + step_line(s) + (f"  if {guard}" if guard else ""))
            if isinstance(s, Enter):
                depth += 1
        return [f"host {self.host}: (holds at most {self.held} bytes of its own values at once)", *lines]


def _values(names: tuple[str, ...]) -> str:
    return "(" + ", ".join(names) + ")"


def step_line(s: Step) -> str:
    """One step as text."""
    match s:
        case Compute():
            return f"{_values(s.outputs)} = compute {s.label} {_values(s.inputs)}"
        case Reshard():
            return f"{s.output} = reshard {s.input} {s.spec}"
        case Send():
            return f"send {s.input} to {','.join(s.to)} tag {s.tag}"
        case Recv():
            where = " (host memory)" if s.on_host else ""
            return f"{s.output} = recv from {','.join(s.sources)} tag {s.tag}{where}"
        case Enter():
            parallel = f" parallel_iterations {s.parallel}" if s.parallel != 1 else ""
            return f"{_values(s.outputs)} = enter {s.frame} {_values(s.inputs)}{parallel}"
        case Merge():
            what = f"merge {s.frame}" if s.frame else "merge"
            return f"{_values(s.outputs)} = {what} " + " ".join(_values(i) for i in s.inputs)
        case Switch():
            outs = " | ".join(f"{p}: {_values(o)}" for p, o in zip(s.pivots, s.outputs, strict=True))
            return f"switch {s.pred} {_values(s.inputs)} -> {outs}"
        case NextIteration():
            return f"{_values(s.outputs)} = next_iteration {s.frame} {_values(s.inputs)} while {s.pred}"
        case Exit():
            trips = f" trips {s.trips} depth {s.trips_depth}" if s.trips else ""
            return f"{_values(s.outputs)} = exit {s.frame} {_values(s.inputs)}{trips}"
        case Count():
            return f"{s.output} = count {s.frame} below {s.trips}"
        case Push():
            return f"push {s.input} stack {s.stack} depth {s.depth}" + ("" if s.swap else " no_swap")
        case Pop():
            return f"{s.output} = pop stack {s.stack} depth {s.depth}"
    raise AssertionError(s)
