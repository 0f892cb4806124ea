"""The sharded dataflow IR and the values it is made of.

Pure: imports numpy and nothing that touches devices. `Program` (a `Graph` of `Node`s plus
its slice and artifact tables), the per-op type rules, the verifier, the text form, the JSON
wire format and a checking builder. Passes (`ir/passes/`) grow here.
"""

from ir.builder import ProgramBuilder
from ir.errors import Conflict, InvalidArgument, IsthmusError, NotFound, RemoteError, Unavailable
from ir.node import ATTRS, SUBGRAPHS, TYPE_RULES, Env, Node, Op, RuleError, Sig, Type, subgraphs
from ir.ops import ArgAttrs, ComputeAttrs, CondAttrs, ResultAttrs, TransferAttrs, WhileAttrs
from ir.program import Artifact, Graph, Program, SliceDef, content_hash
from ir.text import ParseError, node_line, parse_program, print_program
from ir.types import DTYPES, Aval, MeshAxes, Spec, dtype_name, parse_dtype
from ir.verify import VerifyError, graph_signature, infer_node, verify
from ir.wire import WireError, from_wire, to_wire

__all__ = [
    "ATTRS",
    "DTYPES",
    "SUBGRAPHS",
    "TYPE_RULES",
    "ArgAttrs",
    "Artifact",
    "Aval",
    "ComputeAttrs",
    "CondAttrs",
    "Conflict",
    "Env",
    "Graph",
    "InvalidArgument",
    "IsthmusError",
    "MeshAxes",
    "Node",
    "NotFound",
    "Op",
    "ParseError",
    "Program",
    "ProgramBuilder",
    "RemoteError",
    "ResultAttrs",
    "RuleError",
    "Sig",
    "SliceDef",
    "Spec",
    "TransferAttrs",
    "Type",
    "Unavailable",
    "VerifyError",
    "WhileAttrs",
    "WireError",
    "content_hash",
    "dtype_name",
    "from_wire",
    "graph_signature",
    "infer_node",
    "node_line",
    "parse_dtype",
    "parse_program",
    "print_program",
    "subgraphs",
    "to_wire",
    "verify",
]
