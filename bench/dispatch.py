"""Dispatch throughput of a trivial computation: Isthmus beside JAX and plain Ray (Pathways §5.1).

    python -m bench.dispatch --json /tmp/dispatch.json [--plot /tmp/dispatch.png]
    python -m bench.dispatch --platform gpu --json /tmp/dispatch_gpu.json
    python -m bench.dispatch --smoke --json /tmp/dispatch.json   # seconds: every mode, tiny

The computation is a scalar all-reduce over 4 devices plus an add: on a mesh {"x": 4},
`f(v) = v/2 + psum(v)/8 + 1` (`jax.shard_map`) on a float32[4] sharded P("x"); the mean of v
grows by exactly 1 per step, so a chain's value counts its steps. A round runs 128
computations, each on the previous one's output, from the same start. Modes, measured in one
run on one machine, each warmed up, then timed over several rounds (median computations/s).
The JAX, Ray and Isthmus modes take turns round by round (the pipelined ones, whose rounds
are 8 programs, after them), each with the others' processes up and idle: drift on a shared
machine weighs on each of them alike, and all run beside the same processes; the ratio of
two modes that took turns is the median of their per-round ratios (`bench.paired`). The Ray
modes run on a Ray of their own, started beside the server's:

- `jax_opbyop`: `jax.jit(f)` called per computation in this process, blocking at the end;
  `jax_fused`: one `jax.jit` looping f (`fori_loop`), called once.
- `ray_opbyop`: a plain Ray actor (its own process, 4 CPU devices) running jitted f, with a
  `ray.get` per call; `ray_chained`: each call's ObjectRef fed to the next, one `ray.get`.
- `isthmus_opbyop`: `c.jit(f)` on a {"x": 4} slice called per computation, the `Buffer`
  passed along, `.result()` at the end; `isthmus_chained`: one `c.program` of those 128
  calls (`fuse=False`: one executable per call) run once; `isthmus_chained_fused`: the same
  program with `fuse=True` (the server merges the calls into one executable);
  `isthmus_fused`: one `c.jit` looping f, called once. `isthmus_chained_pipelined` and
  `isthmus_chained_fused_pipelined`: 8 such programs submitted back to back, then waited
  for (the client does not wait between programs, as JAX op by op does not between calls).
- `isthmus_chain16_parallel` / `_sequential` (Fig. 7): a program of 16 stages `v + 1`, stage
  i on host i mod 4 (four {"x": 4} slices, one per host), dispatched in parallel or
  sequentially; each run is waited for before the next, so the rate is one run's latency.
  `computations_per_s` counts stages, `programs_per_s` runs. The two take turns round by
  round with each other (after the modes above), so their ratio is paired.

The size sweep (Fig. 6) makes f `v @ w + 1` on float32[n, n] (rows sharded, w a replicated
permutation, so values stay exact integers) and times `jax_opbyop` (with the server up but
idle), `isthmus_opbyop` and `isthmus_chained` per n, taking turns round by round.
`smallest_matching_ms[mode]` is the smallest JAX ms per computation at which the mode
reaches 95% of JAX op-by-op throughput (null if it never does).

Every round's value is checked against `jax.jit` run step by step here, so a broken mode
fails the run. The server starts first: what starting the baseline's Ray sets in this
process's environment stays out of the server's. The JAX and Ray baselines get NPROC=8
(XLA's CPU client thread pool, by default the core count): with 2 threads, back-to-back
asynchronous 4-device collectives deadlock in XLA's rendezvous; they need 2 per device.
The Isthmus server runs with its defaults: its executors keep up to 8 computations in
flight with a pool of 2 threads per device, which cannot deadlock (docs/architecture.md).

`--server URL` measures a running server instead of starting one (its admin token in
ISTHMUS_TOKEN; the CPU shape above): `bench.multinode` points it at a multi-node Ray.

`--platform gpu` (or `--gpu`) runs every mode on this machine's D GPUs instead: JAX here on
the GPU, the mesh {"x": D} (the all-reduce's constant scaled so the mean still grows by 1),
the Ray actor asking for D GPUs, the server given one host of D GPUs (`--cluster`), and the
size sweep over larger n (`GPU_SIZES`), whose computations take milliseconds on a GPU. The
chain16 modes need four hosts of 4 devices, which one GPU host is not: they are absent
(listed in `config.absent_modes`; ratios that use them are null), as on any server with
fewer such hosts. Every process sharing the GPU grows
its memory on demand (XLA_PYTHON_CLIENT_PREALLOCATE=false) rather than taking 75% of it
first, which would leave the server's executor too little while this process holds some.

`--smoke` (`dispatch_modes.SMOKE`) runs every mode, the sweep at one small size, the JSON
and the plot in seconds, for CI; its figures mean nothing. Output (`--json PATH`, the keys
`JSON_KEYS`): `computations_per_s` and `programs_per_s` (mode -> median), `ratios` (see
`RATIO_DEFINITION`; null where a mode is absent), `ratios_of_medians`, `ratio_definition`,
`smallest_matching_ms`, `smallest_matching_definition`, `size_sweep` (per n: JAX ms per
computation, rates, rates relative to JAX), `samples_per_s` (every round), `machine`,
`versions`, `config`.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax
import numpy as np

import client as isthmus
from bench.call_latency import BenchError, local_ray, machine
from bench.dispatch_modes import (
    AXIS,
    DEVICES,
    GPU_SIZES,
    GPU_SMOKE_SIZES,
    SMOKE,
    THREADS,
    Config,
    Round,
    Target,
    chain16_modes,
    chain16_workload,
    host_slices,
    isthmus_modes,
    jax_modes,
    matmul,
    oracle,
    ray_modes,
    trivial,
)
from bench.machine import nvidia_gpus
from bench.output import write_json
from bench.paired import ratio
from bench.servers import own_server

MATCH = 0.95  # a mode matches JAX op by op from this fraction of its throughput
SWEEP_MODES = ("isthmus_opbyop", "isthmus_chained")
CHAIN16_MODES = ("isthmus_chain16_parallel", "isthmus_chain16_sequential")
JSON_KEYS = ("computations_per_s", "programs_per_s", "smallest_matching_ms", "ratios", "ratios_of_medians",
             "ratio_definition", "smallest_matching_definition", "size_sweep", "samples_per_s", "machine",
             "versions", "config")

Samples = dict[str, list[float]]  # mode -> computations per second of each timed round

RATIOS: dict[str, tuple[str, str]] = {
    "chained_vs_jax_opbyop": ("isthmus_chained", "jax_opbyop"),
    "chained_vs_ray_chained": ("isthmus_chained", "ray_chained"),
    "parallel_vs_sequential_dispatch": ("isthmus_chain16_parallel", "isthmus_chain16_sequential"),
    "opbyop_vs_jax_opbyop": ("isthmus_opbyop", "jax_opbyop"),
    "opbyop_vs_ray_opbyop": ("isthmus_opbyop", "ray_opbyop"),
    "opbyop_vs_ray_chained": ("isthmus_opbyop", "ray_chained"),
    "chained_vs_opbyop": ("isthmus_chained", "isthmus_opbyop"),
    "fused_vs_jax_fused": ("isthmus_fused", "jax_fused"),
    "chained_fused_vs_fused": ("isthmus_chained_fused", "isthmus_fused"),
    "ray_chained_vs_jax_opbyop": ("ray_chained", "jax_opbyop"),
    "chained_fused_vs_jax_opbyop": ("isthmus_chained_fused", "jax_opbyop"),
    "chained_fused_vs_ray_chained": ("isthmus_chained_fused", "ray_chained"),
    "chained_pipelined_vs_jax_opbyop": ("isthmus_chained_pipelined", "jax_opbyop"),
    "chained_pipelined_vs_ray_chained": ("isthmus_chained_pipelined", "ray_chained"),
    "chained_fused_pipelined_vs_jax_opbyop": ("isthmus_chained_fused_pipelined", "jax_opbyop"),
    "chained_fused_pipelined_vs_ray_chained": ("isthmus_chained_fused_pipelined", "ray_chained"),
}
RATIO_DEFINITION = (
    "ratio 'A_vs_B' = computations/s of A over B: the median of the per-round ratios where A and "
    "B took turns round by round, else the ratio of their medians (ratios_of_medians: always the "
    "latter); 1.0 is parity, larger means A is faster"
)


# -- timing --------------------------------------------------------------------------------


def timed_round(name: str, run: Round, expected: np.ndarray, computations: int, i: int) -> float:
    """Computations per second of round i of a mode; its value must be `expected`."""
    gc.collect()
    start = time.perf_counter()
    fetch = run()
    elapsed = time.perf_counter() - start
    got = fetch()
    if got.shape != expected.shape or not np.allclose(got, expected):
        raise BenchError(f"mode {name}: round {i} ended at {np.ravel(got)[:8]}, expected "
                         f"{np.ravel(expected)[:8]} (the same steps by jax.jit in this process)")
    return computations / elapsed


def measure_in_turn(modes: dict[str, Round], expected: np.ndarray, computations: int, rounds: int,
                    warmup: int, label: str = "") -> Samples:
    """Computations per second of each mode's timed rounds, the modes taking turns within
    each round, so that load drifting on a shared machine weighs on each of them alike;
    every round's value must be `expected`. `label` prefixes their printed names."""
    samples: Samples = {name: [] for name in modes}
    for i in range(warmup + rounds):
        for name, run in modes.items():
            rate = timed_round(f"{label}{name}", run, expected, computations, i)
            if i >= warmup:
                samples[name].append(rate)
    for name, rates in samples.items():
        print(f"  {label + name:<34} {statistics.median(rates):12.1f} computations/s", file=sys.stderr)
    return samples


