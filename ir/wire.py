"""The JSON wire format of a program: `to_wire` and `from_wire`, exact inverses. No pickle.

Contract: `from_wire(to_wire(p)) == p`, and `to_wire(p)` is plain JSON (dicts, lists, str,
int, bool, None). Shape, version 1:

    {"format": "isthmus.ir", "version": 1,
     "slices": [{"name": "s0", "mesh": [["data", 2], ["model", 2]], "island": "a" | null,
                 "placement": {"island": "a", "devices": [["a0", 0], ["a0", 1], ...]} | null}],
     "artifacts": [{"hash": "sha256:...", "data": "<base64>", "meta": {"k": "v"}}],
     "graph": {"nodes": [{"op": "compute", "inputs": ["%0"], "outputs": ["%1"], "attrs": {...}}]}}

Mesh axes are a list of pairs because their order matters. A type is
`{"aval": {"shape": [...], "dtype": ...}, "spec": [...], "slice": ...}`; a computation's
`ins`/`outs` are types without `slice`. A transfer's attributes are `{"type": ..., "route":
"local" | "island" | "dcn" | null}`; a send's `{"to": [host, ...], "tag": ...}`; a recv's
`{"type": ..., "sources": [host, ...], "tag": ...}`. `placement` and `route` may be absent
(read as null), and a send's `"to"` or a recv's `"source"` may be one host's name, so
documents written before these existed still read. Per-op attribute codecs are tables (`_ENCODE`,
`_DECODE`). Any unknown format or version, or malformed field, is an `InvalidArgument`
(`WireError`) naming the JSON path, e.g. `$.graph.nodes[2].attrs.outs[0].aval.dtype`.
"""

from __future__ import annotations

import base64
import binascii
import reprlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from ir.errors import InvalidArgument
from ir.node import Graph, Node, Op, Sig, Type
from ir.ops import (
    ArgAttrs,
    ComputeAttrs,
    CondAttrs,
    RecvAttrs,
    ResultAttrs,
    SendAttrs,
    TransferAttrs,
    WhileAttrs,
)
from ir.program import Artifact, Placement, Program, SliceDef
from ir.stack_ops import Attrs, RepeatAttrs, StackAttrs
from ir.types import Aval, MeshAxes, Spec

FORMAT, VERSION = "isthmus.ir", 1
# Bounds on what one document may hold: a hostile one must fail by name, not by exhausting
# the reader's stack or memory.
MAX_DEPTH = 16  # loops and branches nested inside each other
MAX_ITEMS = 100_000  # entries of any one list (nodes of a graph, slices, artifacts, ...)


class WireError(InvalidArgument):
    """A wire document that is not a program; the message starts with the JSON path."""


def _sig(s: Sig) -> dict[str, Any]:
    return {"aval": s.aval.to_json(), "spec": s.spec.to_json()}


def _type(t: Type) -> dict[str, Any]:
    return {**_sig(t.sig), "slice": t.slice}


def _graph(g: Graph) -> dict[str, Any]:
    return {"nodes": [
        {"op": n.op.value, "inputs": list(n.inputs), "outputs": list(n.outputs),
         "attrs": _ENCODE[n.op](n.attrs)}
        for n in g.nodes
    ]}


_ENCODE: dict[Op, Callable[[Any], dict[str, Any]]] = {
    Op.ARG: lambda a: {"type": _type(a.type)},
    Op.COMPUTE: lambda a: {"name": a.name, "artifact": a.artifact, "slice": a.slice,
                           "ins": [_sig(s) for s in a.ins], "outs": [_sig(s) for s in a.outs]},
    Op.TRANSFER: lambda a: {"type": _type(a.type), "route": a.route},
    Op.SEND: lambda a: {"to": list(a.to), "tag": a.tag},
    Op.RECV: lambda a: {"type": _type(a.type), "sources": list(a.sources), "tag": a.tag},
    Op.RESULT: lambda a: {},
    Op.WHILE: lambda a: {"cond": _graph(a.cond), "body": _graph(a.body), **(
        {"parallel_iterations": a.parallel_iterations} if a.parallel_iterations != 1 else {}), **(
        {"swap": False} if not a.swap else {}), **(
        {"trips": a.trips, "trips_depth": a.trips_depth} if a.trips is not None else {}), **(
        {"counted": True} if a.counted else {}), **({"remat": True} if a.remat else {})},
    Op.REPEAT: lambda a: {"body": _graph(a.body), "trips": a.trips, "depth": a.depth},
    Op.COND: lambda a: {"branches": [_graph(b) for b in a.branches]},
    Op.PUSH: lambda a: {"type": _type(a.type), "stack": a.stack, "depth": a.depth, "swap": a.swap},
    Op.POP: lambda a: {"type": _type(a.type), "stack": a.stack, "depth": a.depth, "swap": a.swap},
}


