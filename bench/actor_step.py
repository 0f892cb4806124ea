"""What a Ray actor's process costs a chain of computations: `bench.dispatch`'s trivial
4-device computation chained by `jax.jit` op by op, in this process and in a plain Ray actor.

    python -m bench.actor_step --json /tmp/actor_step.json [--rounds 30] [--pause 0.2]
    python -m bench.actor_step --smoke --json /tmp/actor_step.json   # seconds, for CI

An Isthmus executor is a Ray actor issuing the executable `jax.jit` compiles, one call after
another; this isolates the cost of the process it does so in. Both modes run the same code
(`Chain`, a round of `--steps` calls, blocking at the end) with the same XLA settings (4
simulated CPU devices, `NPROC` = 8 or `--nproc`, the actor at this process's priority),
taking turns round by round. `--pause` sleeps after each round, as `bench.dispatch`'s modes wait for each
other's rounds; each value is checked against the round's expected end.

`--smoke` runs both modes two short rounds (`SMOKE`), for CI; its figures mean nothing.
Output (`--json PATH`, the keys `JSON_KEYS`): `us_per_step` (mode -> median µs per
computation), `ratio` (`actor_vs_local`, the median of the per-round ratios: 1.0 is parity,
larger is slower), `samples_us`, `machine`, `config`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import ray

from bench.call_latency import BenchError, local_ray, machine
from bench.dispatch_modes import DEVICES, THREADS, jitted, local_mesh, oracle, trivial
from bench.output import write_json
from bench.paired import ratio

SMOKE = {"rounds": 2, "steps": 8}
JSON_KEYS = ("us_per_step", "ratio", "samples_us", "machine", "config")


class Chain:
    """`steps` calls of the trivial computation, each on the last one's output."""

    def __init__(self, steps: int) -> None:
        import jax  # in the actor's process, after its environment is set
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        w = trivial()
        mesh = local_mesh(w.devices)
        self._f = jitted(w, mesh)
        self._x = jax.device_put(w.x0, NamedSharding(mesh, P("x")))
        self._steps = steps

    def rounds(self, k: int, pause: float) -> tuple[list[float], np.ndarray]:
        """µs per step of k rounds, and the last round's value."""
        us, y = [], self._x
        for _ in range(k):
            start = time.perf_counter()
            y = self._x
            for _ in range(self._steps):
                y = self._f(y)
            y.block_until_ready()
            us.append((time.perf_counter() - start) / self._steps * 1e6)
            if pause:
                time.sleep(pause)
        return us, np.asarray(y)


def configure(nproc: int) -> dict[str, str]:
    """This process's XLA settings, which the actor is given too."""
    env = {"JAX_PLATFORMS": "cpu", "NPROC": str(nproc),
           "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}"}
    os.environ.update(env)
    os.environ.setdefault("RAY_worker_niceness", "0")  # as Isthmus runs its executors
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.actor_step", description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--rounds", type=int, default=30, help="timed rounds per mode")
    p.add_argument("--steps", type=int, default=128, help="computations per round")
    p.add_argument("--pause", type=float, default=0.0, help="seconds idle after each round")
    p.add_argument("--nproc", type=int, default=THREADS,
                   help=f"XLA's CPU pool threads in both processes (default {THREADS}; fewer may deadlock)")
    p.add_argument("--smoke", action="store_true", help=f"{SMOKE}: seconds, for CI")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    env = configure(args.nproc)  # before any JAX backend exists here
    want = oracle(trivial(), args.steps)
    samples: dict[str, list[float]] = {"local": [], "actor": []}
    with local_ray():
        actor: Any = ray.remote(Chain).options(num_cpus=0, runtime_env={"env_vars": env}).remote(args.steps)
        local = Chain(args.steps)
        ray.get(actor.rounds.remote(3, 0.0))
        local.rounds(3, 0.0)
        for _ in range(args.rounds):
            for name, (us, got) in (("local", local.rounds(1, args.pause)),
                                    ("actor", ray.get(actor.rounds.remote(1, args.pause)))):
                if not np.allclose(got, want):
                    raise BenchError(f"mode {name}: a round ended at {got}, expected {want}")
                samples[name] += us
    result = {
        "us_per_step": {m: statistics.median(v) for m, v in samples.items()},
        "ratio": {"actor_vs_local": ratio(samples["actor"], samples["local"], in_turn=True)},
        "samples_us": samples,
        "machine": machine(),
        "config": vars(args) | {"json": str(args.json), "env": env},
    }
    print(f"µs per step (median of {args.rounds} rounds of {args.steps}, pause {args.pause} s): "
          + ", ".join(f"{m} {v:.1f}" for m, v in result["us_per_step"].items())
          + f"; actor_vs_local {result['ratio']['actor_vs_local']:.3f}")
    write_json(args.json, result, JSON_KEYS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
