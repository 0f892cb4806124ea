"""Host and server deaths: how soon a killed executor's host is found lost and serves again with
no manual step (server/healing.py), whether a chain of calls on it is made again from its
lineage (server/remake.py, server/lineage.py), and how soon a server killed and started
again serves a client's old handles (server/recovery.py).

    python -m bench.faults --json /tmp/faults.json [--kills 5] [--restarts 3] [--chain 1000]
    python -m bench.faults --smoke --json /tmp/faults.json   # for CI: one of each, a short chain

One local server of its own (its own Ray, the default islands a and b of two hosts each,
not JAX groups; a health probe every second) and one client.

Each kill round: a {"x": 4} slice on island b (one host), a chain of `--chain` calls
`v + 1` queued on it from a float32[8] upload and sent, then that host's executor killed
with SIGKILL (its pid as the admin sees it in `GET /v1/islands`). From the kill:
- `detection_s`: until the server reports the host lost (its warning "host H was lost",
  server/healing.py: what the pool's channel or the health probe told it);
- `back_s`: until the admin's view shows the host up with a new executor (another pid);
- `heal_s`: until a fresh upload and call on the slice return the right value (tried again
  on a typed error until they do): the host serves again;
- then the chain's end is read: `chain_recovered` counts the rounds where it equals the
  same chain computed here with `jax.jit` (its calls made again from their lineage on the
  new executor), `chain_outcomes` says per round what it was (`equal`, or the typed error
  it raised; a value that differs fails the run), and `chain_read_s` is how long that read
  took. Each sample says whether the chain had finished before the kill
  (`chain_done_at_kill`: its values were lost with the host either way).

Each restart round: the client holds a buffer and a registered program; the server is
killed with SIGKILL and started again on the same port and state dir (its Ray daemon and
executors stay up, and it takes them over). `server_start_s` runs from the kill until the
new server says it serves, `server_restart_s` until the old buffer reads back unchanged
through the same client; the old program then runs again, checked.

The soak (faults at random while clients run) is `bench.soak`. `--smoke` runs one kill
and one restart round with a chain of 200 (`SMOKE`), for CI; its figures mean nothing.
Output (`--json PATH`, the keys `JSON_KEYS`): `detection_s`, `back_s`, `heal_s`,
`chain_read_s`, `server_start_s`, `server_restart_s` (medians over rounds),
`chain_recovered`, `chain_outcomes`, `samples` (per kill round), `restarts` (per restart
round), `kills`, `config`, `machine`.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

import client as isthmus
from bench.call_latency import BenchError, machine
from bench.output import write_json
from bench.servers import fork_exec_allowed
from bench.soak import Server

FULL = {"kills": 5, "restarts": 3, "chain": 1000}
SMOKE = {"kills": 1, "restarts": 1, "chain": 200}
SERVER_ENV = {"ISTHMUS_HEALTH_PROBE_S": "1"}
DEADLINE_S = 120.0  # the longest any one wait here may take
POLL_S = 0.02  # the resolution of the times measured by polling
JSON_KEYS = ("detection_s", "back_s", "heal_s", "chain_read_s", "server_start_s", "server_restart_s",
             "chain_recovered", "chain_outcomes", "samples", "restarts", "kills", "config", "machine")


def add_one(v: jax.Array) -> jax.Array:
    return v + 1.0


def local_chain(x0: np.ndarray, n: int) -> np.ndarray:
    """The chain's end as `jax.jit` computes it here, call by call."""
    f, v = jax.jit(add_one), x0
    for _ in range(n):
        v = f(v)
    return np.asarray(v)


def until(what: str, since: float, check: Callable[[], bool]) -> float:
    """Seconds from `since` until `check()` holds, polled every `POLL_S` (then an error
    naming `what` after `DEADLINE_S`)."""
    while not check():
        if time.monotonic() - since > DEADLINE_S:
            raise BenchError(f"{what}: not within {DEADLINE_S:g}s of the kill")
        time.sleep(POLL_S)
    return time.monotonic() - since


def host_row(server: Server, host: str) -> dict[str, Any]:
    return next(h for i in server.admin("/v1/islands") for h in i["hosts"] if h["name"] == host)