def to_wire(program: Program) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": program.version,
        "slices": [{"name": s.name, "mesh": [list(a) for a in s.mesh.axes], "island": s.island,
                    "placement": _placement(s.placement)}
                   for s in program.slices],
        "artifacts": [{"hash": a.hash, "data": base64.b64encode(a.data).decode("ascii"), "meta": dict(a.meta)}
                      for a in program.artifacts],
        "graph": _graph(program.graph),
    }


def _placement(p: Placement | None) -> dict[str, Any] | None:
    return None if p is None else {"island": p.island, "devices": [list(d) for d in p.devices]}


# --- decoding --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _At:
    """A JSON value and the path it was found at, with typed accessors that name the path."""

    value: Any
    path: str

    def fail(self, expected: str) -> NoReturn:
        raise WireError(f"{self.path}: expected {expected}, found {_show(self.value)}")

    def __getitem__(self, key: str) -> _At:
        if not isinstance(self.value, dict):
            self.fail(f"an object with field {key!r}")
        if key not in self.value:
            raise WireError(f"{self.path}: expected a field {key!r}, found fields {sorted(self.value)}")
        return _At(self.value[key], f"{self.path}.{key}")

    def optional(self, key: str) -> _At:
        """A field that older documents lack: absent reads as null."""
        if not isinstance(self.value, dict):
            self.fail(f"an object with field {key!r}")
        return _At(self.value.get(key), f"{self.path}.{key}")

    def text_or_none(self) -> str | None:
        return None if self.value is None else self.text()

    def items(self) -> list[_At]:
        if not isinstance(self.value, list):
            self.fail("a list")
        if len(self.value) > MAX_ITEMS:
            raise WireError(f"{self.path}: {len(self.value)} entries; at most {MAX_ITEMS}")
        return [_At(v, f"{self.path}[{i}]") for i, v in enumerate(self.value)]

    def text(self) -> str:
        return self.value if isinstance(self.value, str) else self.fail("a string")

    def integer(self) -> int:
        ok = isinstance(self.value, int) and not isinstance(self.value, bool)
        return self.value if ok else self.fail("an integer")

    def build(self, make: Callable[[], Any]) -> Any:
        """Run a constructor, turning its InvalidArgument into one that names this path."""
        try:
            return make()
        except WireError:
            raise
        except InvalidArgument as e:
            raise WireError(f"{self.path}: {e}") from None


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother = 2, 60, 60


def _show(value: Any) -> str:
    text = _SHORT.repr(value)  # bounded however deep or long the value is
    return text if len(text) <= 80 else text[:77] + "..."


def from_wire(doc: Any) -> Program:
    root = _At(doc, "$")
    if root["format"].value != FORMAT:
        root["format"].fail(repr(FORMAT))
    version = root["version"]
    if version.value != VERSION:
        version.fail(f"version {VERSION} (the only one this build reads)")
    slices = tuple(_slice(s) for s in root["slices"].items())
    artifacts = tuple(_artifact(a) for a in root["artifacts"].items())
    graph = _read_graph(root["graph"])
    return root.build(lambda: Program(graph, slices, artifacts, VERSION))


def _slice(at: _At) -> SliceDef:
    axes = []
    for pair in at["mesh"].items():
        parts = pair.items()
        if len(parts) != 2:
            pair.fail("a pair [axis name, size]")
        axes.append((parts[0].text(), parts[1].integer()))
    mesh = at["mesh"].build(lambda: MeshAxes(tuple(axes)))
    name, island = at["name"].text(), at["island"].text_or_none()
    placement = _read_placement(at.optional("placement"))
    return at.build(lambda: SliceDef(name, mesh, island, placement))


def _read_placement(at: _At) -> Placement | None:
    if at.value is None:
        return None
    devices = []
    for pair in at["devices"].items():
        parts = pair.items()
        if len(parts) != 2:
            pair.fail("a pair [host, local device index]")
        devices.append((parts[0].text(), parts[1].integer()))
    island = at["island"].text()
    return at.build(lambda: Placement(island, tuple(devices)))


def _artifact(at: _At) -> Artifact:
    data = at["data"]
    try:
        raw = base64.b64decode(data.text(), validate=True)
    except binascii.Error:
        data.fail("base64 bytes")
    meta = at["meta"]
    if not isinstance(meta.value, dict):
        meta.fail("an object of strings")
    pairs = tuple((k, meta[k].text()) for k in meta.value)
    return at["hash"].build(lambda: Artifact(at["hash"].text(), raw, pairs))


