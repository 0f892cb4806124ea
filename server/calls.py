"""A call is a one-node program: the IR program of one computation applied to given inputs.

Contract: `call_program(comp, inputs, meshes)` is the program whose arguments have the
inputs' types (aval, spec, slice), whose one `COMPUTE` runs the computation on its slice
with its declared specs, and whose results are the computation's outputs. An argument
whose slice or spec differs from what the computation declares is moved by a `TRANSFER`
node, which lowering turns into a reshard on the host or a send and receive between hosts,
the same as in any program. Calls and programs thus take one path: lowered by `ir.passes`,
cached per placement, compiled per host, run by the executors' runner.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ir import MeshAxes, Program, ProgramBuilder, Spec
from server.records import ComputationRecord

InputType = tuple[str, Spec]  # an argument's slice and spec (its aval is the computation's)


def call_program(comp: ComputationRecord, inputs: Sequence[InputType],
                 meshes: Mapping[str, MeshAxes]) -> Program:
    """`meshes` gives the mesh of the computation's slice and of every input's slice."""
    b = ProgramBuilder()
    b.slice(comp.slice_id, meshes[comp.slice_id])  # first: the run is the island's of this slice
    for slice_id, _ in inputs:
        b.slice(slice_id, meshes[slice_id])
    artifact = b.artifact(comp.artifact)
    args = [b.arg(aval, spec, slice_id) for aval, (slice_id, spec) in zip(comp.in_avals, inputs, strict=True)]
    moved = [
        arg if (slice_id, spec) == (comp.slice_id, want) else b.transfer(arg, want, comp.slice_id)
        for arg, (slice_id, spec), want in zip(args, inputs, comp.in_specs, strict=True)
    ]
    outs = b.compute(node_name(comp.name), artifact, comp.slice_id, moved,
                     outs=list(zip(comp.out_avals, comp.out_specs, strict=True)),
                     ins=list(zip(comp.in_avals, comp.in_specs, strict=True)))
    b.result(*outs)
    return b.build()


def node_name(name: str) -> str:
    """A computation's name as a compute node's (no spaces, brackets, '@', '%' or ',')."""
    return re.sub(r"[\s(){}@%,]", "_", name)[:64] or "computation"
