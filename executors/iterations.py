"""Up to `parallel_iterations` iterations of one loop at once, on a host's dispatch thread.

Contract (`run_frame`, called by the runner at an `Enter` whose `parallel` is above 1):
- Each iteration k of the frame is a cursor over the frame's steps, from the step after its
  `Merge` to its `NextIteration`, with its own values (layered over the run's: the entered
  values and everything outside the loop) and its own `Frames` (`[frame, k]` last), so its
  sends and receives carry its iteration as under one iteration at a time.
- A carried value flows on its own (Yu et al.'s per-value NextIteration -> Merge): iteration
  k+1's merged value j is iteration k's body result j as soon as iteration k has computed
  it, not once iteration k has ended. A step that reads a merged value not there yet waits.
- Iteration k+1 exists once iteration k's loop `Switch` has taken the body (a live, true
  predicate): nothing runs speculatively. At most `parallel` iterations are open at once;
  they end in order, and the frame's `Exit` takes the last iteration's exit values.
- Within an iteration a step runs once what it reads is there (dataflow), in plan order
  otherwise: a receive whose mailbox is not filled yet, or a step reading a value not
  there yet, is put aside and the steps after it go on, so the counter and the predicate
  of iteration k + 1 need not wait for a value iteration k still receives. A control step
  (a loop or branch inside the iteration) waits until nothing of its iteration is put
  aside, and inside a loop of the iteration steps run strictly in order (an inner
  iteration's values keep their names, so the previous one's would read as there): what
  is inside it runs as under one iteration at a time. An iteration ends at
  its `NextIteration` once nothing of it is put aside.
- The oldest iteration that can move runs first, until it cannot. When none can move, the
  thread waits for any of their mailboxes; each receive keeps its own timeout (from when
  it began to wait), so a lost peer fails the values as under one iteration at a time.
- Nothing here decides order across hosts, so a loop whose computations span hosts (an
  island's JAX group, whose collectives every host must enter in one order) is lowered with
  `parallel` 1 and never comes here (`ir.passes.control_flow`). Loops inside an iteration
  run one iteration at a time, within it. Computations on this host's own devices may
  then be issued in another order than the plan's; the runner's bound on computations in
  flight is what keeps their collectives from deadlocking, whatever the order.
"""

from __future__ import annotations

import time
from collections import ChainMap, deque
from collections.abc import Callable, MutableMapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from typing import Any

from executors.control import LIVE, Frames, Layout
from executors.store import Failure
from ir import HostPlan, Recv
from ir.plan import ControlStep, Enter, Exit, Merge, NextIteration, Switch, defines

# Run step i in (values, frames), a receive within the deadline (monotonic) if given; the
# index of the step to run next.
Step = Callable[[int, MutableMapping[str, Any], Frames, "float | None"], int]
Mailboxes = Callable[[Recv, Frames], list[Future[Any]]]  # the mailboxes a receive reads


@dataclass(eq=False)
class _Iteration:
    k: int
    values: ChainMap[str, Any]
    frames: Frames
    pc: int
    previous: _Iteration | None
    pending: dict[str, str] = field(default_factory=dict)  # merged value -> the previous iteration's
    aside: set[int] = field(default_factory=set)  # steps put aside, to run once they can
    since: dict[int, float] = field(default_factory=dict)  # a receive -> when it began to wait
    waiting: dict[int, list[Future[Any]]] = field(default_factory=dict)  # ... for these mailboxes
    goes_on: bool = False  # its Switch took the body: iteration k + 1 exists
    done: bool = False


