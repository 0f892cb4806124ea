"""`place`: map every virtual slice onto physical devices.

Contract: `place(program, placements)` returns `program` with each `SliceDef` given
`placements[slice name]` (replacing any earlier one); the graph is unchanged. A slice with
no placement is an `InvalidArgument` naming it; a placement that does not fit its slice
(device count, island) is the `SliceDef`'s own `InvalidArgument`, which names the slice.
Placements for slices the program does not have are ignored: a resource manager may hand
over its whole mapping.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from ir.errors import InvalidArgument
from ir.program import Placement, Program


def place(program: Program, placements: Mapping[str, Placement]) -> Program:
    missing = [s.name for s in program.slices if s.name not in placements]
    if missing:
        raise InvalidArgument(
            f"place: expected a placement for every slice, found none for {', '.join(missing)} "
            f"(placed: {', '.join(sorted(placements)) or 'none'})"
        )
    return replace(program, slices=tuple(replace(s, placement=placements[s.name]) for s in program.slices))
