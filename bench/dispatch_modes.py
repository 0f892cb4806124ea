"""The computations `bench.dispatch` times, and the ways it runs them: JAX in this process,
a plain Ray actor, and the Isthmus modes (see `bench/dispatch.py` for what each mode is).
Every mode is a `Round`: it runs one round and returns a fetch of the round's value. A
`Target` says which devices they all run on: 4 simulated CPU devices per process (the
default), or the GPUs of this machine."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import jax
import numpy as np
import ray
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import client as isthmus
from bench.call_latency import BenchError

AXIS = "x"
DEVICES = 4
THREADS = 2 * DEVICES  # XLA CPU pool threads that back-to-back 4-device collectives need

Fn = Callable[..., jax.Array]
Round = Callable[[], Callable[[], np.ndarray]]  # runs one round; returns a fetch of its value


@dataclass(frozen=True)
class Config:
    steps: int = 128  # computations per round
    rounds: int = 5  # timed rounds per mode
    warmup: int = 2  # untimed rounds first
    stages: int = 16  # chain16: stages per program, round-robin over 4 hosts
    programs: int = 10  # chain16: programs per round, each waited for
    inflight: int = 8  # *_pipelined: programs submitted back to back per round, then waited for
    # sweep: n of float32[n, n]. 448 and 576 (about 0.6 and 1.1 ms on a 2-core CPU machine)
    # stand between 384 and 768 (0.45 and 2.4 ms), so that the smallest size a mode matches
    # JAX from is known closely near the 1 ms that `smallest_matching_ms` is judged by; 256
    # and 320 do so on a 2-core machine a third as fast (there 384 took 1.3 ms, 192 0.23).
    sizes: tuple[int, ...] = (64, 192, 256, 320, 384, 448, 576, 768, 1152, 1664)
    sweep_rounds: int = 5  # per n, the three modes taking turns in each


# `--smoke`: every mode and the sweep's code once, in seconds (CI); the figures mean nothing.
SMOKE = Config(steps=8, rounds=1, warmup=1, programs=1, inflight=2, sizes=(32,), sweep_rounds=1)
# On a GPU the CPU sizes all take microseconds; these reach milliseconds per computation.
# (Not 12288: the benchmark's own JAX keeps what its op-by-op chain allocated, and the
# executor sharing the GPU then runs out of memory for 576 MiB matrices.)
GPU_SIZES = (256, 1024, 2048, 4096, 6144, 8192)
GPU_SMOKE_SIZES = (256,)


@dataclass(frozen=True)
class Target:
    """Where every mode runs: `devices` devices of `platform` per process. On "cpu" they are
    simulated (XLA's host platform device count); on "gpu" they are this machine's GPUs,
    and the Isthmus server serves them as one host (`cluster()`)."""

    platform: Literal["cpu", "gpu"] = "cpu"
    devices: int = DEVICES
    gpu_names: tuple[str, ...] = ()  # `nvidia-smi -L` lines, on "gpu"

    def __post_init__(self) -> None:
        if self.platform not in ("cpu", "gpu"):
            raise BenchError(f"Target.platform: expected 'cpu' or 'gpu', got {self.platform!r}")
        if self.devices < 1:
            raise BenchError(f"Target.devices: expected at least 1, got {self.devices}")

    def cluster(self) -> dict[str, Any] | None:
        """The server's `--cluster` file: None for its default CPU cluster, else one GPU host."""
        if self.platform == "cpu":
            return None
        return {"islands": [{"name": "g", "hosts": [
            {"name": "g0", "devices": self.devices, "platform": "gpu"}]}]}

    def ray_actor_options(self) -> dict[str, Any]:
        """The plain Ray actor's options: the same devices as this process's JAX has."""
        if self.platform == "cpu":
            env = {"JAX_PLATFORMS": "cpu",
                   "XLA_FLAGS": f"--xla_force_host_platform_device_count={self.devices}"}
            return {"num_cpus": 0, "runtime_env": {"env_vars": env}}
        return {"num_cpus": 0, "num_gpus": self.devices}


# -- the computations -----------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """`make(mesh)` is f(v, *consts) for that mesh; v is sharded P("x") over `devices`
    devices, consts replicated."""

    name: str
    make: Callable[[Mesh | AbstractMesh], Fn]
    x0: np.ndarray
    consts: tuple[np.ndarray, ...] = ()
    devices: int = DEVICES

    @property
    def in_specs(self) -> tuple[P, ...]:
        return (P(AXIS), *(P() for _ in self.consts))


def psum_add(mesh: Mesh | AbstractMesh) -> Fn:
    share = 0.5 / mesh.shape[AXIS]  # so the mean grows by exactly 1 per step on any mesh

    def body(b: jax.Array) -> jax.Array:
        return b * 0.5 + jax.lax.psum(b, AXIS) * share + 1.0

    return jax.shard_map(body, mesh=mesh, in_specs=P(AXIS), out_specs=P(AXIS))


def matmul_add(mesh: Mesh | AbstractMesh) -> Fn:
    del mesh  # the shardings of the arguments and result lay it out
    return lambda v, w: v @ w + 1.0


def add_one(v: jax.Array) -> jax.Array:
    return v + 1.0


def trivial(devices: int = DEVICES) -> Workload:
    return Workload("psum_add", psum_add, np.arange(devices, dtype=np.float32), devices=devices)


def matmul(n: int, devices: int = DEVICES) -> Workload:
    rng = np.random.default_rng(n)
    x0 = rng.integers(0, 100, (n, n)).astype(np.float32)
    w = np.eye(n, dtype=np.float32)[rng.permutation(n)]
    return Workload(f"matmul_{n}", matmul_add, x0, (w,), devices=devices)


def fused(f: Fn, steps: int) -> Fn:
    def loop(v: jax.Array, *consts: jax.Array) -> jax.Array:
        return jax.lax.fori_loop(0, steps, lambda _, v: f(v, *consts), v)

    return loop


def local_mesh(n: int = DEVICES) -> Mesh:
    devices = jax.devices()
    if len(devices) < n:
        raise BenchError(f"expected at least {n} devices in this process, found {devices}")
    return Mesh(np.array(devices[:n]), (AXIS,))  # axis types Auto, as the slice's AbstractMesh


def jitted(w: Workload, mesh: Mesh, fn: Fn | None = None) -> Fn:
    shardings = tuple(NamedSharding(mesh, s) for s in w.in_specs)
    return jax.jit(fn or w.make(mesh), in_shardings=shardings,
                   out_shardings=NamedSharding(mesh, P(AXIS)))


def oracle(w: Workload, steps: int) -> np.ndarray:
    """The value every mode must end a round at: `jax.jit(f)` here, one blocking step at a time."""
    f = jitted(w, local_mesh(w.devices))
    v: Any = w.x0
    for _ in range(steps):
        v = f(v, *w.consts).block_until_ready()
    return np.asarray(v)


# -- modes: each is a function running one round -----------------------------------------------


def jax_modes(w: Workload, steps: int) -> dict[str, Round]:
    mesh = local_mesh(w.devices)
    f, loop = jitted(w, mesh), jitted(w, mesh, fused(w.make(mesh), steps))
    x = jax.device_put(w.x0, NamedSharding(mesh, P(AXIS)))
    consts = tuple(jax.device_put(k, NamedSharding(mesh, P())) for k in w.consts)

    def opbyop() -> Callable[[], np.ndarray]:
        y = x
        for _ in range(steps):
            y = f(y, *consts)
        y.block_until_ready()
        return lambda: np.asarray(y)

    def fused_round() -> Callable[[], np.ndarray]:
        y = loop(x, *consts).block_until_ready()
        return lambda: np.asarray(y)

    return {"jax_opbyop": opbyop, "jax_fused": fused_round}


class RayStep:
    """f in a plain Ray actor's process: numpy in, numpy out, which is how Ray passes values."""

    def __init__(self, w: Workload) -> None:
        self._consts = w.consts
        self._f = jitted(w, local_mesh(w.devices))

    def step(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self._f(x, *self._consts))


def ray_modes(w: Workload, steps: int, target: Target) -> dict[str, Round]:
    actor: Any = ray.remote(RayStep).options(**target.ray_actor_options()).remote(w)

    def opbyop() -> Callable[[], np.ndarray]:
        y: np.ndarray = w.x0
        for _ in range(steps):
            y = ray.get(actor.step.remote(y))
        return lambda: y

    def chained() -> Callable[[], np.ndarray]:
        ref = ray.put(w.x0)
        for _ in range(steps):
            ref = actor.step.remote(ref)
        y = ray.get(ref)
        return lambda: y

    return {"ray_opbyop": opbyop, "ray_chained": chained}


def buffer_round(run: Callable[[], isthmus.Buffer]) -> Round:
    def round_() -> Callable[[], np.ndarray]:
        return run().result().numpy

    return round_


def pipelined(run: Callable[[], isthmus.Buffer], inflight: int) -> Round:
    """`inflight` submissions back to back, then one wait each: the client does not wait
    between programs, as JAX op by op does not wait between calls."""
    def round_() -> Callable[[], np.ndarray]:
        outs = [run() for _ in range(inflight)]
        for o in outs:
            o.result()
        return outs[-1].numpy

    return round_


def isthmus_modes(c: isthmus.Client, s: isthmus.Slice, w: Workload, steps: int,
                  inflight: int = 0) -> dict[str, Round]:
    """Op by op, one program of all the calls (fused or not), one looping call; each registers
    on first use. With `inflight`, also the programs pipelined (`*_pipelined`, whose rounds
    run `inflight` programs)."""
    mesh = s.abstract_mesh
    f = c.jit(w.make(mesh), slice=s, in_specs=w.in_specs, out_specs=P(AXIS), name=w.name)
    loop = c.jit(fused(w.make(mesh), steps), slice=s, in_specs=w.in_specs, out_specs=P(AXIS),
                 name=f"{w.name}_x{steps}")
    x = c.put(w.x0, s, P(AXIS))
    consts = tuple(c.put(k, s, P()) for k in w.consts)

    def chain(v: Any, *ks: Any) -> Any:  # called directly: op by op; traced: one program
        for _ in range(steps):
            v = f(v, *ks)
        return v

    program = c.program(chain, fuse=False)  # one executable per call: dispatch, not fusion
    merged = c.program(chain, fuse=True)  # the server's fuse pass makes the calls one executable
    modes = {
        "isthmus_opbyop": buffer_round(lambda: chain(x, *consts)),
        "isthmus_chained": buffer_round(lambda: program(x, *consts)),
        "isthmus_chained_fused": buffer_round(lambda: merged(x, *consts)),
        "isthmus_fused": buffer_round(lambda: loop(x, *consts)),
    }
    if inflight:
        modes["isthmus_chained_pipelined"] = pipelined(lambda: program(x, *consts), inflight)
        modes["isthmus_chained_fused_pipelined"] = pipelined(lambda: merged(x, *consts), inflight)
    return modes


def host_slices(c: isthmus.Client) -> list[isthmus.Slice] | None:
    """Four {"x": 4} slices, each filling one host: the resource manager must use four hosts.
    None where the server has fewer than four hosts of 4 devices (one GPU host; a smaller
    cluster): chain16 is then absent."""
    per_host = Counter(d["host"] for d in c.devices().devices)
    if sum(n >= DEVICES for n in per_host.values()) < 4:
        return None
    slices = [c.slice({AXIS: DEVICES}) for _ in range(4)]
    hosts = [tuple(s.hosts) for s in slices]
    if any(len(h) != 1 for h in hosts) or len(set(hosts)) != len(slices):
        raise BenchError(f"chain16: expected 4 slices on 4 different hosts, got hosts {hosts}")
    return slices


def chain16_modes(c: isthmus.Client, slices: Sequence[isthmus.Slice], cfg: Config) -> dict[str, Round]:
    """Stage i on slice i mod 4; a round runs `cfg.programs` programs, each waited for."""
    fs = [c.jit(add_one, slice=s, in_specs=P(AXIS), out_specs=P(AXIS), name=f"add_one_{i}")
          for i, s in enumerate(slices)]
    x = c.put(chain16_workload().x0, slices[0], P(AXIS))

    def chain(v: Any) -> Any:
        for i in range(cfg.stages):
            v = fs[i % len(fs)](v)
        return v

    def mode(dispatch: str) -> Round:
        program = c.program(chain, dispatch=dispatch, fuse=False)

        def round_() -> Callable[[], np.ndarray]:
            for _ in range(cfg.programs):
                y = program(x).result()
            return y.numpy

        return round_

    return {f"isthmus_chain16_{d}": mode(d) for d in ("parallel", "sequential")}


def chain16_workload() -> Workload:
    return Workload("add_one", lambda _: add_one, np.arange(DEVICES, dtype=np.float32))


