"""Per-call latency of a trivial computation through Isthmus, against JAX and a plain Ray actor.

    python -m bench.call_latency --json /tmp/call_latency.json [--iters 300] [--repeats 9]
    python -m bench.call_latency --smoke --json /tmp/call_latency.json   # seconds: every mode, tiny

The computation is `a + 1` on a float32[8] held on one CPU device, chained: each call's output
is the next call's input. Six modes, all measured in one run on the same machine:

- `jax_jit`: `jax.jit` in this process, `block_until_ready` after every call (the physical
  limit for dispatch); `jax_jit_async`: the same, blocking only after the last call.
- `ray_actor_sync`: a plain Ray actor (its own process, its own array) doing the same jitted
  call, with `ray.get` on every call, which is what a user would write instead of Isthmus;
  `ray_actor_pipelined`: submit every call, then `ray.get` them all.
- `isthmus_sync`: `y = f(y); y.result()` on a 1-device slice through the server;
  `isthmus_pipelined`: `y = f(y)` back to back (chained futures), `.result()` at the end.
- `isthmus_program` and `isthmus_program_traced`: the same call as a one-node program
  (`c.program`), synchronous, untraced and traced (`trace=True`: its host records its steps,
  the server its scheduling; `server.tracing`). Their ratio is what tracing a run costs; an
  untraced run takes the same path as before tracing existed but for one flag tested per
  message and per step on the host, so `isthmus_program` against `isthmus_sync` (and both
  against the Ray baseline) is where a cost of tracing off would show.

Each mode is warmed up (compile, first calls), then timed `--repeats` times over `--iters`
calls; the median of the repeats is reported in microseconds per call. Single repeats move a
lot on a shared machine (pipelined ones by half within one run here): nine by default. Every
mode's final value must equal the number of calls it made, or the run fails: a broken mode
cannot report a fast time. The modes take turns repeat by repeat, so that drift on a shared
machine weighs on each of them alike (measured apart, the Ray baseline and Isthmus moved by
a third between runs minutes apart): the Isthmus server starts first, with its own Ray, then
the baseline's Ray starts in this process beside it. This baseline imports Ray directly, as
a user would; it is the one place outside `executors/` that does.

Beside the modes, two requests isolate parts of an Isthmus call (`components_us`): an HTTP
round trip the server answers without an executor (`Client.buffers()`), and an upload
followed by a wait, which the server answers after a round trip to the host executor over
its channel (`Client.put(small).result()`, two requests).

`--server URL` measures a running server instead of starting one (its admin token in
ISTHMUS_TOKEN): `bench.multinode` points it at a server on a multi-node Ray. The baselines'
Ray is one of this process's own, started beside the server and stopped after, unless this
process has joined a Ray already (then that one is used and left up).

`--smoke` runs every mode and component a few calls (`SMOKE`): seconds, for CI; its figures
mean nothing. Output (`--json PATH`, the keys `JSON_KEYS`): `us_per_call` (mode -> median
µs), `ratios` (A µs / baseline µs, the median of the per-repeat ratios, so 1.0 is parity
and larger is slower; `bench.paired`), `ratios_of_medians`, `ratio_definition`,
`components_us`, `components_definition`, `samples_us` (every repeat), `machine`, `iters`,
`repeats`, `warmup`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import ray

import client as isthmus
from bench import servers
from bench.machine import describe
from bench.output import write_json
from bench.paired import ratio
from bench.servers import fork_exec_allowed

SHAPE = (8,)
SMOKE = {"iters": 5, "repeats": 2, "warmup": 2}
JSON_KEYS = ("us_per_call", "ratios", "ratios_of_medians", "ratio_definition", "components_us",
             "components_definition", "samples_us", "machine", "iters", "repeats", "warmup")

RATIOS: dict[str, tuple[str, str]] = {
    "isthmus_sync_vs_jax_jit": ("isthmus_sync", "jax_jit"),
    "isthmus_pipelined_vs_jax_jit_async": ("isthmus_pipelined", "jax_jit_async"),
    "isthmus_sync_vs_ray_actor_sync": ("isthmus_sync", "ray_actor_sync"),
    "isthmus_pipelined_vs_ray_actor_pipelined": ("isthmus_pipelined", "ray_actor_pipelined"),
    "ray_actor_sync_vs_jax_jit": ("ray_actor_sync", "jax_jit"),
    "ray_actor_pipelined_vs_jax_jit_async": ("ray_actor_pipelined", "jax_jit_async"),
    "isthmus_program_vs_ray_actor_sync": ("isthmus_program", "ray_actor_sync"),
    "isthmus_program_traced_vs_isthmus_program": ("isthmus_program_traced", "isthmus_program"),
}
RATIO_DEFINITION = (
    "ratio 'A_vs_B' = microseconds per call of A over B: the median of the per-repeat ratios, as "
    "the modes take turns repeat by repeat (ratios_of_medians: us_per_call[A] / us_per_call[B]); "
    "1.0 is parity, larger means A is slower than the baseline B"
)


class BenchError(RuntimeError):
    """A mode computed the wrong value or could not run; its timing would mean nothing."""


def add_one(a: jax.Array) -> jax.Array:
    return a + 1


@dataclass(frozen=True)
class Mode:
    name: str
    run: Callable[[int], None]  # n chained calls; returns once the last one is complete
    value: Callable[[], float]  # the current value of the chain (not timed)


class JaxLoop:
    """The chain held in one process: this one, or a Ray actor's."""

    def __init__(self) -> None:
        self._f = jax.jit(add_one)
        self._x = jnp.zeros(SHAPE, jnp.float32)

    def step(self) -> None:
        self._x = self._f(self._x).block_until_ready()

    def sync(self, n: int) -> None:
        for _ in range(n):
            self._x = self._f(self._x).block_until_ready()

    def pipelined(self, n: int) -> None:
        x = self._x
        for _ in range(n):
            x = self._f(x)
        self._x = x.block_until_ready()

    def value(self) -> float:
        return float(self._x[0])


