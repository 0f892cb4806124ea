"""Host deaths: how soon what depended on a killed executor fails, and how soon its host serves
again with no manual step (server/healing.py).

    python -m bench.faults --json /tmp/faults.json [--kills 5]

A local server (its own Ray, the default islands a and b of two hosts each, not JAX groups)
and one client. Each round: a {"x": 4} slice on island b (one host), a chain of 300 calls
queued on it, then that host's executor is killed with SIGKILL (its pid as the admin sees it
in `GET /v1/islands`). `detection_s` is the time from the kill to the chain's last future
failing with a typed error; `heal_s`, from the kill to the next call on the slice returning
the right value, retried (each retry a fresh upload and call) until it does. The host's
other values are gone with it (reading one says why); lineage recovery is not built yet.

Output (`--json PATH`): `detection_s` and `heal_s` (median over rounds), `samples`
(per round), `kills`, `machine`; and, for the measures of issue 13 not built yet,
`server_restart_s` null and no soak counts.
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
from pathlib import Path
from typing import Any

import httpx
import numpy as np

import client as isthmus
from bench.call_latency import fork_exec_allowed, machine
from client.embedded import EmbeddedServer

CHAIN = 300
HEAL_DEADLINE_S = 120.0


def pids(address: str, token: str) -> dict[str, int]:
    islands = httpx.get(f"{address}/v1/islands", headers={"Authorization": f"Bearer {token}"},
                        timeout=30).raise_for_status().json()
    return {h["name"]: h["pid"] for i in islands for h in i["hosts"] if h["pid"] is not None}


def one_round(c: isthmus.Client, address: str, token: str) -> tuple[float, float]:
    s = c.slice({"x": 4}, island="b")
    f = c.jit(lambda v: v * 2.0 + 1.0, slice=s)
    x0 = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(f(c.put(x0, s)).numpy(), x0 * 2.0 + 1.0)  # compiled, warm
    y = c.put(x0, s)
    for _ in range(CHAIN):
        y = f(y)
    os.kill(pids(address, token)[s.hosts[0]], signal.SIGKILL)
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


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--kills", type=int, default=5, help="rounds, one executor killed in each")
    args = p.parse_args(argv)
    samples: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="isthmus-faults-") as tmp:
        with fork_exec_allowed():
            server = EmbeddedServer.start(Path(tmp) / "state", env={"ISTHMUS_HEALTH_PROBE_S": "1"})
        try:
            token = (Path(tmp) / "state" / "token").read_text().strip()
            with isthmus.connect(server.address, token=token, name="bench.faults") as c:
                for k in range(args.kills):
                    detection, heal = one_round(c, server.address, token)
                    samples.append({"detection_s": detection, "heal_s": heal})
                    print(f"  kill {k + 1}: detected in {detection:.3f}s, healed in {heal:.3f}s",
                          file=sys.stderr)
        finally:
            server.stop()
    out = {
        "detection_s": statistics.median(r["detection_s"] for r in samples),
        "heal_s": statistics.median(r["heal_s"] for r in samples),
        "server_restart_s": None,  # not built yet (issue 13, items 1-2)
        "samples": samples, "kills": args.kills, "machine": machine(),
    }
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return out


if __name__ == "__main__":
    main()
