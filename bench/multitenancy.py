"""Many clients on one island: aggregate throughput and the proportional-share split (Pathways §5.2).

    python -m bench.multitenancy --json /tmp/multitenancy.json
    python -m bench.multitenancy --smoke --json /tmp/multitenancy.json   # for CI: tiny

Two embedded servers (local Ray, 2 islands x 2 hosts x 4 CPU devices), one after the other:
one with the defaults (proportional share, window 256) for throughput, one admitting one
run at a time (`ISTHMUS_GANG_WINDOW=1`, the default share policy) for the split. A small
program is 4 computations (a 64x64 matmul and tanh, in a chain) on a 1-device slice of
island `a`.

- Throughput: for 1, 4, 8 and 16 clients at equal weight, each client (a thread) keeps 4
  runs of its program in flight for a fixed number of runs; `computations_per_s[n]` is all
  clients' computations over the wall time. A client's own runs feed each other nothing,
  so the island's executors are the only shared resource.
- Share: 4 clients at weights 1:2:4:8 each queue `runs` runs while a blocker's in-graph
  loop holds the island; the loop ends only when the blocker's client closes, so every run
  is queued first however slowly (checked: the island's queue holds them all). The
  heaviest client's runs are followed by a loop of its own (on another host of the island,
  so that its runs' values can be read meanwhile) that holds the island in turn until that
  client closes. The blocker closed, runs are admitted one at a time by share;
  once the heaviest's loop is admitted, nothing else is, so the counters read then (the
  cost admitted per client, `GET /v1/islands` as the admin sees it) are those at the moment
  its last run was admitted, however late they are read. `share` gives each weight's
  fraction of the runs admitted since all were queued, beside the fraction its weight asks
  for (a client asks weight / sum of weights while all are backlogged, which they stay:
  the heaviest has the most runs left to it and is the first to drain).

Every run's value is checked against `jax.jit` here. `--server URL` and `--share-server URL`
measure running servers with those settings (their admin token in ISTHMUS_TOKEN) instead
of starting them. `--smoke` runs 1 and 2 clients and a share of 4 runs each (`SMOKE`), for
CI; its figures mean nothing. Output (`--json PATH`, the keys `JSON_KEYS`):
`computations_per_s` (clients -> rate), `share` and `share_expected` (weight -> fraction),
`ratios` (`clientsN_vs_clients1`, `share_max_relative_error`), `config`, `machine`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import jax
import jax.numpy as jnp
import numpy as np

import client as isthmus
from bench.call_latency import BenchError, machine
from bench.output import write_json
from bench.servers import server

WEIGHTS = (1, 2, 4, 8)
STEPS = 4  # computations per program
IN_FLIGHT = 4
SHARE_ENV = {"ISTHMUS_GANG_WINDOW": "1"}  # one run admitted at a time; the policy is share by default
FULL = {"clients": (1, 4, 8, 16), "runs": 40, "share_runs": 128}
SMOKE = {"clients": (1, 2), "runs": 2, "share_runs": 4}
ADMITTED_S = 120.0  # the longest the heaviest client's loop may take to be admitted
JSON_KEYS = ("computations_per_s", "share", "share_expected", "ratios", "config", "machine")


def step(v: jax.Array) -> jax.Array:
    return jnp.tanh(v @ v) * 0.5


def expected(x: np.ndarray) -> np.ndarray:
    f = jax.jit(step)
    for _ in range(STEPS):
        x = np.asarray(f(x))
    return x


class Tenant:
    """One client with its slice on island `a` and its traced, compiled program."""

    def __init__(self, address: str, token: str, name: str, weight: float = 1.0) -> None:
        self.c = isthmus.connect(address, token=token, name=name, weight=weight)
        self.slice = self.c.slice({"x": 1}, island="a")
        f = self.c.jit(step, slice=self.slice)

        def chain(v: Any) -> Any:
            for _ in range(STEPS):
                v = f(v)
            return v

        self.program = self.c.program(chain)
        self.x = self.c.put(np.eye(64, dtype=np.float32) * 0.3, self.slice)
        self.want = expected(np.eye(64, dtype=np.float32) * 0.3)
        self.check(self.program(self.x))  # trace, register, compile

    def check(self, out: isthmus.Buffer) -> None:
        if not np.allclose(out.numpy(), self.want, rtol=1e-5, atol=1e-6):
            raise BenchError(f"{self.c.id}: a run computed something else than jax.jit")

    def run(self, runs: int) -> None:
        window: list[isthmus.Buffer] = []
        for _ in range(runs):
            window.append(self.program(self.x))
            if len(window) >= IN_FLIGHT:
                window.pop(0).result()
        for out in window:
            self.check(out)

    def hold(self, s: isthmus.Slice) -> isthmus.Buffer:
        """An in-graph loop on `s` that ends only when this tenant's client closes."""
        below = self.c.jit(lambda i, n: i < n, slice=s)
        inc = self.c.jit(lambda i: i + 1, slice=s)
        loop = self.c.program(lambda i, n: isthmus.while_loop(lambda j: below(j, n), inc, i))
        return loop(np.int32(0), np.int32(2**30))

    def elsewhere(self) -> isthmus.Slice:
        """A 1-device slice of island `a` on another host than this tenant's runs: a loop
        there leaves their values readable (a host running a loop reads out nothing else)."""
        for _ in range(8):
            s = self.c.slice({"x": 1}, island="a")
            if set(s.hosts).isdisjoint(self.slice.hosts):
                return s
        raise BenchError(f"expected a 1-device slice of island a off hosts {self.slice.hosts}, found none")


