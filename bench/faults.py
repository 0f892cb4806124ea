"""Host and server deaths: how soon what depended on a killed executor fails, how soon its
host serves again with no manual step (server/healing.py), and how soon a server killed
and started again serves a client's old handles (server/recovery.py).

    python -m bench.faults --json /tmp/faults.json [--kills 5] [--restarts 3]

A local server (its own Ray, the default islands a and b of two hosts each, not JAX groups)
and one client. Each round: a {"x": 4} slice on island b (one host), a chain of 300 calls
queued on it, then that host's executor is killed with SIGKILL (its pid as the admin sees it
in `GET /v1/islands`). `detection_s` is the time from the kill to the chain's last future
failing with a typed error; `heal_s`, from the kill to the next call on the slice returning
the right value, retried (each retry a fresh upload and call) until it does. The host's
other values are gone with it (reading one says why); lineage recovery is not built yet.

Then each restart round: the client holds a buffer and a registered program, the server is
killed with SIGKILL and started again on the same port and state dir; `server_restart_s`
is the time from the kill to the old buffer read back unchanged through the same client
(the new server's start included).

Last, the soak of `bench/soak.py` (`--soak-s` seconds, 0 to skip): clients run programs
while hosts and the server are killed in turn; its counts are in `soak`.

Output (`--json PATH`): `detection_s`, `heal_s` and `server_restart_s` (median over
rounds), `samples` and `restarts` (per round), `kills`, `machine`, and `soak` (`runs`,
`succeeded`, `typed_failures`, `recomputed`, `lost`, `leaked`, `recovery_rate`, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

import client as isthmus
from bench.call_latency import fork_exec_allowed, machine
from bench.soak import Server, soak

CHAIN = 300
SOAK_KEYS = ("runs", "succeeded", "typed_failures", "recomputed", "lost", "leaked", "recovery_rate")
HEAL_DEADLINE_S = 120.0


def one_round(c: isthmus.Client, server: Server) -> tuple[float, float]:
    s = c.slice({"x": 4}, island="b")
    f = c.jit(lambda v: v * 2.0 + 1.0, slice=s)
    x0 = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(f(c.put(x0, s)).numpy(), x0 * 2.0 + 1.0)  # compiled, warm
    y = c.put(x0, s)
    for _ in range(CHAIN):
        y = f(y)
    os.kill(server.pids()[s.hosts[0]], signal.SIGKILL)
    killed = time.monotonic()
    try:
        y.numpy()
        raise SystemExit("the chain on the killed host returned a value")
    except (isthmus.Unavailable, isthmus.RemoteError):
        detection = time.monotonic() - killed
    while True:
        try:
            got = f(c.put(x0, s)).numpy()
            break
        except (isthmus.Unavailable, isthmus.RemoteError):
            if time.monotonic() - killed > HEAL_DEADLINE_S:
                raise SystemExit(f"host {s.hosts[0]} did not serve again within "
                                 f"{HEAL_DEADLINE_S:g}s") from None
    heal = time.monotonic() - killed
    np.testing.assert_array_equal(got, x0 * 2.0 + 1.0)
    return detection, heal


def restart_round(c: isthmus.Client, server: Server) -> float:
    """Kill the server, start it again; the seconds until an old handle reads back."""
    s = c.slice({"x": 2}, island="a")
    f = c.jit(lambda v: v * 2.0 + 1.0, slice=s)
    x0 = np.arange(8, dtype=np.float32)
    x = c.put(x0, s)

    @c.program
    def twice(v):
        return f(f(v))

    np.testing.assert_array_equal(twice(x).numpy(), (x0 * 2.0 + 1.0) * 2.0 + 1.0)
    killed = time.monotonic()
    server.restart()  # SIGKILL, then started again on the same port and state dir
    np.testing.assert_array_equal(x.numpy(), x0)
    took = time.monotonic() - killed
    np.testing.assert_array_equal(twice(x).numpy(), (x0 * 2.0 + 1.0) * 2.0 + 1.0)
    return took


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--kills", type=int, default=5, help="rounds, one executor killed in each")
    p.add_argument("--restarts", type=int, default=3, help="rounds, the server killed in each")
    p.add_argument("--soak-s", type=float, default=90.0, help="seconds of soak (bench/soak.py); 0: none")
    args = p.parse_args(argv)
    samples: list[dict[str, float]] = []
    restarts: list[float] = []
    with tempfile.TemporaryDirectory(prefix="isthmus-faults-") as tmp:
        with fork_exec_allowed():
            server = Server(Path(tmp) / "state", {"ISTHMUS_HEALTH_PROBE_S": "1"})
        try:
            with isthmus.connect(server.address, token=server.token, name="bench.faults") as c:
                for k in range(args.kills):
                    detection, heal = one_round(c, server)
                    samples.append({"detection_s": detection, "heal_s": heal})
                    print(f"  kill {k + 1}: detected in {detection:.3f}s, healed in {heal:.3f}s",
                          file=sys.stderr)
                for k in range(args.restarts):
                    with fork_exec_allowed():
                        took = restart_round(c, server)
                    restarts.append(took)
                    print(f"  server restart {k + 1}: old handles served {took:.3f}s after the kill",
                          file=sys.stderr)
        finally:
            server.stop()  # a clean stop: the Ray it runs on (a daemon since the first) with it
    counts = None
    if args.soak_s > 0:
        with tempfile.TemporaryDirectory(prefix="isthmus-soak-") as tmp, fork_exec_allowed():
            counts, _ = soak(args.soak_s, 3, 8.0, 13, Path(tmp))
    out = {
        "detection_s": statistics.median(r["detection_s"] for r in samples) if samples else None,
        "heal_s": statistics.median(r["heal_s"] for r in samples) if samples else None,
        "server_restart_s": statistics.median(restarts) if restarts else None,
        "samples": samples, "restarts": restarts, "kills": args.kills, "machine": machine(),
        "soak": {**asdict(counts), "recovery_rate": counts.recovery_rate} if counts else None,
    }
    for key in SOAK_KEYS:  # the soak's counts at the top level too
        out[key] = out["soak"][key] if out["soak"] else None
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
