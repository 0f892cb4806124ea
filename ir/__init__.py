"""The sharded dataflow IR and the values it is made of.

Pure: imports numpy and nothing that touches devices. `Program` (a `Graph` of `Node`s plus
its slice and artifact tables), the per-op type rules, the verifier, the text form, the JSON
wire format, a checking builder, and the host plans lowering ends in (`ir.plan`). The
lowering passes are a package of their own: `ir.passes` (`lower`, `host_plans`).
"""

from ir.builder import ProgramBuilder
from ir.errors import (
    Conflict,
    DataLoss,
    InvalidArgument,
    IsthmusError,
    NotFound,
    RemoteError,
    Unavailable,
)
from ir.node import ATTRS, SUBGRAPHS, Graph, Node, Op, OpAttrs, RuleError, Sig, Type, subgraphs
from ir.ops import (
    ROUTES,
    TYPE_RULES,
    ArgAttrs,
    ComputeAttrs,
    CondAttrs,
    Env,
    RecvAttrs,
    ResultAttrs,
    SendAttrs,
    TransferAttrs,
    WhileAttrs,
    transfer_route,
)
from ir.plan import (
    CompileJob,
    Compute,
    DeviceMesh,
    HostPlan,
    Pop,
    Push,
    Recv,
    Reshard,
    Send,
    Step,
    executable_key,
)
from ir.program import Artifact, Placement, Program, SliceDef, content_hash
from ir.stack_ops import RepeatAttrs, StackAttrs
from ir.text import ParseError, node_line, parse_program, print_program
from ir.types import DTYPES, Aval, MeshAxes, Spec, dtype_name, parse_dtype
from ir.verify import VerifyError, graph_signature, infer_node, value_types, verify
from ir.wire import WireError, from_wire, to_wire

__all__ = [
    "ATTRS",
    "DTYPES",
    "ROUTES",
    "SUBGRAPHS",
    "TYPE_RULES",
    "ArgAttrs",
    "Artifact",
    "Aval",
    "CompileJob",
    "Compute",
    "ComputeAttrs",
    "CondAttrs",
    "Conflict",
    "DataLoss",
    "DeviceMesh",
    "Env",
    "Graph",
    "HostPlan",
    "InvalidArgument",
    "IsthmusError",
    "MeshAxes",
    "Node",
    "NotFound",
    "Op",
    "OpAttrs",
    "ParseError",
    "Placement",
    "Pop",
    "Program",
    "ProgramBuilder",
    "Push",
    "Recv",
    "RecvAttrs",
    "RemoteError",
    "RepeatAttrs",
    "Reshard",
    "ResultAttrs",
    "RuleError",
    "Send",
    "SendAttrs",
    "Sig",
    "SliceDef",
    "Spec",
    "StackAttrs",
    "Step",
    "TransferAttrs",
    "Type",
    "Unavailable",
    "VerifyError",
    "WhileAttrs",
    "WireError",
    "content_hash",
    "dtype_name",
    "executable_key",
    "from_wire",
    "graph_signature",
    "infer_node",
    "node_line",
    "parse_dtype",
    "parse_program",
    "print_program",
    "subgraphs",
    "to_wire",
    "transfer_route",
    "value_types",
    "verify",
]