def throughput(address: str, token: str, n: int, runs: int) -> float:
    tenants = [Tenant(address, token, f"t{n}-{k}") for k in range(n)]
    try:
        threads = [threading.Thread(target=t.run, args=(runs,)) for t in tenants]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    finally:
        for t in tenants:
            t.c.close()
    rate = n * runs * STEPS / elapsed
    print(f"  {n:>2} clients: {rate:10.1f} computations/s", file=sys.stderr)
    return rate


def island_a(address: str, token: str) -> dict[str, Any]:
    """Island a as the admin sees it: every client's admitted cost (a client sees its own)."""
    islands = httpx.get(f"{address}/v1/islands", headers={"Authorization": f"Bearer {token}"},
                        timeout=30).raise_for_status().json()
    return next(i for i in islands if i["name"] == "a")


def admitted_since(address: str, token: str, before: dict[str, float], ids: list[str]) -> list[float]:
    now = island_a(address, token)["admitted"]
    return [now.get(i, 0.0) - before.get(i, 0.0) for i in ids]


def share(address: str, token: str, runs: int) -> dict[str, float]:
    """Each weight's fraction of the runs admitted from a backlog of all four clients until
    the heaviest's last (see the module docstring)."""
    tenants = [Tenant(address, token, f"w{w}", weight=w) for w in WEIGHTS]
    heaviest = tenants[-1]
    blocker = Tenant(address, token, "blocker")
    try:
        blocker.hold(blocker.slice)
        blocker.c.flush()  # on the island's queue before any run
        outs: list[list[isthmus.Buffer]] = [[] for _ in tenants]

        elsewhere = heaviest.elsewhere()

        def queue(k: int) -> None:
            outs[k] = [tenants[k].program(tenants[k].x) for _ in range(runs)]
            if tenants[k] is heaviest:
                heaviest.hold(elsewhere)  # once admitted, it holds the island as the blocker did
            tenants[k].c.flush()

        threads = [threading.Thread(target=queue, args=(k,)) for k in range(len(tenants))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        island = island_a(address, token)
        if island["queued"] != len(tenants) * runs + 1:
            raise BenchError(f"expected every run and the heaviest client's loop queued behind the "
                             f"blocker ({len(tenants) * runs + 1}), found {island['queued']} queued")
        before = dict(island["admitted"])
        ids = [t.c.id for t in tenants]
        blocker.c.close()  # its loop ends: the backlog goes, one run at a time
        deadline = time.monotonic() + ADMITTED_S
        while (got := admitted_since(address, token, before, ids))[-1] <= STEPS * runs:
            if time.monotonic() > deadline:
                raise BenchError(f"the heaviest client's loop was not admitted within {ADMITTED_S:g}s "
                                 f"(cost admitted since the backlog: {got})")
            time.sleep(0.05)
        got[-1] = STEPS * runs  # its runs, not its loop
        heaviest.check(outs[-1][-1])
        heaviest.c.close()  # its loop ends: the others' runs go on
        for t, o in zip(tenants[:-1], outs[:-1], strict=True):
            t.check(o[-1])
    finally:
        for t in [*tenants, blocker]:
            t.c.close()
    total = sum(got)
    return {str(w): g / total for w, g in zip(WEIGHTS, got, strict=True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.multitenancy",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--server", help="a running server with the defaults, for throughput "
                                         "(admin token in ISTHMUS_TOKEN)")
    parser.add_argument("--share-server", help="a running server with ISTHMUS_GANG_WINDOW=1, for the "
                                               "share (admin token in ISTHMUS_TOKEN)")
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE}: for CI")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    size = SMOKE if args.smoke else FULL
    with server(args.server) as (address, token):  # the defaults
        print("throughput", file=sys.stderr)
        rates = {str(n): throughput(address, token, n, size["runs"]) for n in size["clients"]}
    with server(args.share_server, SHARE_ENV) as (address, token):
        print("share", file=sys.stderr)
        shares = share(address, token, size["share_runs"])
    want = {str(w): w / sum(WEIGHTS) for w in WEIGHTS}
    result = {
        "computations_per_s": rates,
        "share": shares,
        "share_expected": want,
        "ratios": {
            **{f"clients{n}_vs_clients1": rates[str(n)] / rates["1"] for n in size["clients"][1:]},
            "share_max_relative_error": max(abs(shares[w] - want[w]) / want[w] for w in want),
        },
        "config": {"steps_per_program": STEPS, "runs_per_client": size["runs"], "in_flight": IN_FLIGHT,
                   "share_runs": size["share_runs"], "weights": list(WEIGHTS),
                   "clients": list(size["clients"]), "throughput_server": "defaults",
                   "share_server": SHARE_ENV},
        "machine": machine(),
    }
    print(json.dumps(result, indent=2))
    write_json(args.json, result, JSON_KEYS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
