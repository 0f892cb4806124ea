"""The sharded dataflow IR and the values it is made of.

Pure: imports numpy and nothing that touches devices. The full program IR (ops, graph,
verifier, passes) grows here; today it holds the shared value types and errors.
"""

from ir.errors import Conflict, InvalidArgument, IsthmusError, NotFound, RemoteError, Unavailable
from ir.types import DTYPES, Aval, MeshAxes, Spec, dtype_name, parse_dtype

__all__ = [
    "DTYPES",
    "Aval",
    "Conflict",
    "InvalidArgument",
    "IsthmusError",
    "MeshAxes",
    "NotFound",
    "RemoteError",
    "Spec",
    "Unavailable",
    "dtype_name",
    "parse_dtype",
]