def measure_all(modes: dict[str, Round], expected: np.ndarray, computations: int, rounds: int,
                warmup: int) -> Samples:
    """Each mode's rounds one after another, mode by mode."""
    return {m: measure_in_turn({m: run}, expected, computations, rounds, warmup)[m]
            for m, run in modes.items()}


@contextmanager
def isthmus_client(target: Target, server: str | None = None) -> Iterator[isthmus.Client]:
    """A client of the server at `server` (its admin token in ISTHMUS_TOKEN), or of a local
    server (its own Ray) serving the target's cluster, started for it and stopped after."""
    if server is not None:
        with isthmus.connect(server, token=os.environ.get("ISTHMUS_TOKEN"), name="bench.dispatch") as c:
            yield c
        return
    # The server runs as a user would start it: XLA's pool as its executors set it, not NPROC.
    with own_server(cluster=target.cluster(), drop=("NPROC",)) as (address, token), \
            isthmus.connect(address, token=token, name="bench.dispatch") as c:
        yield c


def run_sweep(c: isthmus.Client, s: isthmus.Slice, cfg: Config, target: Target) -> dict[int, Samples]:
    """Per n, JAX op by op here (the server idle) and the Isthmus modes, taking turns round
    by round, so that load drift on a shared machine does not bias their ratio."""
    sweep: dict[int, Samples] = {}
    for m in (matmul(n, target.devices) for n in cfg.sizes):
        want = oracle(m, cfg.steps)
        modes = jax_modes(m, cfg.steps) | isthmus_modes(c, s, m, cfg.steps)
        sweep[m.x0.shape[0]] = measure_in_turn(
            {name: modes[name] for name in ("jax_opbyop", *SWEEP_MODES)}, want, cfg.steps,
            cfg.sweep_rounds, 1, label=f"{m.name} ")
    return sweep


