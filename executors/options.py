"""How the server's executor pool joins Ray and starts its executors (`ExecutorPool.start`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from executors.runner import IN_FLIGHT


@dataclass(frozen=True)
class RayOptions:
    address: str | None = None  # None: start a local Ray owned by this process
    num_cpus: int = 2
    object_store_bytes: int = 1 << 30
    namespace: str = "isthmus"
    groups: bool = True  # multi-host islands (of one platform) form one JAX distributed group each
    ordered: bool = True  # False only to show what the island order prevents (debug)
    peer_links: bool = True  # False: hosts send each other values as actor calls (to compare)
    group_timeout_s: int = 120
    # The longest a host waits for an executable, and a CPU collective for its peers: past
    # it the computation fails with the cause instead of hanging (a host that failed its part
    # of a cross-host computation before the collective leaves the others waiting there).
    wait_timeout_s: int = 300
    # Computations an executor issues without waiting for them (docs/architecture.md).
    in_flight: int = IN_FLIGHT
    # MiB of XLA temporaries a CPU host's computations in flight may take together, and of
    # buffers it may hold; None: half of its machine's memory for the one, 35% for the
    # other, shared by the hosts placed on that machine (`executors.memory`).
    temp_mb: int | None = None
    buffer_mb: int | None = None
    stack_mb: int | None = None  # of loop stacks; None: a quarter of the temporaries' share
    swap_mb: int | None = None  # of loop stacks swapped to host memory; None: as many again
    # Ray's token: read from (or, for a Ray this pool starts, written to) this file.
    token_file: Path | None = None
    insecure: bool = False  # join an external Ray without token authentication
    # Executors outlive the server (detached actors); a new server takes over those it finds
    # (`adopt`) or, finding ones it does not take, kills them (`executors.adoption`).
    detached: bool = False
    adopt: bool = False
    # The Ray this pool starts runs apart from it, as the daemon of this state dir, and
    # stops by itself once no server has used it for `orphan_timeout_s` (`ray_daemon`).
    daemon_dir: Path | None = None
    orphan_timeout_s: float = 600.0
