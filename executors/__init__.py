"""Per-host executors: Ray actors that own devices, compile artifacts and hold buffers.

This is the only package that imports Ray.
"""

from executors.host import Host
from executors.messages import State
from executors.pool import ExecutorPool, RayOptions
from executors.runner import RunMessage

__all__ = ["ExecutorPool", "Host", "RayOptions", "RunMessage", "State"]