def run_all(cfg: Config, target: Target, server: str | None = None
            ) -> tuple[Samples, list[frozenset[str]], dict[int, Samples]]:
    """Every mode's samples (chain16's only where the target has four hosts), the groups of
    modes that took turns round by round, and the size sweep's per n."""
    w, n = trivial(target.devices), cfg.steps
    expected = oracle(w, n)
    print(f"Isthmus ({server or 'starting the server'})", file=sys.stderr)
    with isthmus_client(target, server) as c:
        if not callable(getattr(c, "program", None)):
            raise BenchError("this client has no Client.program (client/program.py): the chained "
                             "and chain16 modes need it")
        hosts = host_slices(c)  # first, while every host is free
        s = c.slice({AXIS: target.devices})
        modes = isthmus_modes(c, s, w, n, cfg.inflight)
        piped = {k: modes.pop(k) for k in list(modes) if k.endswith("_pipelined")}
        with local_ray():
            print("  jax.jit in this process and a plain Ray actor, taking turns with them", file=sys.stderr)
            samples = measure_in_turn(jax_modes(w, n) | ray_modes(w, n, target) | modes, expected, n,
                                      cfg.rounds, cfg.warmup)
        in_turn = [frozenset(samples)]
        samples |= measure_all(piped, expected, n * cfg.inflight, cfg.rounds, cfg.warmup)
        if hosts is not None:  # the two dispatches in turn, so that their ratio is paired
            chain16 = measure_in_turn(chain16_modes(c, hosts, cfg), oracle(chain16_workload(), cfg.stages),
                                      cfg.stages * cfg.programs, cfg.rounds, cfg.warmup)
            samples |= chain16
            in_turn.append(frozenset(chain16))
        else:
            print(f"  {', '.join(CHAIN16_MODES)}: absent (fewer than four hosts of {DEVICES} devices)",
                  file=sys.stderr)
        print("size sweep", file=sys.stderr)
        sweep = run_sweep(c, s, cfg, target)
    return samples, in_turn, sweep


