"""Start and stop a local Isthmus server in a child process (`isthmus demo`, the tests).

The child runs `python -m server` in its own process group; it is ready when it prints its
ready line, read from its output with a deadline (no polling, no sleeps). Stopping sends
SIGTERM to the group, so the server shuts down its executors and Ray, then SIGKILL to any
process of the group still there after the grace period. The child's standard input is a
pipe from this process (`--stop-with-stdin`): if this process dies without stopping it (a
test run killed, say), the pipe closes and the server stops itself all the same.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

READY = "isthmus: serving on"


class EmbeddedServer:
    def __init__(self, process: subprocess.Popen[str], address: str, log: list[str]) -> None:
        self.process = process
        self.address = address
        self.log = log

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, state_dir: Path, port: int = 0, extra: Sequence[str] = (),
              env: dict[str, str] | None = None, timeout: float = 180.0,
              prefix: Sequence[str] = ()) -> EmbeddedServer:
        """`prefix` runs the server through a command that then runs it (e.g. `ip netns exec
        NS`, for a server on a node of its own)."""
        cmd = [*prefix, sys.executable, "-m", "server", "--port", str(port), "--state-dir", str(state_dir),
               "--stop-with-stdin", *extra]
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=child_env, start_new_session=True)
        lines: queue.Queue[str | None] = queue.Queue()
        log: list[str] = []

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                log.append(line)
                lines.put(line)
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        server = cls(proc, "", log)
        try:
            while True:
                line = lines.get(timeout=timeout)
                if line is None:
                    raise RuntimeError("the server exited before it was ready:\n" + "".join(log))
                if line.startswith(READY):
                    server.address = line[len(READY):].strip()
                    return server
        except queue.Empty:
            server.stop()
            raise RuntimeError(f"the server was not ready in {timeout:g}s:\n" + "".join(log)) from None
        except BaseException:
            server.stop()
            raise

    def stop(self, grace: float = 30.0) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=grace)
