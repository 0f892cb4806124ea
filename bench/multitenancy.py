"""Many clients on one island: aggregate throughput and the proportional-share split (Pathways §5.2).

    python -m bench.multitenancy --json /tmp/multitenancy.json [--quick]

Embedded servers (local Ray, 2 islands x 2 hosts x 4 CPU devices), one after the other: the
defaults (FIFO, window 16) for throughput, proportional share one run at a time
(`ISTHMUS_GANG_POLICY=share`, `ISTHMUS_GANG_WINDOW=1`) for the split. A small program is 4
computations (a 64x64 matmul and tanh, in a chain) on a 1-device slice of island `a`.

- Throughput: for 1, 4, 8 and 16 clients at equal weight, each client (a thread) keeps 4
  runs of its program in flight for a fixed number of runs; `computations_per_s[n]` is all
  clients' computations over the wall time. A client's own runs feed each other nothing,
  so the island's executors are the only shared resource.
- Share: 4 clients at weights 1:2:4:8 each queue `runs` runs behind a long call, so all are
  backlogged from the start; when the heaviest has had all of its runs admitted, `share`
  gives each weight's fraction of everything admitted since all were queued, read from the
  gang scheduler's counters (`GET /v1/islands`), beside the fraction the weights ask for.

Every run's value is checked against numpy. Timing decides nothing in the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import client as isthmus
from bench.call_latency import BenchError, fork_exec_allowed, machine
from client.embedded import EmbeddedServer

CLIENTS = (1, 4, 8, 16)
WEIGHTS = (1, 2, 4, 8)
STEPS = 4  # computations per program
IN_FLIGHT = 4
SHARE_ENV = {"ISTHMUS_GANG_POLICY": "share", "ISTHMUS_GANG_WINDOW": "1"}


def step(v: jax.Array) -> jax.Array:
    return jnp.tanh(v @ v) * 0.5


def expected(x: np.ndarray) -> np.ndarray:
    f = jax.jit(step)
    for _ in range(STEPS):
        x = np.asarray(f(x))
    return x


@contextmanager
def server(env: dict[str, str]) -> Iterator[tuple[str, str]]:
    with tempfile.TemporaryDirectory(prefix="isthmus-mt-") as tmp:
        with fork_exec_allowed():
            srv = EmbeddedServer.start(Path(tmp), env=env)
        try:
            yield srv.address, (Path(tmp) / "token").read_text().strip()
        finally:
            srv.stop()


class Tenant:
    """One client with its slice on island `a` and its traced, compiled program."""

    def __init__(self, address: str, token: str, name: str, weight: float = 1.0) -> None:
        self.c = isthmus.connect(address, token=token, name=name, weight=weight)
        s = self.c.slice({"x": 1}, island="a")
        f = self.c.jit(step, slice=s)

        def chain(v: Any) -> Any:
            for _ in range(STEPS):
                v = f(v)
            return v

        self.program = self.c.program(chain)
        self.x = self.c.put(np.eye(64, dtype=np.float32) * 0.3, s)
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


def island_a(c: isthmus.Client) -> dict[str, Any]:
    return next(i for i in c._json("GET", "/v1/islands") if i["name"] == "a")


def share(address: str, token: str, runs: int) -> dict[str, float]:
    tenants = [Tenant(address, token, f"w{w}", weight=w) for w in WEIGHTS]
    blocker = isthmus.connect(address, token=token, name="blocker")
    try:
        s = blocker.slice({"x": 1}, island="a")
        spin = blocker.jit(lambda v: jax.lax.fori_loop(0, 3000, lambda _, a: jnp.tanh(a @ a), v), slice=s)
        long = spin(blocker.put(np.eye(256, dtype=np.float32), s))
        outs: list[list[isthmus.Buffer]] = [[] for _ in tenants]

        def queue(k: int) -> None:
            outs[k] = [tenants[k].program(tenants[k].x) for _ in range(runs)]

        threads = [threading.Thread(target=queue, args=(k,)) for k in range(len(tenants))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        before = island_a(blocker)
        early = {t.c.id: before["admitted"].get(t.c.id, 0) / STEPS for t in tenants}  # runs
        if any(n > runs // 2 for n in early.values()):  # each must start well backlogged
            raise BenchError(f"the long call ended before the runs were queued: admitted so far {early}")
        long.result()
        outs[-1][-1].result()
        after = island_a(blocker)
        got = [after["admitted"].get(t.c.id, 0) - before["admitted"].get(t.c.id, 0) for t in tenants]
        for t, o in zip(tenants, outs, strict=True):
            t.check(o[-1])
    finally:
        for t in tenants:
            t.c.close()
        blocker.close()
    total = sum(got)
    return {str(w): g / total for w, g in zip(WEIGHTS, got, strict=True)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the result here")
    parser.add_argument("--quick", action="store_true", help="few runs (a smoke test)")
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    runs, share_runs = (8, 16) if args.quick else (40, 128)
    with server({}) as (address, token):  # the defaults: FIFO, window 16
        print("throughput", file=sys.stderr)
        rates = {str(n): throughput(address, token, n, runs) for n in CLIENTS}
    with server(SHARE_ENV) as (address, token):
        print("share", file=sys.stderr)
        shares = share(address, token, share_runs)
    want = {str(w): w / sum(WEIGHTS) for w in WEIGHTS}
    result = {
        "computations_per_s": rates,
        "share": shares,
        "share_expected": want,
        "ratios": {
            **{f"clients{n}_vs_clients1": rates[str(n)] / rates["1"] for n in CLIENTS[1:]},
            "share_max_relative_error": max(abs(shares[w] - want[w]) / want[w] for w in want),
        },
        "config": {"steps_per_program": STEPS, "runs_per_client": runs, "in_flight": IN_FLIGHT,
                   "share_runs": share_runs, "weights": list(WEIGHTS), "throughput_server": "defaults",
                   "share_server": SHARE_ENV},
        "machine": machine(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
