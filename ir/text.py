"""The text form of a program: `print_program` and `parse_program`, exact inverses.

Contract: `parse_program(print_program(p), p.artifacts) == p` for every program. The text
names artifacts by content hash only; their bytes travel separately (`artifacts=`). Shape:

    isthmus.program v1
    slice s0 = {data: 2, model: 2} island a placed a[a0:0, a0:1, a0:2, a0:3]
    slice s1 = {x: 4} placed b[b0:0, b0:1, b0:2, b0:3]
    %0 = arg float32[8,16] P(None, 'model') @s0
    %1 = compute layer sha256:ab12... @s0 (%0: float32[8,16] P(None, 'model')) -> (float32[8,16] P())
    %2 = transfer %1 -> float32[8,16] P() @s1 via dcn
    send %1 to b0 tag t0
    %3 = recv float32[8,16] P() @s1 from a0 tag t0
    %4, %5 = while (%3, %n) cond {
      ...sub-graph, ending in `result`...
    } body {
      ...
    }
    %6 = cond %p (%4) branch {
      ...
    } branch {
      ...
    }
    result %6

A slice's placement is `placed ISLAND[HOST:LOCAL_INDEX, ...]`, one entry per mesh position in
row-major order; a transfer's route is a trailing `via ROUTE`, absent while it is logical.
Per-op printers and parsers are tables (`_PRINT`, `_PARSE`) filled below, one entry per op.
Blank lines and lines starting with `#` are ignored. Errors are `ParseError`s naming the line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ir.errors import InvalidArgument
from ir.node import SUBGRAPHS, Graph, Node, Op, Sig, Type, subgraphs
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


class ParseError(InvalidArgument):
    """The text is not a program; the message names the line and what was expected."""


_VALUE = r"%[A-Za-z0-9_.]+"
_SIG = r"(?P<aval>[a-z0-9]+\[[0-9,]*\]) (?P<spec>P\((?:[^()]|\([^()]*\))*\))"
_TYPE = _SIG + r" @(?P<slice>\S+)"
_BLOCK_WORDS: dict[Op, Callable[[Node], list[str]]] = {
    Op.WHILE: lambda node: ["cond", "body"],
    Op.REPEAT: lambda node: ["body"],
    Op.COND: lambda node: ["branch"] * len(SUBGRAPHS[Op.COND](node.attrs)),
}


def _values(names: Iterable[str]) -> str:
    return ", ".join(names)


_PRINT: dict[Op, Callable[[Node, Any], str]] = {
    Op.ARG: lambda node, a: f"arg {a.type}",
    Op.COMPUTE: lambda node, a: (
        f"compute {a.name} {a.artifact} @{a.slice} ("
        + _values(f"{v}: {s}" for v, s in zip(node.inputs, a.ins, strict=False))
        + f") -> ({_values(map(str, a.outs))})"
    ),
    Op.TRANSFER: lambda node, a: (
        f"transfer {_values(node.inputs)} -> {a.type}" + (f" via {a.route}" if a.route else "")
    ),
    Op.SEND: lambda node, a: f"send {_values(node.inputs)} to {','.join(a.to)} tag {a.tag}",
    Op.RECV: lambda node, a: f"recv {a.type} from {','.join(a.sources)} tag {a.tag}",
    Op.RESULT: lambda node, a: f"result {_values(node.inputs)}".rstrip(),
    Op.WHILE: lambda node, a: f"while ({_values(node.inputs)})" + (
        f" parallel_iterations {a.parallel_iterations}" if a.parallel_iterations != 1 else "") + (
        " no_swap" if not a.swap else "") + (f" trips {a.trips} depth {a.trips_depth}" if a.trips else "") + (
        " counted" if a.counted else "") + (" remat" if a.remat else ""),
    Op.REPEAT: lambda node, a: f"repeat ({_values(node.inputs)}) trips {a.trips} depth {a.depth}",
    Op.COND: lambda node, a: f"cond {node.inputs[0] if node.inputs else ''} ({_values(node.inputs[1:])})",
    Op.PUSH: lambda node, a: f"push {_values(node.inputs)} {a.type} stack {a.stack} depth {a.depth}"
    + ("" if a.swap else " no_swap"),
    Op.POP: lambda node, a: f"pop {a.type} stack {a.stack} depth {a.depth}" + ("" if a.swap else " no_swap"),
}


def node_line(node: Node) -> str:
    """One line for one node, sub-graphs elided as `{...}`: what error messages show."""
    blocks = "".join(f" {word} {{...}}" for word in _BLOCK_WORDS.get(node.op, lambda n: [])(node))
    return _head(node) + blocks


def _head(node: Node) -> str:
    outs = f"{_values(node.outputs)} = " if node.outputs else ""
    return outs + _PRINT[node.op](node, node.attrs)


def print_program(program: Program) -> str:
    lines = [f"isthmus.program v{program.version}"]
    for s in program.slices:
        mesh = ", ".join(f"{name}: {size}" for name, size in s.mesh.axes)
        line = f"slice {s.name} = {{{mesh}}}" + (f" island {s.island}" if s.island else "")
        lines.append(line + (f" placed {_placement(s.placement)}" if s.placement else ""))
    lines += _graph_lines(program.graph, "")
    return "\n".join(lines) + "\n"


def _placement(p: Placement) -> str:
    return f"{p.island}[" + ", ".join(f"{host}:{index}" for host, index in p.devices) + "]"


def _graph_lines(graph: Graph, indent: str) -> list[str]:
    lines = []
    for node in graph.nodes:
        words = _BLOCK_WORDS.get(node.op, lambda n: [])(node)
        if not words:
            lines.append(indent + _head(node))
            continue
        for k, (word, sub) in enumerate(zip(words, subgraphs(node), strict=True)):
            lines.append((indent + _head(node) if k == 0 else indent + "}") + f" {word} {{")
            lines += _graph_lines(sub, indent + "  ")
        lines.append(indent + "}")
    return lines


# --- parsing ---------------------------------------------------------------------------------

Lines = list[tuple[int, str]]


def parse_program(
    text: str, artifacts: Mapping[str, bytes] | Iterable[Artifact] | None = None
) -> Program:
    """Parse the text form; `artifacts` supplies the artifact table (hash -> bytes, or Artifacts)."""
    lines = [(n, ln.strip()) for n, ln in enumerate(text.splitlines(), 1) if ln.strip()[:1] not in ("", "#")]
    if not lines:
        raise ParseError("line 1: expected 'isthmus.program v1', found an empty text")
    n, header = lines[0]
    version = _match(r"isthmus\.program v(\d+)", header, n, "a header 'isthmus.program v1'")
    slices, pos = [], 1
    while pos < len(lines) and lines[pos][1].startswith("slice "):
        slices.append(_slice(*lines[pos]))
        pos += 1
    graph, pos = _graph(lines, pos)
    if pos < len(lines):
        raise ParseError(f"line {lines[pos][0]}: expected the end of the program, found {lines[pos][1]!r}")
    table = (
        tuple(Artifact(h, data) for h, data in artifacts.items())
        if isinstance(artifacts, Mapping) else tuple(artifacts or ())
    )
    return _build(n, lambda: Program(graph, tuple(slices), table, int(version[1])))


def _match(pattern: str, text: str, n: int, expected: str) -> re.Match[str]:
    m = re.fullmatch(pattern, text)
    if not m:
        raise ParseError(f"line {n}: expected {expected}, found {text!r}")
    return m


def _build(n: int, make: Callable[[], Any]) -> Any:
    try:
        return make()
    except ParseError:
        raise
    except InvalidArgument as e:
        raise ParseError(f"line {n}: {e}") from None


def _slice(n: int, line: str) -> SliceDef:
    expected = "'slice NAME = {axis: size, ...}[ island ISLAND][ placed ISLAND[HOST:INDEX, ...]]'"
    pattern = r"slice (\S+) = \{([^}]*)\}(?: island (\S+))?(?: placed ([^\s\[]+)\[([^\]]*)\])?"
    m = _match(pattern, line, n, expected)
    mesh = tuple((a[1], int(a[2])) for a in _items(m[2], r"(\w+): (\d+)", n, "'axis: size'"))
    devices = tuple((d[1], int(d[2])) for d in _items(m[5] or "", r"([^\s:,]+):(\d+)", n, "'host:index'"))
    placement = None if m[4] is None else _build(n, lambda: Placement(m[4], devices))
    return _build(n, lambda: SliceDef(m[1], _build(n, lambda: MeshAxes(mesh)), m[3], placement))


def _items(text: str, pattern: str, n: int, expected: str) -> list[re.Match[str]]:
    """Matches of `pattern` separated by ', ' covering all of `text`."""
    out: list[re.Match[str]] = []
    regex, pos = re.compile(pattern), 0
    while pos < len(text):
        m = regex.match(text, pos)
        if not m or (m.end() < len(text) and not text.startswith(", ", m.end())):
            raise ParseError(f"line {n}: expected {expected}, found {text[pos:]!r}")
        out.append(m)
        pos = m.end() + 2
    return out


def _graph(lines: Lines, pos: int) -> tuple[Graph, int]:
    first = lines[pos][0] if pos < len(lines) else (lines[-1][0] if lines else 1)
    nodes: list[Node] = []
    while pos < len(lines) and not lines[pos][1].startswith("}"):
        node, pos = _node(lines, pos)
        nodes.append(node)
    return _build(first, lambda: Graph(tuple(nodes))), pos


def _node(lines: Lines, pos: int) -> tuple[Node, int]:
    n, line = lines[pos]
    blocks: list[tuple[str, Graph]] = []
    opened = re.fullmatch(r"(.*) (\w+) \{", line)
    if opened:
        line, word, pos = opened[1], opened[2], pos + 1
        while True:
            sub, pos = _graph(lines, pos)
            blocks.append((word, sub))
            if pos >= len(lines):
                raise ParseError(f"line {n}: expected '}}' closing this node's {word}, found the end")
            more = re.fullmatch(r"\} (\w+) \{", lines[pos][1])
            if lines[pos][1] != "}" and not more:
                found = lines[pos][1]
                raise ParseError(f"line {lines[pos][0]}: expected '}}' or '}} WORD {{', found {found!r}")
            pos += 1
            if not more:
                break
            word = more[1]
    else:
        pos += 1
    m = _match(rf"(?:({_VALUE}(?:, {_VALUE})*) = )?(\w+)(?: (.*))?", line, n, "'%out, ... = op ...'")
    try:
        op = Op(m[2])
    except ValueError:
        raise ParseError(f"line {n}: expected an op in {[o.value for o in Op]}, found {m[2]!r}") from None
    outputs = tuple(m[1].split(", ")) if m[1] else ()
    inputs, attrs = _PARSE[op](m[3] or "", blocks, n)
    return _build(n, lambda: Node(op, inputs, outputs, attrs)), pos


def _sig(m: re.Match[str], n: int) -> Sig:
    dims = _match(r"([a-z0-9]+)\[([0-9,]*)\]", m["aval"], n, "an aval like float32[4,8]")
    try:
        entries = ast.literal_eval(f"[{m['spec'][2:-1]}]")
    except (ValueError, SyntaxError):
        raise ParseError(f"line {n}: expected a spec like P(None, 'x'), found {m['spec']!r}") from None
    shape = tuple(int(d) for d in dims[2].split(",")) if dims[2] else ()
    return _build(n, lambda: Sig(Aval(shape, dims[1]), Spec.of(entries)))


def _type(text: str, n: int) -> Type:
    m = _match(_TYPE, text, n, "a type like float32[4,8] P('x', None) @s0")
    return _build(n, lambda: _sig(m, n).on(m["slice"]))


def _no_blocks(parse: Callable[[str, int], tuple[tuple[str, ...], Attrs]]) -> Callable[..., Any]:
    def wrapped(rest: str, blocks: list[tuple[str, Graph]], n: int) -> tuple[tuple[str, ...], Attrs]:
        if blocks:
            raise ParseError(f"line {n}: expected no sub-graphs, found {[w for w, _ in blocks]}")
        return parse(rest, n)

    return wrapped


def _compute(rest: str, n: int) -> tuple[tuple[str, ...], Attrs]:
    expected = "'compute NAME HASH @SLICE (ins) -> (outs)'"
    m = _match(r"(\S+) (\S+) @(\S+) \((.*)\) -> \((.*)\)", rest, n, expected)
    ins = _items(m[4], rf"(?P<value>{_VALUE}): {_SIG}", n, "'%value: aval spec'")
    outs = tuple(_sig(o, n) for o in _items(m[5], _SIG, n, "'aval spec'"))
    attrs = _build(n, lambda: ComputeAttrs(m[1], m[2], m[3], tuple(_sig(i, n) for i in ins), outs))
    return tuple(i["value"] for i in ins), attrs


def _transfer(rest: str, n: int) -> tuple[tuple[str, ...], Attrs]:
    m = _match(rf"({_VALUE}) -> (.*?)(?: via (\S+))?", rest, n, "'transfer %value -> TYPE[ via ROUTE]'")
    target = _type(m[2], n)
    return (m[1],), _build(n, lambda: TransferAttrs(target, m[3]))


def _send(rest: str, n: int) -> tuple[tuple[str, ...], Attrs]:
    m = _match(rf"({_VALUE}) to (\S+) tag (\S+)", rest, n, "'send %value to HOST[,HOST...] tag TAG'")
    return (m[1],), _build(n, lambda: SendAttrs(tuple(m[2].split(",")), m[3]))


def _recv(rest: str, n: int) -> tuple[tuple[str, ...], Attrs]:
    m = _match(r"(.*) from (\S+) tag (\S+)", rest, n, "'recv TYPE from HOST[,HOST...] tag TAG'")
    received = _type(m[1], n)
    return (), _build(n, lambda: RecvAttrs(received, tuple(m[2].split(",")), m[3]))


def _value_list(text: str, n: int) -> tuple[str, ...]:
    return tuple(v[0] for v in _items(text, _VALUE, n, "a value like %3"))


def _while(rest: str, blocks: list[tuple[str, Graph]], n: int) -> tuple[tuple[str, ...], Attrs]:
    m = _match(r"\((.*)\)(?: parallel_iterations (\d{1,4}))?( no_swap)?(?: trips (\S+) depth (\d{1,3}))?"
               r"( counted)?( remat)?", rest, n,
               "'while (%carry, ...) [parallel_iterations N] [no_swap] [trips NAME depth N] [counted] "
               "[remat] cond {'")
    if [w for w, _ in blocks] != ["cond", "body"]:
        raise ParseError(f"line {n}: expected sub-graphs cond and body, found {[w for w, _ in blocks]}")
    parallel = int(m[2]) if m[2] else 1
    return _value_list(m[1], n), _build(n, lambda: WhileAttrs(blocks[0][1], blocks[1][1], parallel, not m[3],
                                                              m[4], int(m[5] or 0), bool(m[6]), bool(m[7])))


def _repeat(rest: str, blocks: list[tuple[str, Graph]], n: int) -> tuple[tuple[str, ...], Attrs]:
    m = _match(r"\((.*)\) trips (\S+) depth (\d{1,3})", rest, n,
               "'repeat (%carry, ...) trips NAME depth N body {'")
    if [w for w, _ in blocks] != ["body"]:
        raise ParseError(f"line {n}: expected one sub-graph, body, found {[w for w, _ in blocks]}")
    return _value_list(m[1], n), _build(n, lambda: RepeatAttrs(blocks[0][1], m[2], int(m[3])))


def _cond(rest: str, blocks: list[tuple[str, Graph]], n: int) -> tuple[tuple[str, ...], Attrs]:
    m = _match(rf"({_VALUE}) \((.*)\)", rest, n, "'cond %pred (%operand, ...) branch {'")
    if not blocks or any(w != "branch" for w, _ in blocks):
        raise ParseError(f"line {n}: expected one or more branch sub-graphs, found {[w for w, _ in blocks]}")
    return (m[1], *_value_list(m[2], n)), _build(n, lambda: CondAttrs(tuple(g for _, g in blocks)))


def _push(rest: str, n: int) -> tuple[tuple[str, ...], Attrs]:
    m = _match(rf"({_VALUE}) (.*) stack (\S+) depth (\d{{1,3}})( no_swap)?", rest, n,
               "'push %value TYPE stack NAME depth N[ no_swap]'")
    saved = _type(m[2], n)
    return (m[1],), _build(n, lambda: StackAttrs(saved, m[3], int(m[4]), not m[5]))


def _pop(rest: str, n: int) -> tuple[tuple[str, ...], Attrs]:
    m = _match(r"(.*) stack (\S+) depth (\d{1,3})( no_swap)?", rest, n,
               "'pop TYPE stack NAME depth N[ no_swap]'")
    saved = _type(m[1], n)
    return (), _build(n, lambda: StackAttrs(saved, m[2], int(m[3]), not m[4]))


_PARSE: dict[Op, Callable[[str, list[tuple[str, Graph]], int], tuple[tuple[str, ...], Attrs]]] = {
    Op.ARG: _no_blocks(lambda rest, n: ((), ArgAttrs(_type(rest, n)))),
    Op.COMPUTE: _no_blocks(_compute),
    Op.TRANSFER: _no_blocks(_transfer),
    Op.SEND: _no_blocks(_send),
    Op.RECV: _no_blocks(_recv),
    Op.RESULT: _no_blocks(lambda rest, n: (_value_list(rest, n), ResultAttrs())),
    Op.WHILE: _while,
    Op.REPEAT: _repeat,
    Op.COND: _cond,
    Op.PUSH: _no_blocks(_push),
    Op.POP: _no_blocks(_pop),
}
