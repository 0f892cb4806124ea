"""What the island order prevents: the multi-tenant collective workload with it on and off.

    python -m bench.gang_order [--deadline 120]

Two embedded servers, one after the other, both with `ISTHMUS_ISLAND_GROUPS=1`: one with the
gang order (the default), one with `ISTHMUS_GANG_ORDER=0`, a debug switch under which each
host of a submission takes it after a random delay of up to 5 ms, in its own arrival order,
with no admission. The workload is the e2e test's: 8 clients, each running 50 programs of
two all-reduces and an all-gather on a slice spanning both hosts of island `a` (the slices
overlap). Prints, per setting, how many runs finished with the right value before the
deadline, wrong, or failed (with the first line of the cause). Not a test: with the order
off the island is expected to hang or to compute garbage.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

import client as isthmus
from bench.call_latency import fork_exec_allowed
from client.embedded import EmbeddedServer

CLIENTS, PROGRAMS = 8, 50


def step(v: jnp.ndarray) -> jnp.ndarray:
    return (v + jnp.sum(v)) % 1024.0  # integer-valued: any reduction order gives the same bits


def gather(v: jnp.ndarray) -> jnp.ndarray:
    return jnp.concatenate([v, v], axis=0)


def tenant(address: str, token: str, k: int, tally: dict[str, int], lock: threading.Lock) -> None:
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
        for out in [prog(x) for _ in range(PROGRAMS)]:
            try:
                outcome = "right" if np.array_equal(out.numpy(), want) else "wrong"
            except isthmus.IsthmusError as e:
                outcome = f"failed: {str(e).splitlines()[-1][:160]}"
            with lock:
                tally[outcome] = tally.get(outcome, 0) + 1


def run(order: bool, deadline: float) -> str:
    env = {"ISTHMUS_ISLAND_GROUPS": "1", "ISTHMUS_GANG_ORDER": "1" if order else "0"}
    with tempfile.TemporaryDirectory(prefix="isthmus-order-") as tmp:
        with fork_exec_allowed():
            server = EmbeddedServer.start(Path(tmp), env=env)
        try:
            token = (Path(tmp) / "token").read_text().strip()
            tally: dict[str, int] = {}
            lock = threading.Lock()
            threads = [threading.Thread(target=tenant, args=(server.address, token, k, tally, lock),
                                        daemon=True) for k in range(CLIENTS)]
            start = time.perf_counter()
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=max(0.0, deadline - (time.perf_counter() - start)))
            elapsed = time.perf_counter() - start
            waiting = sum(t.is_alive() for t in threads)
            outcomes = ", ".join(f"{n} {what}" for what, n in sorted(tally.items(), key=lambda kv: -kv[1]))
            return (f"gang order {'on ' if order else 'off'} after {elapsed:.0f} s, {waiting} of {CLIENTS} "
                    f"clients still waiting; of {CLIENTS * PROGRAMS} runs: {outcomes or 'none settled'}")
        finally:
            server.stop()  # its executors, stuck or not, go with it


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deadline", type=float, default=120.0, help="seconds per setting")
    args = parser.parse_args(argv)
    for order in (True, False):
        print(run(order, args.deadline), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
