"""Per-host executors: Ray actors that own devices, compile artifacts and hold buffers.

This is the only package that imports Ray.
"""

from executors.host import Host, Placement
from executors.pool import ExecutorPool, RayOptions
from executors.runner import RunMessage

__all__ = ["ExecutorPool", "Host", "Placement", "RayOptions", "RunMessage"]
