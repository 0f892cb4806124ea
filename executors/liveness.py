"""Which values a host's run may free after each step of its plan.

Contract: `dead_after(plan, layout)` gives, per step, the values no later step reads (its
guard counts as a read) and no program result names: a long chain then holds a few values at
a time, not all of them. A value read or defined inside a loop lives until the loop's
outermost `Exit`, since a later iteration reads it again. What a step reads and defines
is `HostPlan.used` and `ir.plan.defines` (a failed step defines its values as its failure).
"""

from __future__ import annotations

from executors.control import Layout
from ir import HostPlan
from ir.plan import defines


def dead_after(plan: HostPlan, layout: Layout) -> tuple[tuple[str, ...], ...]:
    last: dict[str, int] = {}
    for i, step in enumerate(plan.steps):
        for value in defines(step):
            last.setdefault(value, i)  # never read: dead once defined
        for value in plan.used(i):
            last[value] = i
    for first, end in layout.framed:  # used inside a loop: kept until its outermost Exit
        for j in range(first, end + 1):
            for value in (*plan.used(j), *defines(plan.steps[j])):
                last[value] = max(last.get(value, end), end)
    kept = {value for _, value in plan.results}
    by_step: list[list[str]] = [[] for _ in plan.steps]
    for value, i in last.items():
        if value not in kept:
            by_step[i].append(value)
    return tuple(tuple(values) for values in by_step)
