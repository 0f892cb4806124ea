"""The per-host loop-control state machine: the control-flow primitives of `ir.plan`.

Contract:
- A run's environment maps values to arrays, `Failure`s, `DEAD` (the value of an untaken
  branch, or of a loop's iteration past its end) or `LIVE` (a branch's pivot token). The
  value's tag is where the run is: `Frames`, a stack of `(frame, iteration)`; with one
  iteration at a time (`parallel_iterations` 1) a value's name and the stack name it.
- `step(...)` runs one primitive and answers the index of the next step: the following one,
  or, for a `NextIteration` whose predicate is live and true, the frame's `Merge` (the
  loop head) with the iteration increased. `Enter` pushes the frame, `Exit` pops it, so a
  finished loop leaves no state.
- A dead or failed predicate ends a loop and makes every branch of a `Switch` dead or
  failed: a host whose branch is not taken walks the branch's steps with dead values
  (no computation) and finishes; a failure ends every loop it reaches, on every host, since
  the predicate carries it there.
- `Layout` is worked out once per plan: each frame's loop head, the steps inside any frame
  (values used there live until the outermost frame's `Exit`), each loop's `Switch`, and
  the peers this host exchanges values with in each frame.
- A host that leaves a loop on a failed predicate tells those peers (`Abort`): whatever it
  would still have sent them in that frame fails at once (`aborted`) instead of being waited
  for. So a failure in receiving the predicate costs no timeout on the predicate's host.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from executors.messages import Abort
from executors.store import Failure
from ir import HostPlan
from ir.plan import ControlStep, Count, Enter, Exit, Merge, NextIteration, Switch, frame_tag


class _Dead:
    __slots__ = ()

    def __repr__(self) -> str:
        return "DEAD"


class _Live:
    __slots__ = ()

    def __repr__(self) -> str:
        return "LIVE"


DEAD: Any = _Dead()
LIVE: Any = _Live()


@dataclass
class Frames:
    """Where a run is: the open frames, innermost last, with their iteration."""

    stack: list[list[Any]] = field(default_factory=list)  # [frame, iteration]

    def tag(self, tag: str) -> str:
        return frame_tag(tag, tuple((f, k) for f, k in self.stack)) if self.stack else tag

    def prefix(self) -> str:
        """The key prefix of the innermost frame's every iteration: outer frames, then `/F:`."""
        return frame_tag("", tuple((f, k) for f, k in self.stack[:-1])) + f"/{self.stack[-1][0]}:"

    def where(self) -> str:
        """`iteration k of loop F` for each open frame, outermost first ('' outside loops)."""
        return ", ".join(f"iteration {k} of loop {f}" for f, k in self.stack)

    def __len__(self) -> int:
        return len(self.stack)


@dataclass(frozen=True)
class Layout:
    heads: dict[str, int]  # frame -> index of its Merge
    framed: tuple[tuple[int, int], ...]  # (first, last) step index of each outermost frame
    loops: dict[int, str]  # index of a loop's Switch -> its frame
    peers: dict[str, frozenset[str]]  # frame -> the hosts this host exchanges values with in it
    tails: dict[str, tuple[int, int]]  # frame -> index of its NextIteration and of its Exit

    @classmethod
    def of(cls, plan: HostPlan) -> Layout:
        heads, opened, framed, loops = {}, [], [], {}
        peers: dict[str, set[str]] = {}
        nexts, tails = {}, {}
        for i, s in enumerate(plan.steps):
            if isinstance(s, Merge) and s.frame is not None:
                heads[s.frame] = i
            elif isinstance(s, Enter):
                opened.append((i, s.frame))
                peers[s.frame] = set()
            elif isinstance(s, NextIteration):
                nexts[s.frame] = i
            elif isinstance(s, Exit):
                first, _ = opened.pop()
                tails[s.frame] = (nexts.get(s.frame, i), i)
                if not opened:
                    framed.append((first, i))
            elif isinstance(s, Switch) and opened and s.pivots[0] == f"%{opened[-1][1]}.exit":
                loops[i] = opened[-1][1]
            for _, frame in opened:
                peers[frame].update(getattr(s, "to", ()), getattr(s, "sources", ()))
        return cls(heads, tuple(framed), loops, {f: frozenset(h) for f, h in peers.items()}, tails)

    def inside(self, i: int) -> tuple[int, int] | None:
        return next(((a, b) for a, b in self.framed if a <= i <= b), None)


