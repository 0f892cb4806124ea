"""Per-host executors: Ray actors that own devices, compile artifacts and hold buffers.

This is the only package that imports Ray.
"""

from executors.host import Host
from executors.messages import Lost, RunMessage, State
from executors.options import RayOptions
from executors.pool import ExecutorPool
from executors.stats import Answered, Held, HostStats, PeerSends, StatsAnswer

__all__ = [
    "Answered",
    "ExecutorPool",
    "Held",
    "Host",
    "HostStats",
    "Lost",
    "PeerSends",
    "RayOptions",
    "RunMessage",
    "State",
    "StatsAnswer",
]
