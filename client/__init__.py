"""The Isthmus client: `connect()`, slices, `jit`, `Buffer` futures.

    import client as isthmus
    c = isthmus.connect()
    s = c.slice({"data": 2, "model": 2})
    f = c.jit(layer, slice=s, in_specs=(P(None, "model"), P("data", None)), out_specs=P("data"))
    y = f(w, x)        # a Buffer future
    y.numpy()

Inside `@c.program`, `isthmus.while_loop`, `isthmus.cond` and `isthmus.fori_loop` keep loops
and branches in the graph (`client.control_flow`), and `isthmus.grad` / `value_and_grad`
differentiate a composition of jitted functions on the hosts (`client.grad`).
"""

from client.buffer import Buffer
from client.connection import Client, Slice, connect
from client.control_flow import cond, while_loop
from client.devices import DeviceTable
from client.fori import fori_loop
from client.grad import grad, value_and_grad
from client.jit import Function
from client.transport import OverQuota, Unauthorized
from ir import Conflict, DataLoss, InvalidArgument, IsthmusError, NotFound, RemoteError, Unavailable

__all__ = [
    "Buffer",
    "Client",
    "Conflict",
    "DataLoss",
    "DeviceTable",
    "Function",
    "InvalidArgument",
    "IsthmusError",
    "NotFound",
    "OverQuota",
    "RemoteError",
    "Slice",
    "Unauthorized",
    "Unavailable",
    "cond",
    "connect",
    "fori_loop",
    "grad",
    "value_and_grad",
    "while_loop",
]