# -- the report ----------------------------------------------------------------------------


def sweep_report(sweep: dict[int, Samples]) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    """Per size: rates, and rates relative to JAX op by op (the modes took turns: paired round
    by round); per Isthmus mode, the smallest matching ms."""
    rows: list[dict[str, Any]] = []
    for n, samples in sweep.items():
        rates = {m: statistics.median(v) for m, v in samples.items()}
        base = rates.pop("jax_opbyop")
        rows.append({"n": n, "jax_ms_per_computation": 1e3 / base,
                     "computations_per_s": {"jax_opbyop": base, **rates},
                     "relative_to_jax": {m: ratio(samples[m], samples["jax_opbyop"], in_turn=True)
                                         for m in rates}})
    smallest: dict[str, float | None] = {}
    for mode in SWEEP_MODES:
        matching = [r["jax_ms_per_computation"] for r in rows if r["relative_to_jax"][mode] >= MATCH]
        smallest[mode] = min(matching, default=None)
    return rows, smallest


def git_revision() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True,
                              cwd=Path(__file__).parent, check=False).stdout.strip()

    return (git("rev-parse", "HEAD") or "unknown") + ("+dirty" if git("status", "--porcelain") else "")


def describe_machine(target: Target) -> dict[str, Any]:
    m = machine()
    if target.platform == "gpu":
        m |= {"devices": f"{target.devices} GPU(s), jax platform gpu", "gpus": list(target.gpu_names)}
    return m


def report(samples: Samples, in_turn: list[frozenset[str]], sweep: dict[int, Samples], cfg: Config,
           target: Target) -> dict[str, Any]:
    rates = {m: statistics.median(v) for m, v in samples.items()}
    rows, smallest = sweep_report(sweep)
    m = describe_machine(target)
    return {
        "computations_per_s": rates,
        "programs_per_s": {k: v / cfg.stages for k, v in rates.items() if "chain16" in k},
        "smallest_matching_ms": smallest,
        "ratios": {name: ratio(samples[a], samples[b], in_turn=any(a in g and b in g for g in in_turn))
                   if a in rates and b in rates else None for name, (a, b) in RATIOS.items()},
        "ratios_of_medians": {name: rates[a] / rates[b] if a in rates and b in rates else None
                              for name, (a, b) in RATIOS.items()},
        "ratio_definition": RATIO_DEFINITION,
        "smallest_matching_definition": (
            f"the smallest JAX op-by-op ms per computation in the size sweep at which the mode "
            f"reaches >= {MATCH:.0%} of JAX op-by-op computations/s (the median of the per-round "
            f"ratios, as they took turns); null if it never does"),
        "size_sweep": rows,
        "samples_per_s": samples,
        "machine": m,
        "versions": {"python": m["python"], "jax": m["jax"], "jaxlib": m["jaxlib"],
                     "ray": m["ray"], "numpy": np.__version__, "isthmus": git_revision()},
        "config": dataclasses.asdict(cfg) | {
            "platform": target.platform, "devices_per_slice": target.devices, "match_threshold": MATCH,
            "absent_modes": [m for m in CHAIN16_MODES if m not in samples],
            "env": {k: os.environ.get(k) for k in ("NPROC", "XLA_FLAGS", "JAX_PLATFORMS",
                                                    "XLA_PYTHON_CLIENT_PREALLOCATE")},
        },
    }


