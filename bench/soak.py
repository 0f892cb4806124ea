"""A soak: clients run programs while a driver kills hosts' executors and the server itself.

    python -m bench.soak --json /tmp/soak.json [--seconds 90] [--clients 3] [--every 8]
    python -m bench.soak --smoke --json /tmp/soak.json   # for CI: 18 s, a fault every 3 s or so

One local server (its own Ray daemon, islands a and b of two hosts each, a health probe
every second), on a fixed port and state dir. Each client thread, until the end: uploads an
array onto its slice, runs a registered program on it (two calls), holds the result (the
newest few; older ones released), and reads back one held result at random, checking it
against the same arithmetic in NumPy. Meanwhile, every `--every` seconds or so (seeded), the
driver in turn SIGKILLs a host's executor chosen at random (its pid as the admin sees it),
or SIGKILLs the server and starts it again on the same port and state dir.

Counts (`soak` in the JSON):
- `runs`: program runs submitted; `succeeded`: runs whose result read back right;
  `typed_failures`: runs or reads that failed with an Isthmus error (a host or the server
  down at that moment, a run in flight when its host or the server died); `wrong`: results
  that read back different, and `untyped`: any other exception (both must be 0).
- `recomputed`: results read back right after a host that held them was killed (made again
  from their lineage); `lost`: results that read `DataLoss` although they had been read
  back right before (their lineage should have made them again).
- `leaked`, counted on the executors once every client has closed: buffers, runs, loop
  frames, mailboxes and arrays still held on a host, slices still placed, and executor
  processes beyond one per host.
- `recovery_rate`: of the faults injected, those after which every client ran a program
  successfully again within `RECOVER_S`, with no manual step (the driver stops injecting
  faults `TAIL_S`, at most a third of the soak, before the end, and the soak runs on at
  least that long after the last fault is over, so the last one has time to show it).
A client whose run fails waits `BACKOFF_S` before the next (as a client would while the
server restarts), so `typed_failures` counts attempts, not a busy loop.

`--smoke` soaks 18 s with 3 clients and a fault every 3 s or so (`SMOKE`), for CI
(tests/e2e/test_soak.py checks its counts). Output (`--json PATH`, the keys `JSON_KEYS`):
`soak` (the counts above), `server_restart_s` (median, kill to serving), `config`, `machine`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

import client as isthmus
from bench.machine import describe
from bench.output import write_json
from client.embedded import EmbeddedServer
from executors.ray_watcher import read_record, session_members

HELD = 6  # results each client holds at once
SETTLE_S = 120.0  # the longest the ledger waits for the islands to drain
RECOVER_S = 60.0  # a fault is recovered from when every client succeeds again within this
TAIL_S = 20.0  # the chaos-free end of the soak
BACKOFF_S = 0.2
SMOKE = {"seconds": 18.0, "clients": 3, "every": 3.0}
JSON_KEYS = ("soak", "server_restart_s", "config", "machine")


@dataclass
class Counts:
    runs: int = 0
    succeeded: int = 0
    typed_failures: int = 0
    wrong: int = 0
    untyped: int = 0
    recomputed: int = 0
    lost: int = 0
    leaked: int = 0
    host_kills: int = 0
    server_restarts: int = 0
    faults_recovered: int = 0
    leftovers: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def recovery_rate(self) -> float:
        faults = self.host_kills + self.server_restarts
        return self.faults_recovered / faults if faults else 1.0


FIXED_PORTS = range(20000, 32768)  # above Ray's worker ports (10002-19999), below the kernel's own


def free_port() -> int:
    """A port free on loopback now, for a server that is started again on the same one.

    Not one the kernel picks (bind to port 0): the server starts Ray before it binds its
    port, and Ray's processes bind ports the kernel picks, from the same range, one of which
    took the port in between once. A port from `FIXED_PORTS` is one neither of them hands
    out (a Linux default range starts at 32768).
    """
    rng = random.Random()
    for _ in range(200):
        port = rng.choice(FIXED_PORTS)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port on loopback in {FIXED_PORTS.start}-{FIXED_PORTS.stop - 1}")


class Server:
    """The server under test: one state dir and port, restarted in place."""

    def __init__(self, state: Path, env: dict[str, str]) -> None:
        # Its admin token is made here, not taken from an ISTHMUS_TOKEN this process may have.
        self.token = secrets.token_urlsafe(32)
        self.state, self.env = state, {**env, "ISTHMUS_TOKEN": self.token}
        self.port = free_port()
        self.process = EmbeddedServer.start(state, port=self.port, env=self.env)
        self.address = self.process.address
        self.restart_s: list[float] = []

    def admin(self, path: str) -> Any:
        return httpx.get(f"{self.address}{path}", headers={"Authorization": f"Bearer {self.token}"},
                         timeout=30).raise_for_status().json()

    def pids(self) -> dict[str, int]:
        """Each host that is up: its executor's pid (as the admin sees it)."""
        return {h["name"]: h["pid"] for i in self.admin("/v1/islands") for h in i["hosts"]
                if h["pid"] is not None and h["status"] == "up"}

    def kill_a_host(self, rng: random.Random) -> str | None:
        try:
            pids = self.pids()
        except httpx.HTTPError:
            return None
        if not pids:
            return None
        host = rng.choice(sorted(pids))
        os.kill(pids[host], signal.SIGKILL)
        return host

    def restart(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        self.process.process.wait(30)
        self.process.stop()
        self.process = EmbeddedServer.start(self.state, port=self.port, env=self.env)
        self.restart_s.append(time.monotonic() - killed)

    def stop(self) -> None:
        self.process.stop()  # a clean stop: its Ray daemon with it


@dataclass
class Held:
    buffer: Any
    expected: np.ndarray
    hosts: tuple[str, ...]
    made: float  # when it was last read back right


class Worker(threading.Thread):
    def __init__(self, k: int, server: Server, counts: Counts, lock: threading.Lock,
                 kills: list[tuple[float, str]], stop: threading.Event, seed: int) -> None:
        super().__init__(name=f"soak-client-{k}", daemon=True)
        self.k, self.server, self.counts, self.lock = k, server, counts, lock
        self.kills, self.stop_event = kills, stop
        self.rng = random.Random(seed)
        self.held: list[Held] = []
        self.client: isthmus.Client | None = None
        self.successes: list[float] = []  # when each run read back right

    def count(self, **deltas: int) -> None:
        with self.lock:
            for name, d in deltas.items():
                setattr(self.counts, name, getattr(self.counts, name) + d)

    def run(self) -> None:
        try:
            self.client = c = isthmus.connect(self.server.address, token=self.server.token,
                                              name=f"soak-{self.k}")
            s = _retry(lambda: c.slice({"x": 2}, island="ab"[self.k % 2]), self.stop_event)
            f = c.jit(lambda v: v * 2.0 + 1.0, slice=s)

            @c.program
            def twice(v):
                return f(f(v))

            while not self.stop_event.is_set():
                self.step(c, s, twice)
        except Exception as e:  # counted: the soak reports it, never hides it
            self.count(untyped=1)
            with self.lock:
                self.counts.errors.append(f"client {self.k}: {type(e).__name__}: {e}")

    def step(self, c: isthmus.Client, s: Any, twice: Callable[[Any], Any]) -> None:
        x0 = np.asarray([self.rng.uniform(-8, 8) for _ in range(8)], dtype=np.float32)
        expected = (x0 * 2.0 + 1.0) * 2.0 + 1.0
        self.count(runs=1)
        try:
            y = twice(c.put(x0, s))
            if self.check(y, expected, held=None):
                self.held.append(Held(y, expected, tuple(s.hosts), time.monotonic()))
                self.successes.append(time.monotonic())
                self.count(succeeded=1)
        except isthmus.IsthmusError:
            self.count(typed_failures=1)
            self.stop_event.wait(BACKOFF_S)
        if len(self.held) > HELD:
            self.held.pop(0)  # released: the client drops it
        if self.held:
            old = self.rng.choice(self.held)
            try:
                if self.check(old.buffer, old.expected, held=old):
                    if any(t > old.made and h in old.hosts for t, h in list(self.kills)):
                        self.count(recomputed=1)
                        old.made = time.monotonic()
            except isthmus.DataLoss:
                self.count(lost=1)
                self.held.remove(old)
            except isthmus.IsthmusError:
                self.count(typed_failures=1)
                self.stop_event.wait(BACKOFF_S)

    def check(self, buffer: Any, expected: np.ndarray, held: Held | None) -> bool:
        got = buffer.numpy()
        if np.allclose(got, expected, rtol=1e-5):
            return True
        self.count(wrong=1)
        if held is not None:
            self.held.remove(held)
        with self.lock:
            self.counts.errors.append(f"client {self.k}: read {got}, expected {expected}")
        return False

    def close(self) -> None:
        if self.client is not None:
            self.held.clear()
            try:
                self.client.close()
            except isthmus.IsthmusError as e:
                with self.lock:
                    self.counts.errors.append(f"client {self.k} close: {e}")


def _retry(make: Callable[[], Any], stop: threading.Event, every: float = 0.5) -> Any:
    while True:
        try:
            return make()
        except isthmus.IsthmusError:
            if stop.wait(every):
                raise


def ledger(server: Server, counts: Counts) -> None:
    """What is left on the executors once every client has closed (counted there)."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        islands = server.admin("/v1/islands")
        rows = [h for i in islands for h in i["hosts"]]
        left = {k: sum(int(h.get(k) or 0) for h in rows)
                for k in ("buffers", "runs", "frames", "mailboxes", "arrays")}
        left["slices"] = sum(int(i["slices"]) for i in islands)
        left["executors_beyond_hosts"] = max(0, _executor_processes(server.state) - len(rows))
        if not any(left.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    counts.leftovers = left
    counts.leaked = sum(left.values())


def _executor_processes(state: Path) -> int:
    """Executor processes in the Ray daemon's session (its watcher's, in ray.json)."""
    record = read_record(state)
    if record is None:
        return 0
    count = 0
    for pid in session_members(int(str(record["pid"]))):
        try:
            count += b"RayHost" in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
    return count


def soak(seconds: float, clients: int, every: float, seed: int, workdir: Path) -> tuple[Counts, list[float]]:
    """Run the soak (see the module docstring); returns its counts and the restart times."""
    rng = random.Random(seed)
    counts, lock, stop = Counts(), threading.Lock(), threading.Event()
    kills: list[tuple[float, str]] = []
    faults: list[float] = []
    server = Server(workdir / "state", {"ISTHMUS_HEALTH_PROBE_S": "1"})
    workers = [Worker(k, server, counts, lock, kills, stop, seed + k) for k in range(clients)]
    try:
        for w in workers:
            w.start()
        end, tail = time.monotonic() + seconds, min(TAIL_S, seconds / 3)
        chaos_end = end - tail
        while not stop.wait(min(rng.uniform(0.5, 1.5) * every, max(0.0, chaos_end - time.monotonic()))):
            if time.monotonic() >= chaos_end:
                break
            if counts.host_kills <= counts.server_restarts:  # in turn; the host and the time at random
                host = server.kill_a_host(rng)
                if host is not None:
                    kills.append((time.monotonic(), host))
                    faults.append(time.monotonic())
                    counts.host_kills += 1
            else:
                faults.append(time.monotonic())
                server.restart()
                counts.server_restarts += 1
        # The tail: no faults, every client runs on, for all of it after the last fault's end
        # (a server restart begun just before the chaos ended takes seconds).
        stop.wait(max(end - time.monotonic(), tail))
        stop.set()
        for w in workers:
            w.join(120)
            w.close()
        counts.faults_recovered = sum(
            all(any(t < s <= t + RECOVER_S for s in w.successes) for w in workers) for t in faults)
        ledger(server, counts)
    finally:
        stop.set()
        server.stop()
    return counts, server.restart_s


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--seconds", type=float, default=90.0, help="how long the driver kills things")
    p.add_argument("--clients", type=int, default=3)
    p.add_argument("--every", type=float, default=8.0, help="mean seconds between kills")
    p.add_argument("--seed", type=int, default=13)
    p.add_argument("--workdir", type=Path, default=None,
                   help="the server's state dir goes under it (default: a temporary one, removed after)")
    p.add_argument("--smoke", action="store_true", help=f"{SMOKE}: for CI")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    with tempfile.TemporaryDirectory(prefix="isthmus-soak-") as tmp:
        counts, restarts = soak(args.seconds, args.clients, args.every, args.seed, args.workdir or Path(tmp))
    out = {"soak": {**asdict(counts), "recovery_rate": counts.recovery_rate},
           "server_restart_s": statistics.median(restarts) if restarts else None,
           "config": {k: getattr(args, k) for k in ("seconds", "clients", "every", "seed")},
           "machine": describe()}
    print(json.dumps(out, indent=2), file=sys.stderr)
    write_json(args.json, out, JSON_KEYS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