def kill_round(c: isthmus.Client, server: Server, chain: int) -> dict[str, Any]:
    s = c.slice({"x": 4}, island="b")
    host = s.hosts[0]
    f = c.jit(add_one, slice=s)
    x0 = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(f(c.put(x0, s)).numpy(), x0 + 1.0)  # compiled, warm
    want = local_chain(x0, chain)
    before = host_row(server, host)
    y = c.put(x0, s)
    for _ in range(chain):
        y = f(y)
    done_at_kill = y.ready()  # (sends the chain first)
    log_from = len(server.process.log)
    os.kill(before["pid"], signal.SIGKILL)
    killed = time.monotonic()
    lost = f"host {host} was lost"
    detection = until(f"the server reporting {lost}", killed,
                      lambda: any(lost in line for line in server.process.log[log_from:]))
    back = until(f"host {host} up with a new executor", killed,
                 lambda: (row := host_row(server, host))["status"] == "up" and row["pid"] != before["pid"])

    def serves() -> bool:
        try:
            return bool(np.array_equal(f(c.put(x0, s)).numpy(), x0 + 1.0))
        except isthmus.IsthmusError:
            return False

    heal = until(f"host {host} serving", killed, serves)
    start = time.monotonic()
    try:
        got = y.numpy()
        if not np.array_equal(got, want):
            raise BenchError(f"the chain of {chain} on the killed host read back {got[:4]}..., "
                             f"expected {want[:4]}... (jax.jit here)")
        outcome = "equal"
    except isthmus.IsthmusError as e:
        outcome = type(e).__name__
    read = time.monotonic() - start
    print(f"  kill: found lost in {detection:.3f}s, up in {back:.3f}s, serving in {heal:.3f}s; "
          f"chain {outcome} (read in {read:.3f}s)", file=sys.stderr)
    return {"detection_s": detection, "back_s": back, "heal_s": heal, "chain": outcome, "chain_read_s": read,
            "chain_done_at_kill": done_at_kill}


def restart_round(c: isthmus.Client, server: Server) -> dict[str, float]:
    """Kill the server, start it again; the seconds until it serves, and until an old
    handle reads back."""
    s = c.slice({"x": 2}, island="a")
    f = c.jit(lambda v: v * 2.0 + 1.0, slice=s)
    x0 = np.arange(8, dtype=np.float32)
    x = c.put(x0, s)

    @c.program
    def twice(v: Any) -> Any:
        return f(f(v))

    np.testing.assert_array_equal(twice(x).numpy(), (x0 * 2.0 + 1.0) * 2.0 + 1.0)
    killed = time.monotonic()
    with fork_exec_allowed():
        server.restart()  # SIGKILL, then started again on the same port and state dir
    np.testing.assert_array_equal(x.numpy(), x0)
    took = time.monotonic() - killed
    np.testing.assert_array_equal(twice(x).numpy(), (x0 * 2.0 + 1.0) * 2.0 + 1.0)
    print(f"  server restart: serving {server.restart_s[-1]:.3f}s after the kill, old handles "
          f"{took:.3f}s", file=sys.stderr)
    return {"server_start_s": server.restart_s[-1], "server_restart_s": took}


def median(rows: list[dict[str, Any]], key: str) -> float | None:
    return statistics.median(r[key] for r in rows) if rows else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.faults", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--kills", type=int, default=FULL["kills"], help="rounds, one executor killed in each")
    p.add_argument("--restarts", type=int, default=FULL["restarts"], help="rounds, the server killed in each")
    p.add_argument("--chain", type=int, default=FULL["chain"], help="calls queued on the host killed")
    p.add_argument("--smoke", action="store_true", help=f"{SMOKE}: for CI")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    samples: list[dict[str, Any]] = []
    restarts: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="isthmus-faults-") as tmp:
        with fork_exec_allowed():
            server = Server(Path(tmp) / "state", SERVER_ENV)
        try:
            with isthmus.connect(server.address, token=server.token, name="bench.faults") as c:
                samples = [kill_round(c, server, args.chain) for _ in range(args.kills)]
                restarts = [restart_round(c, server) for _ in range(args.restarts)]
        finally:
            server.stop()  # a clean stop: the Ray it runs on (a daemon since the first) with it
    result = {
        **{k: median(samples, k) for k in ("detection_s", "back_s", "heal_s", "chain_read_s")},
        **{k: median(restarts, k) for k in ("server_start_s", "server_restart_s")},
        "chain_recovered": sum(r["chain"] == "equal" for r in samples),
        "chain_outcomes": [r["chain"] for r in samples],
        "samples": samples, "restarts": restarts, "kills": args.kills,
        "config": {"chain": args.chain, "restarts": args.restarts, "server_env": SERVER_ENV,
                   "poll_s": POLL_S},
        "machine": machine(),
    }
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples", "machine")}, indent=2))
    write_json(args.json, result, JSON_KEYS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