def run_frame(plan: HostPlan, enter: int, layout: Layout, values: dict[str, Any], frames: Frames,
              step: Step, mailboxes: Mailboxes, timeout: float) -> int:
    """Run the loop entered at step `enter` (the module contract); the index after its Exit."""
    s = plan.steps[enter]
    assert isinstance(s, Enter)
    step(enter, values, frames, None)  # the entered values into `values`; [frame, 0] pushed
    frame, parallel = s.frame, s.parallel
    head = layout.heads[frame]
    nxt, end = layout.tails[frame]
    merge, following, leave = plan.steps[head], plan.steps[nxt], plan.steps[end]
    assert isinstance(merge, Merge) and isinstance(following, NextIteration) and isinstance(leave, Exit)
    carried = dict(zip(following.outputs, following.inputs, strict=True))  # NextIteration out -> body result
    outer = [list(f) for f in frames.stack[:-1]]
    depth = len(frames)  # an iteration's frames outside any loop inside it
    reads = [plan.used(i) if head < i < nxt else () for i in range(len(plan.steps))]

    def begin(k: int, previous: _Iteration | None) -> _Iteration:
        it = _Iteration(k, ChainMap({}, values), Frames([*map(list, outer), [frame, k]]), head + 1, previous)
        for out, (entered, n) in zip(merge.outputs, merge.inputs, strict=True):
            if previous is None:
                it.values[out] = values[entered]
            else:
                it.pending[out] = carried[n]
        return it

    def ready(it: _Iteration, i: int) -> bool:
        local = it.values.maps[0]
        if not all(v in local or v in values for v in reads[i]):
            return False
        r = plan.steps[i]
        if isinstance(r, Recv):
            since = it.since.setdefault(i, time.monotonic())
            waiting = [f for f in mailboxes(r, it.frames) if not f.done()]
            if waiting and time.monotonic() < since + timeout:
                it.waiting[i] = waiting
                return False
            it.waiting.pop(i, None)
        return True

    def execute(it: _Iteration, i: int) -> int:
        it.aside.discard(i)
        since = it.since.pop(i, None)
        r = plan.steps[i]
        deadline = since + timeout if since is not None and isinstance(r, Recv) else None
        after = step(i, it.values, it.frames, deadline)
        if layout.loops.get(i) == frame and isinstance(r, Switch):  # pivots: (exit, body)
            it.goes_on = it.values.get(r.pivots[1]) is LIVE
        return after

    def advance(it: _Iteration) -> bool:
        """Run what the iteration can run now; whether it ran any step."""
        moved = False
        if it.pending:
            _merge(it)
        for i in sorted(it.aside):
            if ready(it, i):
                execute(it, i)
                moved = True
        while not it.done:
            if it.pending:
                _merge(it)
            i = it.pc
            if i == nxt:  # the next iteration reads the body results directly
                if it.aside:
                    return moved
                it.done = True
                return True
            if isinstance(plan.steps[i], ControlStep):  # in order: after all before it, merged values in
                if it.aside or any(v in it.pending for v in reads[i]):
                    return moved
                it.pc = execute(it, i)
                moved = True
                continue
            if not ready(it, i):
                if len(it.frames) > depth:  # inside a loop of the iteration: in order (its values
                    return moved             # of the inner iteration before would read as there)
                it.aside.add(i)
                it.pc = i + 1
                continue
            it.pc = execute(it, i)
            moved = True
        return moved

    active = deque([begin(0, None)])
    last = active[0]
    while active:
        moved = False
        for it in list(active):
            moved = advance(it) or moved
        while active and active[0].done:
            last = active.popleft()
            moved = True
        newest = active[-1] if active else last
        if newest.goes_on and len(active) < parallel:
            newest.goes_on = False  # its successor begins once
            active.append(begin(newest.k + 1, newest))
            moved = True
        if not moved:
            _wait(plan, active, timeout, frame)
    for out, value in zip(leave.outputs, leave.inputs, strict=True):
        values[out] = last.values[value]
    frames.stack.pop()
    return end + 1


def _merge(it: _Iteration) -> None:
    """Take the carried values the previous iteration has computed by now."""
    previous = it.previous
    assert previous is not None
    for out, source in list(it.pending.items()):
        if source in previous.values:
            it.values[out] = previous.values[source]
            del it.pending[out]
    if not it.pending:
        it.previous = None  # its values can go once it has ended


def _wait(plan: HostPlan, active: deque[_Iteration], timeout: float, frame: str) -> None:
    """Block until a mailbox an iteration waits for fills, or the first receive times out."""
    waiting = [f for it in active for fs in it.waiting.values() for f in fs]
    if waiting:
        deadline = min(it.since[i] for it in active for i in it.waiting) + timeout
        wait(waiting, timeout=max(0.0, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
        return
    # No iteration can move and none waits for a peer: what they wait for will never come.
    # Never leave it hanging: those values fail, and the iterations go on to their end.
    for it in active:
        for out, source in it.pending.items():
            it.values[out] = Failure(f"iteration {it.k} of loop {frame}: {source} of iteration "
                                     f"{it.k - 1} was never produced")
        it.pending.clear()
        for i in sorted(it.aside):
            for value in defines(plan.steps[i]):
                it.values.setdefault(value, Failure(f"iteration {it.k} of loop {frame}: step {i} "
                                                    "never had its inputs"))
        it.aside.clear()
