"""`fuse`: consecutive computations on one slice become one computation (one executable).

Contract: every maximal run of two or more `COMPUTE` nodes that are adjacent in the graph's
order and on the same slice is replaced, at the same place, by one `COMPUTE` whose artifact
is a fused artifact (`ir.fused`) calling the run's artifacts in order. Its inputs are the
values the run reads but does not define (first use first), its outputs the values the run
defines that a later node reads (definition order), with the same names, so later nodes are
unchanged. Adjacent nodes share a host, so every host's steps stay a subsequence of the
one global order (runs stay deadlock-free). Optional (a server setting): XLA then compiles
the run as one program, and a chain of small computations pays one dispatch, not one per
computation. Input: a scheduled, verified program.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import groupby

from ir.fused import Call, Ref, encode_fused
from ir.node import Graph, Node, Op, Sig
from ir.ops import ComputeAttrs
from ir.program import Artifact, Program


def fuse(program: Program) -> Program:
    table = program.artifact_table
    nodes: list[Node] = []
    added: dict[str, Artifact] = {}
    key = lambda n: n.attrs.slice if n.op is Op.COMPUTE else None  # noqa: E731
    position = 0
    for slice_name, group in groupby(program.nodes, key=key):
        run = list(group)
        position += len(run)
        if slice_name is None or len(run) < 2:
            nodes += run
            continue
        later = {v for n in program.nodes[position:] for v in n.inputs}
        node, artifact = _fused(run, later, table)
        added[artifact.hash] = artifact
        nodes.append(node)
    if not added:
        return program
    artifacts = tuple(table.values()) + tuple(a for h, a in added.items() if h not in table)
    return replace(program, graph=Graph(tuple(nodes)), artifacts=artifacts)


def _fused(run: list[Node], later: set[str], table: dict[str, Artifact]) -> tuple[Node, Artifact]:
    refs: dict[str, Ref] = {}
    ins: list[tuple[str, Sig]] = []
    parts: list[str] = []
    calls: list[Call] = []
    sigs: dict[str, Sig] = {}
    for j, node in enumerate(run):
        a = node.attrs
        assert isinstance(a, ComputeAttrs)
        inputs: list[Ref] = []
        for value, sig in zip(node.inputs, a.ins, strict=True):
            if value not in refs:
                refs[value] = ("in", len(ins))
                ins.append((value, sig))
            inputs.append(refs[value])
        if a.artifact not in parts:
            parts.append(a.artifact)
        calls.append(Call(parts.index(a.artifact), tuple(inputs)))
        for k, (value, sig) in enumerate(zip(node.outputs, a.outs, strict=True)):
            refs[value], sigs[value] = ("out", j, k), sig
    outs = [v for n in run for v in n.outputs if v in later]
    data = encode_fused([table[p].data for p in parts], calls, [refs[v] for v in outs])
    first = run[0].attrs
    assert isinstance(first, ComputeAttrs)
    artifact = Artifact.of(data, {"kind": "fused", "calls": str(len(run))})
    attrs = ComputeAttrs(f"fused.{len(run)}.{first.name}", artifact.hash, first.slice,
                         tuple(s for _, s in ins), tuple(sigs[v] for v in outs))
    return Node(Op.COMPUTE, tuple(v for v, _ in ins), tuple(outs), attrs), artifact