def table(result: dict[str, Any]) -> str:
    rows = [f"{'mode (median of rounds)':<34} {'computations/s':>14}"]
    rows += [f"{m:<34} {v:14.1f}" for m, v in result["computations_per_s"].items()]
    rows += ["", f"{'sweep: n':<10} {'jax ms':>9}  throughput relative to jax_opbyop"]
    for r in result["size_sweep"]:
        rel = "  ".join(f"{m} {v:.2f}" for m, v in r["relative_to_jax"].items())
        rows.append(f"{r['n']:<10} {r['jax_ms_per_computation']:9.3f}  {rel}")
    rows += ["smallest matching JAX ms per computation:"]
    rows += [f"  {m:<32} {v}" for m, v in result["smallest_matching_ms"].items()]
    rows += ["", "ratio (A computations/s / B computations/s)"]
    rows += [f"  {name:<40} {'absent' if v is None else f'{v:10.4f}':>10}"
             for name, v in result["ratios"].items()]
    if absent := result["config"]["absent_modes"]:
        rows += ["", f"absent modes: {', '.join(absent)}"]
    return "\n".join(rows)


def configure_processes() -> None:
    """CPU devices everywhere, 4 in this process, and XLA's pool big enough for 4-device collectives.

    Set before any JAX backend exists; the Ray actor and the server inherit the environment.
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={DEVICES}".strip()
    if int(os.environ.get("NPROC") or 0) < THREADS:
        os.environ["NPROC"] = str(THREADS)
    os.environ["JAX_PLATFORMS"] = "cpu"
    jax.config.update("jax_platforms", "cpu")


def gpu_target() -> Target:
    """This machine's GPUs, as JAX here sees them. Memory grows on demand in every process
    (set before any JAX backend exists; the Ray actor and the server inherit it)."""
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        gpus = jax.devices("gpu")
    except RuntimeError as e:
        raise BenchError(f"--platform gpu: expected JAX to find GPUs in this process "
                         f"(JAX_PLATFORMS={os.environ.get('JAX_PLATFORMS')!r}), found none: {e}") from None
    return Target("gpu", len(gpus), nvidia_gpus())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.dispatch", description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--smoke", action="store_true", help="every mode once at a tiny size: seconds, for CI")
    p.add_argument("--plot", type=Path, default=None, help="draw the results into this PNG")
    p.add_argument("--platform", choices=("cpu", "gpu"), default="cpu",
                   help="run every mode on 4 simulated CPU devices (default) or on this machine's GPUs")
    p.add_argument("--gpu", dest="platform", action="store_const", const="gpu", help="--platform gpu")
    p.add_argument("--server", help="a running server's address (admin token in ISTHMUS_TOKEN), "
                                    "serving 2 islands x 2 hosts x 4 CPU devices, instead of a local one")
    args = p.parse_args(argv)
    if args.plot is not None:
        try:  # before the run, not after it
            from bench.plot import plot_dispatch
        except ImportError as e:
            p.error(f"--plot needs matplotlib (pip install -e '.[bench]'): {e}")
    cfg = SMOKE if args.smoke else Config()
    if args.platform == "gpu":
        target = gpu_target()
        cfg = dataclasses.replace(cfg, sizes=GPU_SMOKE_SIZES if args.smoke else GPU_SIZES)
    else:
        configure_processes()
        target = Target("cpu", DEVICES)
    result = report(*run_all(cfg, target, args.server), cfg, target)
    m = result["machine"]
    names = sorted({n.split(": ", 1)[-1] for n in target.gpu_names})  # "GPU 0: NVIDIA H100 ..."
    on = f"; {target.devices} x {', '.join(names)}" if names else ""
    print(f"dispatch, {cfg.steps} computations x {cfg.rounds} rounds (median); {m['cpus_usable']} CPUs, "
          f"python {m['python']}, jax {m['jax']}, ray {m['ray']}{on}")
    print(table(result))
    write_json(args.json, result, JSON_KEYS)
    if args.plot is not None:
        plot_dispatch(result, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