class RayActorLoop:
    """The chain held by a plain Ray actor, driven from here."""

    def __init__(self) -> None:
        actor = ray.remote(num_cpus=0)(JaxLoop)
        self._actor = actor.options(runtime_env={"env_vars": {"JAX_PLATFORMS": "cpu"}}).remote()

    def sync(self, n: int) -> None:
        for _ in range(n):
            ray.get(self._actor.step.remote())

    def pipelined(self, n: int) -> None:
        ray.get([self._actor.step.remote() for _ in range(n)])

    def value(self) -> float:
        return float(ray.get(self._actor.value.remote()))


class IsthmusLoop:
    """The chain held on an Isthmus slice, as `Buffer` futures."""

    def __init__(self, c: isthmus.Client, s: isthmus.Slice, program: bool = False,
                 trace: bool = False) -> None:
        """Calls of a jitted function, or (`program`) runs of a one-call program, traced or not."""
        f = c.jit(add_one, slice=s)
        self._f = f if not program else c.program(lambda y: f(y), trace=trace,
                                                  name="traced" if trace else "untraced")
        self._y: isthmus.Buffer = c.put(np.zeros(SHAPE, np.float32), s)

    def sync(self, n: int) -> None:
        for _ in range(n):
            self._y = self._f(self._y).result()

    def pipelined(self, n: int) -> None:
        y = self._y
        for _ in range(n):
            y = self._f(y)
        self._y = y.result()

    @property
    def last(self) -> isthmus.Buffer:
        return self._y

    def value(self) -> float:
        return float(self._y.numpy()[0])


def time_in_turn(runs: dict[str, Callable[[int], None]], iters: int, repeats: int,
                 warmup: int) -> dict[str, list[float]]:
    """µs per call of each run's `repeats` timed runs of `iters` calls, taking turns in each
    repeat, after `warmup` untimed calls each."""
    for run in runs.values():
        run(warmup)
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, run in runs.items():
            gc.collect()
            start = time.perf_counter()
            run(iters)
            samples[name].append((time.perf_counter() - start) / iters * 1e6)
    return samples


def measure_in_turn(modes: Sequence[Mode], iters: int, repeats: int, warmup: int) -> dict[str, list[float]]:
    """The modes' samples (`time_in_turn`); then check that every chain ends where that many
    calls must leave it."""
    samples = time_in_turn({mode.name: mode.run for mode in modes}, iters, repeats, warmup)
    expected = float(warmup + repeats * iters)
    for mode in modes:
        got = mode.value()
        if got != expected:
            raise BenchError(f"mode {mode.name}: expected the chain to end at {expected:g} "
                             f"(warm-up {warmup} + {repeats} x {iters} calls), found {got:g}")
        print(f"  {mode.name:<34} {statistics.median(samples[mode.name]):10.1f} us/call", file=sys.stderr)
    return samples


def isthmus_components(c: isthmus.Client, s: isthmus.Slice) -> dict[str, Callable[[int], None]]:
    """Requests that isolate the parts of an Isthmus call, through the public client API."""
    small = np.zeros(8, np.float32)

    def http(n: int) -> None:
        for _ in range(n):
            c.buffers()

    def http_and_executor(n: int) -> None:
        for _ in range(n):
            c.put(small, s).result()

    return {"isthmus_http_roundtrip": http, "isthmus_http_plus_executor_roundtrip": http_and_executor}


COMPONENTS_DEFINITION = (
    "isthmus_http_roundtrip: Client.buffers(), an authenticated request the server answers from "
    "memory (no executor); isthmus_http_plus_executor_roundtrip: Client.put(float32[8]).result(): "
    "two requests, the upload (answered once the server holds it) and a wait, which is a round "
    "trip from the server to the host executor over its channel"
)


@contextlib.contextmanager
def local_ray() -> Iterator[None]:
    """A Ray of this process's own for the baselines, stopped after; or, where this process
    has joined a Ray already, that one, left as it is (a test running several benchmarks
    in one process starts one Ray for all of them)."""
    if ray.is_initialized():
        yield
        return
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    # Its workers at this process's priority, as Isthmus's own Ray runs its executors.
    os.environ.setdefault("RAY_worker_niceness", "0")
    with fork_exec_allowed():
        # address="local": a Ray of its own even where this machine runs another cluster
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
                 log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@contextlib.contextmanager
