"""`held_bytes`: the most bytes of its own values one host's run of a plan holds at once.

Contract: `held_bytes(plan, size, whole)` bounds from above what a run of `plan` keeps on its
host at any one time of the values it makes itself, `size(value)` being a value's bytes on
this host once placed and `whole(value)` its whole array's bytes. The program's arguments
(stored buffers) are not counted, nor are its results (counted as the run's outputs) unless
a loop makes them, once per iteration. It follows how `executors.liveness` frees values:

- A `Compute`, `Reshard` or `Recv` allocates its outputs (a `Recv` the larger of the whole
  array it assembles and its placed part). The control steps (`Enter`, `Merge`, `Switch`,
  `NextIteration`, `Exit`) pass values on without copying: their outputs alias their
  inputs, so an allocation lives from its step until the last step that reads it or any
  alias of it (a guard counts as a read), then is freed.
- Inside a loop everything the loop reads or defines lives until its outermost `Exit` (a
  later iteration reads it again). What a frame defines counts `parallel + 1` times per
  enclosing frame: the iterations open at once, and the previous iteration's value while
  the next one computes its own.
- A `Send` holds a copy of what it sends (host memory) during its step.

Not counted: outputs of computations issued and still running after every name of them has
died (the runner keeps at most `in_flight` computations unfinished) and what XLA allocates
inside a computation while it runs (`executors.memory` bounds that).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ir.plan import Compute, Enter, Exit, HostPlan, Merge, NextIteration, Recv, Reshard, Send, Step, Switch

Size = Callable[[str], int]  # bytes of a value on this host


def held_bytes(plan: HostPlan, size: Size, whole: Size) -> int:
    steps = plan.steps
    copies, outermost = _frames(plan)
    roots = _roots(steps)
    last: dict[str, int] = {}  # allocation -> the last step that reads it (or an alias of it)
    made: dict[str, int] = {}  # allocation -> the step that makes it
    for i, step in enumerate(steps):
        for value in _allocates(step):
            made[value] = i
        for value in (*plan.used(i), *_allocates(step)):
            for root in roots.get(value, ()):
                last[root] = max(last.get(root, i), i)
    for first, end in outermost:  # read or made inside a loop: kept until its outermost Exit
        for i in range(first, end + 1):
            for value in (*plan.used(i), *_allocates(steps[i])):
                for root in roots.get(value, ()):
                    last[root] = max(last[root], end)
    results = {root for _, value in plan.results for root in roots.get(value, ())}
    change = [0] * (len(steps) + 1)
    for root, i in made.items():
        if root in results and copies[i] == 1:
            continue  # the run's output: counted as such
        step = steps[i]
        nbytes = max(size(root), whole(root)) if isinstance(step, Recv) else size(root)
        change[i] += nbytes * copies[i]
        change[last[root] + 1] -= nbytes * copies[i]
    peak = held = 0
    for i, step in enumerate(steps):
        held += change[i]
        sent = whole(step.input) if isinstance(step, Send) else 0
        peak = max(peak, held + sent)
    return peak


def _frames(plan: HostPlan) -> tuple[list[int], list[tuple[int, int]]]:
    """Per step, how many copies of what it defines may be held at once (1 outside loops),
    and the (first, last) step of each outermost frame."""
    copies: list[int] = []
    open_: list[tuple[int, int]] = []  # (first step, copies inside) of each open frame
    outermost: list[tuple[int, int]] = []
    for i, step in enumerate(plan.steps):
        if isinstance(step, Enter):
            open_.append((i, (open_[-1][1] if open_ else 1) * (max(1, step.parallel) + 1)))
        copies.append(open_[-1][1] if open_ else 1)
        if isinstance(step, Exit) and open_:
            first, _ = open_.pop()
            if not open_:
                outermost.append((first, i))
    return copies, outermost


def _roots(steps: tuple[Step, ...]) -> dict[str, frozenset[str]]:
    """Per value, the allocations it may be (itself, or what a control step passed on). A
    loop's `Merge` reads a `NextIteration` defined after it: repeated until nothing changes."""
    roots: dict[str, frozenset[str]] = {}
    for step in steps:
        for value in _allocates(step):
            roots[value] = frozenset((value,))
    changed = True
    while changed:
        changed = False
        for step in steps:
            for out, ins in _aliases(step):
                found = frozenset().union(*(roots.get(v, frozenset()) for v in ins))
                if found - roots.get(out, frozenset()):
                    roots[out] = roots.get(out, frozenset()) | found
                    changed = True
    return roots


def _allocates(step: Step) -> tuple[str, ...]:
    match step:
        case Compute():
            return step.outputs
        case Reshard() | Recv():
            return (step.output,)
    return ()


def _aliases(step: Step) -> list[tuple[str, tuple[str, ...]]]:
    """(output, the inputs it may be) of a control step."""
    match step:
        case Enter() | Exit() | NextIteration():
            return [(o, (i,)) for o, i in zip(step.outputs, step.inputs, strict=True)]
        case Merge():
            return list(zip(step.outputs, step.inputs, strict=True))
        case Switch():
            return [(o, (i,)) for outs in step.outputs for o, i in zip(outs, step.inputs, strict=True)]
    return []


def per_device(nbytes: int, parts: int) -> int:
    """Bytes of one device's shard of an array of `nbytes` split into `parts`."""
    return math.ceil(nbytes / max(1, parts))