def _read_sig(at: _At) -> Sig:
    aval = at["aval"]
    shape = tuple(d.integer() for d in aval["shape"].items())
    dtype = aval["dtype"].text()
    spec = at["spec"]
    parsed = aval.build(lambda: Aval(shape, dtype)), spec.build(lambda: Spec.from_json(spec.value))
    return at.build(lambda: Sig(*parsed))


def _read_type(at: _At) -> Type:
    sig, slice_name = _read_sig(at), at["slice"].text()
    return at.build(lambda: sig.on(slice_name))


def _read_graph(at: _At, depth: int = 0) -> Graph:
    if depth > MAX_DEPTH:
        raise WireError(f"{at.path}: loops and branches nested more than {MAX_DEPTH} deep")
    nodes = tuple(_read_node(n, depth) for n in at["nodes"].items())
    return at.build(lambda: Graph(nodes))


def _read_node(at: _At, depth: int) -> Node:
    op_at = at["op"]
    try:
        op = Op(op_at.text())
    except ValueError:
        op_at.fail(f"an op in {[o.value for o in Op]}")
    inputs = tuple(v.text() for v in at["inputs"].items())
    outputs = tuple(v.text() for v in at["outputs"].items())
    attrs = _NESTED[op](at["attrs"], depth + 1) if op in _NESTED else _DECODE[op](at["attrs"])
    return at.build(lambda: Node(op, inputs, outputs, attrs))


def _read_compute(at: _At) -> Attrs:
    name, artifact, slice_name = at["name"].text(), at["artifact"].text(), at["slice"].text()
    ins = tuple(_read_sig(s) for s in at["ins"].items())
    outs = tuple(_read_sig(s) for s in at["outs"].items())
    return at.build(lambda: ComputeAttrs(name, artifact, slice_name, ins, outs))


def _read_transfer(at: _At) -> Attrs:
    target, route = _read_type(at["type"]), at.optional("route").text_or_none()
    return at.build(lambda: TransferAttrs(target, route))


def _read_recv(at: _At) -> Attrs:
    hosts = at["sources"] if isinstance(at.value, dict) and "sources" in at.value else at["source"]
    received, sources, tag = _read_type(at["type"]), _hosts(hosts), at["tag"].text()
    return at.build(lambda: RecvAttrs(received, sources, tag))


def _read_stack(at: _At) -> Attrs:
    saved, stack, depth = _read_type(at["type"]), at["stack"].text(), at["depth"].integer()
    swap = _flag(at.optional("swap"), True)
    return at.build(lambda: StackAttrs(saved, stack, depth, swap))


def _hosts(at: _At) -> tuple[str, ...]:
    """A list of host names (or, as older documents have it, one name)."""
    if isinstance(at.value, str):
        return (at.text(),)
    return tuple(h.text() for h in at.items())


def _flag(at: _At, default: bool) -> bool:
    """A bool (absent: `default`)."""
    if at.value is None:
        return default
    if not isinstance(at.value, bool):
        at.fail("true or false")
    return bool(at.value)


def _depth(at: _At) -> int:
    """A stack's depth in loops (absent: 0)."""
    return 0 if at.value is None else at.integer()


def _parallel(at: _At) -> int:
    """A loop's `parallel_iterations` (absent: 1)."""
    return 1 if at.value is None else at.integer()


_DECODE: dict[Op, Callable[[_At], Attrs]] = {
    Op.ARG: lambda at: ArgAttrs(_read_type(at["type"])),
    Op.COMPUTE: _read_compute,
    Op.TRANSFER: _read_transfer,
    Op.SEND: lambda at: at.build(lambda: SendAttrs(_hosts(at["to"]), at["tag"].text())),
    Op.RECV: _read_recv,
    Op.RESULT: lambda at: ResultAttrs() if isinstance(at.value, dict) else at.fail("an object"),
    Op.PUSH: lambda at: _read_stack(at),
    Op.POP: lambda at: _read_stack(at),
}
# Ops carrying sub-programs: decoded one level deeper.
_NESTED: dict[Op, Callable[[_At, int], Attrs]] = {
    Op.WHILE: lambda at, d: at.build(
        lambda: WhileAttrs(_read_graph(at["cond"], d), _read_graph(at["body"], d),
                           _parallel(at.optional("parallel_iterations")), _flag(at.optional("swap"), True),
                           at.optional("trips").text_or_none(), _depth(at.optional("trips_depth")),
                           _flag(at.optional("counted"), False), _flag(at.optional("remat"), False))),
    Op.REPEAT: lambda at, d: at.build(
        lambda: RepeatAttrs(_read_graph(at["body"], d), at["trips"].text(), _depth(at.optional("depth")))),
    Op.COND: lambda at, d: at.build(
        lambda: CondAttrs(tuple(_read_graph(b, d) for b in at["branches"].items()))),
}
