"""What a CPU host may take of its machine's memory: XLA's temporaries, and buffers held.

Contract:
- A computation's inputs are buffers already counted, and its outputs are counted against
  its client's `buffer_bytes` quota before it is queued; what it allocates while it runs
  (XLA's temporaries, `temp_size_in_bytes` of the compiled executable, per device) is not.
  One computation materializing a 10 GB intermediate would make the kernel kill a process
  on the machine: the executor (every tenant's values on the host gone with it) or the
  server itself.
- `Budget.temp_bytes` is what a host's computations in flight may take together: set by
  the operator (`executor_temp_mb`), else half the memory of the executor's machine (its
  cgroup's limit where lower: a Kubernetes pod's) divided among the hosts the cluster
  places on that machine.
- `Budget.buffer_bytes` is what a host's buffers may take (`executor_buffer_mb`, else 35%
  of the machine divided the same way). The executor reports it as its devices' memory
  (`Host.info`), and the server refuses buffers past it (`server.host_memory`): a client
  within its own quota could otherwise fill a machine until the kernel kills executors.
  Both shares together leave 15% of the machine to the server, Ray and the system.
- `Budget.stack_bytes` is what a host's runs may keep on their loop stacks together
  (`executor_stack_mb`, else a quarter of the temporaries' share, out of which it comes:
  a stack is a run's working memory, gone when the run ends) on the devices; past it, its
  oldest values move to host memory, up to `Budget.swap_bytes` (`executor_stack_swap_mb`,
  else as much again; 0: no swapping). A push past both fails the run.
- `working_bytes(executable)` is what one computation takes on this host: its
  temporaries per device times this process's devices in its mesh. `check` refuses an
  executable that needs more than the whole budget alone (compiling it fails with both
  figures); `executors.issued` keeps the sum of those in flight within the budget.
- GPU hosts are not checked: their temporaries and buffers are device memory, and XLA's
  allocator answers what does not fit with an error rather than a killed process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MIB = 1 << 20
CGROUP_LIMITS = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
TEMP_SHARE = 0.5  # of a machine's memory, for its hosts' temporaries by default
BUFFER_SHARE = 0.35  # of a machine's memory, for its hosts' buffers by default


@dataclass(frozen=True)
class Budget:
    temp_mb: int | None = None  # set by the operator; None: a share of the machine (below)
    buffer_mb: int | None = None  # likewise
    sharing: int = 1  # hosts the cluster places on this host's machine
    stack_mb: int | None = None  # set by the operator; None: a quarter of the temporaries' share
    swap_mb: int | None = None  # of stacks swapped to host memory; None: as many as stack_mb

    def temp_bytes(self, machine: int | None = None) -> int:
        return self._bytes(self.temp_mb, TEMP_SHARE, machine)

    def stack_bytes(self, machine: int | None = None) -> int:
        return self.stack_mb * MIB if self.stack_mb is not None else self.temp_bytes(machine) // 4

    def swap_bytes(self, machine: int | None = None) -> int:
        return self.swap_mb * MIB if self.swap_mb is not None else self.stack_bytes(machine)

    def buffer_bytes(self, machine: int | None = None) -> int:
        return self._bytes(self.buffer_mb, BUFFER_SHARE, machine)

    def _bytes(self, mb: int | None, share: float, machine: int | None) -> int:
        if mb is not None:
            return mb * MIB
        memory = machine_memory() if machine is None else machine
        return int(memory * share) // max(1, self.sharing)


MACHINE = Budget()  # the default: shares of the machine, to itself


def machine_memory(limits: tuple[Path, ...] = CGROUP_LIMITS) -> int:
    """This process's machine memory in bytes, or its cgroup's limit where that is lower."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in limits:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit():  # "max" (cgroup v2) or a huge number (v1): no limit
            memory = min(memory, int(text))
    return memory


def working_bytes(executable: Any) -> tuple[int, int]:
    """What one run of a compiled executable allocates beyond its inputs and outputs on this
    host, and over how many devices: its temporaries per device (XLA's own figure) times
    this process's devices in its mesh. (0, devices) on a GPU, or where XLA does not say."""
    import jax

    every = jax.tree_util.tree_leaves((executable.input_shardings, executable.output_shardings))
    local = every[0].addressable_devices if every else ()
    devices = max(1, len(local))
    if any(d.platform != "cpu" for d in local):
        return 0, devices
    try:
        stats = executable.memory_analysis()
    except Exception:  # a backend without the analysis
        return 0, devices
    per_device = getattr(stats, "temp_size_in_bytes", 0) if stats is not None else 0
    return max(0, int(per_device)) * devices, devices


def check(needed: int, devices: int, budget: int, host: str) -> None:
    """Refuse a computation whose temporaries alone exceed the host's budget."""
    if needed > budget:
        raise MemoryError(
            f"it needs {needed / MIB:.0f} MiB of working memory on host {host} (XLA temporaries: "
            f"{needed // devices / MIB:.0f} MiB a device, on {devices} device{'s' * (devices > 1)}); a "
            f"host's computations in flight may take {budget / MIB:.0f} MiB together (executor_temp_mb)")
