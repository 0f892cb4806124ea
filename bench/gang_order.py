"""What the island order prevents: the multi-tenant collective workload with it on and off.

    python -m bench.gang_order --json /tmp/gang_order.json [--deadline 120]
    python -m bench.gang_order --smoke --json /tmp/gang_order.json   # for CI: 2 clients, 1 program

Two embedded servers of island `a` alone (`ISLAND_A`), one after the other, both with
`ISTHMUS_ISLAND_GROUPS=1`: one with the gang order (the default), one with
`ISTHMUS_GANG_ORDER=0`, a debug switch under which each host of a submission takes it after
a random delay of up to 5 ms, in its own arrival order, with no admission. The workload is
the e2e test's: 8 clients, each running 50 programs of two all-reduces and an all-gather on
a slice spanning both hosts of island `a` (the slices overlap). Reports, per setting, how
many runs finished with the right value before the deadline, wrong, or failed (with the
first line of the cause), and how many clients were still waiting at the deadline. Not a
test: with the order off the island is expected to hang or to compute garbage. `--server
URL` runs the ordered setting on a running server with island groups (its admin token in
ISTHMUS_TOKEN) instead of starting one; the unordered one always has a server of its own,
stopped after with whatever it left stuck.

`--smoke` runs 2 clients of 1 program each with a deadline of 20 s (`SMOKE`), for CI; with
the order off even that may hang or be wrong, which it reports. Output (`--json PATH`, the
keys `JSON_KEYS`): `settings` (`order_on`, `order_off` -> `runs`, `right`, `wrong`,
`failed`, `unsettled`, `clients_waiting`, `elapsed_s`, `outcomes` (each distinct outcome
-> count)), `config`, `machine`.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import client as isthmus
from bench.call_latency import machine
from bench.output import write_json
from bench.servers import server

FULL = {"clients": 8, "programs": 50, "deadline": 120.0}
SMOKE = {"clients": 2, "programs": 1, "deadline": 20.0}
GROUPS = {"ISTHMUS_ISLAND_GROUPS": "1"}
# A server of its own has island a alone, the workload's (two hosts of 4 CPU devices).
ISLAND_A = {"islands": [{"name": "a", "hosts": 2, "devices_per_host": 4, "platform": "cpu"}]}
JSON_KEYS = ("settings", "config", "machine")

BUFFER_ID = re.compile(r"cl-[0-9a-f]+\.[0-9a-f]+")


def step(v: jnp.ndarray) -> jnp.ndarray:
    return (v + jnp.sum(v)) % 1024.0  # integer-valued: any reduction order gives the same bits


def gather(v: jnp.ndarray) -> jnp.ndarray:
    return jnp.concatenate([v, v], axis=0)


def tenant(address: str, token: str, k: int, programs: int, tally: dict[str, int],
           lock: threading.Lock) -> None:
    with isthmus.connect(address, token=token, name=f"tenant-{k}") as c:
        axis: str | tuple[str, str] = "x" if k % 2 else ("data", "model")
        s = c.slice({"x": 8} if k % 2 else {"data": 2, "model": 4}, island="a")
        f = c.jit(step, slice=s, in_specs=P(axis), out_specs=P(axis))
        g = c.jit(gather, slice=s, in_specs=P(axis), out_specs=P())
        prog = c.program(lambda v: g(f(f(v))))
        x0 = np.arange(32, dtype=np.float32) + k
        x = c.put(x0, s, P(axis))
        y = np.asarray(step(step(x0)))
        want = np.concatenate([y, y])
        for out in [prog(x) for _ in range(programs)]:
            try:
                outcome = "right" if np.array_equal(out.numpy(), want) else "wrong"
            except isthmus.IsthmusError as e:
                cause = BUFFER_ID.sub("<buffer>", str(e).splitlines()[-1])  # one tally per kind
                outcome = f"failed: {cause[:160]}"
            with lock:
                tally[outcome] = tally.get(outcome, 0) + 1


def run(address: str, token: str, clients: int, programs: int, deadline: float) -> dict[str, Any]:
    """Every client's programs, each run's outcome tallied, until they settle or the deadline."""
    tally: dict[str, int] = {}
    lock = threading.Lock()
    threads = [threading.Thread(target=tenant, args=(address, token, k, programs, tally, lock), daemon=True)
               for k in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(0.0, deadline - (time.perf_counter() - start)))
    elapsed = time.perf_counter() - start
    with lock:
        outcomes = dict(sorted(tally.items(), key=lambda kv: -kv[1]))
    failed = sum(n for what, n in outcomes.items() if what.startswith("failed"))
    right, wrong = outcomes.get("right", 0), outcomes.get("wrong", 0)
    return {"runs": clients * programs, "right": right, "wrong": wrong, "failed": failed,
            "unsettled": clients * programs - right - wrong - failed,
            "clients_waiting": sum(t.is_alive() for t in threads), "elapsed_s": elapsed,
            "outcomes": outcomes}


def describe(name: str, r: dict[str, Any], clients: int) -> str:
    outcomes = ", ".join(f"{n} {what}" for what, n in r["outcomes"].items())
    return (f"{name} after {r['elapsed_s']:.0f} s, {r['clients_waiting']} of {clients} clients still "
            f"waiting; of {r['runs']} runs: {outcomes or 'none settled'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gang_order", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--deadline", type=float, default=None, help="seconds per setting (default 120)")
    parser.add_argument("--server", help="a running server with island groups for the ordered setting "
                                         "(admin token in ISTHMUS_TOKEN) instead of a local one")
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE}: for CI")
    args = parser.parse_args(argv)
    size = {**(SMOKE if args.smoke else FULL)}
    if args.deadline is not None:
        size["deadline"] = args.deadline
    settings: dict[str, dict[str, Any]] = {}
    for order in (True, False):
        name = "order_on" if order else "order_off"
        env = {**GROUPS, "ISTHMUS_GANG_ORDER": "1" if order else "0"}
        with server(args.server if order else None, env, ISLAND_A) as (address, token):
            settings[name] = run(address, token, size["clients"], size["programs"], size["deadline"])
        print(describe(name, settings[name], size["clients"]), flush=True)
    result = {"settings": settings, "config": size | {"server_env": GROUPS}, "machine": machine()}
    print(json.dumps(result, indent=2), file=sys.stderr)
    write_json(args.json, result, JSON_KEYS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
