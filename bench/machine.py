"""What machine a benchmark ran on, for the `machine` key of its JSON."""

from __future__ import annotations

import contextlib
import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor()


def nvidia_gpus() -> tuple[str, ...]:
    """This machine's NVIDIA GPUs as `nvidia-smi -L` names them ("GPU 0: NVIDIA H100 ..."),
    without their UUIDs; none where there is no `nvidia-smi`."""
    if shutil.which("nvidia-smi") is None:
        return ()
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    return tuple(line.split(" (UUID")[0].strip() for line in out.splitlines() if line.startswith("GPU"))


def describe(**extra: Any) -> dict[str, Any]:
    """The platform, CPUs, Python and JAX versions, and `extra` (what the benchmark adds)."""
    import jax

    return {
        "platform": platform.platform(),
        "arch": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jax.lib.__version__,
        **extra,
    }
