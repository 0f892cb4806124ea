"""Lowering: from the device-agnostic program a client traces to what each host runs.

Contract: `lower(program, placements)` verifies `program` and runs the passes of `pipeline`,
in the order listed there and nowhere else: place -> route_transfers -> partition ->
schedule, then, with `fuse=True`, fuse. Each pass is a pure `Program -> Program` in its
own file, whose docstring states its contract; with `check=True` (tests always) the
verifier runs after every pass and an error names the pass. `host_plans(lowered)` then
cuts the lowered program into one `ir.plan.HostPlan` per host. The node-by-node passes
work inside the sub-graphs of `WHILE` and `COND` too (`ir.passes.subgraphs`); `host_plans`
lowers those nodes to the control-flow primitives (`ir.passes.control_flow`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial

from ir.passes.fuse import fuse as fuse_pass
from ir.passes.partition import partition
from ir.passes.place import place
from ir.passes.plans import device_mesh, host_plans
from ir.passes.route_transfers import route_transfers
from ir.passes.schedule import schedule
from ir.program import Placement, Program
from ir.verify import VerifyError, verify

Pass = Callable[[Program], Program]

__all__ = [
    "Pass", "device_mesh", "fuse_pass", "host_plans", "lower", "partition", "pipeline", "place",
    "route_transfers", "schedule",
]


def pipeline(placements: Mapping[str, Placement], fuse: bool = False) -> tuple[tuple[str, Pass], ...]:
    """The lowering passes, named, in the order they run: the one place that order is written."""
    passes: tuple[tuple[str, Pass], ...] = (
        ("place", partial(place, placements=placements)),
        ("route_transfers", route_transfers),
        ("partition", partition),
        ("schedule", schedule),
    )
    return passes + ((("fuse", fuse_pass),) if fuse else ())


def lower(program: Program, placements: Mapping[str, Placement], *, check: bool = False,
          fuse: bool = False) -> Program:
    verify(program)
    for name, run in pipeline(placements, fuse):
        program = run(program)
        if check:
            try:
                verify(program)
            except VerifyError as e:
                raise e.within(f"after {name}: ") from None
    return program