def isthmus_client(server: str | None = None) -> Iterator[isthmus.Client]:
    """A client of the server at `server` (its admin token in ISTHMUS_TOKEN), or of a local
    server (its own Ray) started for it and stopped after (`bench.servers`)."""
    with servers.server(server) as (address, token), \
            isthmus.connect(address, token=token, name="bench") as c:
        yield c


def run_all(iters: int, repeats: int, warmup: int, server: str | None = None
            ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Every mode's samples, taken in turn, then the Isthmus components' samples (µs per
    call). The server starts before the baseline's Ray: what starting that Ray sets in this
    process's environment stays out of the server's."""
    print(f"Isthmus ({server or 'starting the server'}), a plain Ray actor and jax.jit here, "
          "taking turns", file=sys.stderr)
    with isthmus_client(server) as c:
        s = c.slice({"x": 1})
        i1, i2 = IsthmusLoop(c, s), IsthmusLoop(c, s)
        p1, p2 = IsthmusLoop(c, s, program=True), IsthmusLoop(c, s, program=True, trace=True)
        with local_ray():
            a, b = JaxLoop(), JaxLoop()
            r1, r2 = RayActorLoop(), RayActorLoop()
            samples = measure_in_turn([
                Mode("jax_jit", a.sync, a.value), Mode("jax_jit_async", b.pipelined, b.value),
                Mode("ray_actor_sync", r1.sync, r1.value),
                Mode("ray_actor_pipelined", r2.pipelined, r2.value),
                Mode("isthmus_sync", i1.sync, i1.value), Mode("isthmus_pipelined", i2.pipelined, i2.value),
                Mode("isthmus_program", p1.sync, p1.value), Mode("isthmus_program_traced", p2.sync, p2.value),
            ], iters, repeats, warmup)
        components = time_in_turn(isthmus_components(c, s), iters, repeats, warmup)
        for name, us in components.items():
            print(f"  {name:<34} {statistics.median(us):10.1f} us/call", file=sys.stderr)
    return samples, components


def machine() -> dict[str, Any]:
    return describe(ray=ray.__version__, devices="simulated CPU devices (jax_platforms=cpu)")


def report(samples: dict[str, list[float]], components: dict[str, list[float]], iters: int,
           repeats: int, warmup: int) -> dict[str, Any]:
    us = {m: statistics.median(v) for m, v in samples.items()}
    return {
        "us_per_call": us,
        "ratios": {name: ratio(samples[a], samples[b], in_turn=True) for name, (a, b) in RATIOS.items()},
        "ratios_of_medians": {name: us[a] / us[b] for name, (a, b) in RATIOS.items()},
        "ratio_definition": RATIO_DEFINITION,
        "components_us": {m: statistics.median(v) for m, v in components.items()},
        "components_definition": COMPONENTS_DEFINITION,
        "samples_us": samples | components,
        "machine": machine(),
        "iters": iters,
        "repeats": repeats,
        "warmup": warmup,
    }


def table(result: dict[str, Any]) -> str:
    rows = [f"{'mode (median of repeats)':<34} {'us/call':>10} {'min':>10} {'max':>10}"]
    for m, median in result["us_per_call"].items():
        xs = result["samples_us"][m]
        rows.append(f"{m:<34} {median:10.1f} {min(xs):10.1f} {max(xs):10.1f}")
    rows.append("components of an Isthmus call:")
    for m, median in result["components_us"].items():
        xs = result["samples_us"][m]
        rows.append(f"{'  ' + m:<34} {median:10.1f} {min(xs):10.1f} {max(xs):10.1f}")
    rows.append("")
    rows.append("ratio (A us / B us)")
    rows += [f"{name:<42} {r:8.2f}" for name, r in result["ratios"].items()]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.call_latency", description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--iters", type=int, default=300, help="calls per timed repeat (default 300)")
    p.add_argument("--repeats", type=int, default=9, help="timed repeats per mode (default 9)")
    p.add_argument("--warmup", type=int, default=20, help="untimed calls first (default 20)")
    p.add_argument("--server", help="a running server's address (admin token in ISTHMUS_TOKEN) "
                                    "instead of a local one")
    p.add_argument("--smoke", action="store_true", help=f"a few calls per mode ({SMOKE}): seconds, for CI")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    if min(args.iters, args.repeats) < 1 or args.warmup < 1:
        p.error("--iters, --repeats and --warmup must be at least 1")
    # Every mode runs on CPU devices, so the baselines are the same hardware as the executors.
    jax.config.update("jax_platforms", "cpu")
    samples, components = run_all(args.iters, args.repeats, args.warmup, args.server)
    result = report(samples, components, args.iters, args.repeats, args.warmup)
    m = result["machine"]
    print(f"call latency, {args.iters} calls x {args.repeats} repeats (median); "
          f"{m['cpus_usable']} CPUs, python {m['python']}, jax {m['jax']}, ray {m['ray']}")
    print(table(result))
    write_json(args.json, result, JSON_KEYS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