def aborted(key: str, abort: Abort) -> bool:
    """Whether a mailbox key (`<tag>@<source><frames>`) is one the aborting host would fill."""
    source, _, frames = key.rpartition("@")[2].partition("/")
    return source == abort.host and ("/" + frames).startswith(abort.prefix)


def blocked(values: list[Any]) -> Any:
    """What a step reading `values` defines instead of computing: DEAD if one is dead, the
    first failure if one failed; None when it may run."""
    failure = None
    for v in values:  # (a loop, not generators: it runs once per step)
        if v is DEAD:
            return DEAD
        if failure is None and isinstance(v, Failure):
            failure = v
    return failure


def step(s: ControlStep, i: int, env: MutableMapping[str, Any], frames: Frames, layout: Layout,
         guard: Any = None) -> int:
    match s:
        case Enter():
            for out, value in zip(s.outputs, s.inputs, strict=True):
                env[out] = env[value] if guard is None else guard
            frames.stack.append([s.frame, 0])
        case Merge(frame=None):
            for out, choices in zip(s.outputs, s.inputs, strict=True):
                env[out] = next((env[c] for c in choices if env.get(c, DEAD) is not DEAD), DEAD)
        case Merge():
            side = 0 if frames.stack[-1][1] == 0 else 1
            for out, (entered, nxt) in zip(s.outputs, s.inputs, strict=True):
                env[out] = env[entered] if side == 0 else env.pop(nxt)
        case Switch():
            _switch(s, env, frames)
        case NextIteration():
            if _taken(env[s.pred]) == 1:
                for out, value in zip(s.outputs, s.inputs, strict=True):
                    env[out] = env[value]
                frames.stack[-1][1] += 1
                return layout.heads[s.frame]
        case Exit():
            for out, value in zip(s.outputs, s.inputs, strict=True):
                env[out] = env[value]
            frames.stack.pop()
        case Count():
            env[s.output] = _counted(env, s, frames)
    return i + 1


def _counted(env: MutableMapping[str, Any], s: Count, frames: Frames) -> Any:
    """Whether the frame's iteration is below its trip count: a popped count, a received
    one, or the array its computation made here, read once (its failure in XLA shows as it
    is read: the count is then that failure, kept for the iterations after)."""
    trips = env[s.trips]
    if trips is DEAD or isinstance(trips, Failure):
        return trips
    if not isinstance(trips, int):
        try:
            trips = env[s.trips] = int(trips)  # the later iterations compare with a plain int
        except Exception as e:
            trips = env[s.trips] = Failure(f"in {frames.where()}: the trip count: {type(e).__name__}: {e}")
            return trips
    return np.bool_(frames.stack[-1][1] < trips)


def _taken(pred: Any) -> int | None:
    """The branch a live predicate names (bool: 0/1; int32: as is); None when dead or failed."""
    if pred is DEAD or isinstance(pred, Failure):
        return None
    value = np.asarray(pred)
    return int(bool(value)) if value.dtype == np.bool_ else int(value)


def _switch(s: Switch, env: MutableMapping[str, Any], frames: Frames) -> None:
    pred = env[s.pred]
    try:
        taken = _taken(pred)
    except Exception as e:  # the predicate's computation failed in XLA: the error is in its array
        pred = env[s.pred] = Failure(f"{type(e).__name__}: {e}")
        taken = None
    if isinstance(pred, Failure) and frames.stack and " of loop " not in pred.cause.split("\n", 1)[0]:
        pred = env[s.pred] = Failure(f"in {frames.where()}: {pred.cause}")
    if taken is not None:
        taken = min(max(taken, 0), len(s.outputs) - 1)
    for b, (outs, pivot) in enumerate(zip(s.outputs, s.pivots, strict=True)):
        live = taken == b
        env[pivot] = LIVE if live else (pred if isinstance(pred, Failure) else DEAD)
        for out, value in zip(outs, s.inputs, strict=True):
            env[out] = env[value] if live else env[pivot]
