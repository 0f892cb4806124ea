"""The worker process of `bench.overlap` (and of tests/integration/test_overlap_stress.py):
one JAX client on 4 simulated CPU devices under one setting, its pool size from the
environment it was started with. It compiles the executors' own 4-device all-reduce as a host
does, computes run to completion's results, then does its runs and prints one JSON line for
each (`python -m bench.overlap_worker CONFIG_JSON`). What it measures and why: `bench.overlap`.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

DEVICES = 4


def _artifact(elements: int) -> bytes:
    """f, exported against the abstract mesh {"x": 4}, as `client.jit` exports a function."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import AbstractMesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh = AbstractMesh((DEVICES,), ("x",))
    sharding = NamedSharding(mesh, P("x"))

    def body(a: Any) -> Any:
        return a / 2 + jax.lax.psum(a, "x") / 8 + 1

    def flat(v: Any) -> tuple[Any, ...]:
        return (jax.shard_map(body, mesh=mesh, in_specs=P("x"), out_specs=P("x"))(v),)

    jitted = jax.jit(flat, in_shardings=(sharding,), out_shardings=(sharding,))
    aval = jax.ShapeDtypeStruct((DEVICES * elements,), jnp.float32)
    return bytes(jax.export.export(jitted, platforms=["cpu"])(aval).serialize())


def _compiled(elements: int) -> Any:
    """The artifact compiled as a host compiles it (`executors.compile.compile_artifact`)."""
    from executors.compile import compile_artifact, make_mesh
    from ir import DeviceMesh, Spec

    mesh = make_mesh(DeviceMesh(tuple(range(DEVICES)), (("x", DEVICES),)))
    return compile_artifact(_artifact(elements), mesh, [Spec(("x",))], [Spec(("x",))])


def issue(call: Callable[[Any], Any], inputs: Callable[[int, Any], Any], calls: int, bound: int) -> list[Any]:
    """`calls` calls back to back under the in-flight bound; every output, all of them ready.

    `inputs(i, previous)` gives call i's input (`previous`: call i-1's output, or None).
    `bound` 1 blocks on each call right after issuing it (run to completion); B > 1 blocks on
    the oldest pending call before issuing while B are pending; 0 never blocks before the end.
    """
    outs: list[Any] = []
    pending: deque[Any] = deque()
    previous = None
    for i in range(calls):
        if bound > 1:
            while len(pending) >= bound:
                pending.popleft().block_until_ready()
        previous = call(inputs(i, previous))
        outs.append(previous)
        if bound == 1:
            previous.block_until_ready()
        elif bound > 1:
            pending.append(previous)
    for out in outs:
        out.block_until_ready()
    return outs


def _emit(**record: Any) -> None:
    print(json.dumps(record), flush=True)


def worker(cfg: dict[str, Any]) -> None:
    """Compile, compute run to completion's results, then do `runs` runs, one line each."""
    import jax
    import numpy as np

    jax.config.update("jax_platforms", "cpu")
    if cfg.get("failure"):
        _failure_worker(cfg)
        return
    exe = _compiled(cfg["elements"])
    sharding = exe.input_shardings[0][0]
    n, calls, bound = DEVICES * cfg["elements"], cfg["calls"], cfg["in_flight"]
    start = jax.device_put(np.zeros(n, np.float32), sharding)
    independent = [jax.device_put(np.full(n, k, np.float32), sharding) for k in range(calls)]
    jax.block_until_ready(independent)

    def call(x: Any) -> Any:
        return exe(x)[0]

    def chained(i: int, previous: Any) -> Any:
        return start if previous is None else previous

    def separate(i: int, previous: Any) -> Any:
        return independent[i]

    def as_bytes(outs: Sequence[Any]) -> list[bytes]:
        return [np.asarray(o).tobytes() for o in outs]

    want_chain = as_bytes(issue(call, chained, calls, 1)[-1:])
    want_independent = as_bytes(issue(call, separate, calls, 1))
    _emit(ready=True, pool_threads=len(os.listdir("/proc/self/task")))

    def timed(pattern: Callable[[int, Any], Any], b: int) -> tuple[list[Any], float]:
        t = time.perf_counter()
        outs = issue(call, pattern, calls, b)
        return outs, time.perf_counter() - t

    for run in range(cfg["runs"]):
        # The setting's calls and run to completion's in this same process (its pool, this
        # moment), in alternating order: their ratio is free of the drift between processes.
        if run % 2:
            _, rtc_chained_s = timed(chained, 1)
            _, rtc_independent_s = timed(separate, 1)
        chain, chained_s = timed(chained, bound)
        outs, independent_s = timed(separate, bound)
        equal = as_bytes(chain[-1:]) == want_chain and as_bytes(outs) == want_independent
        if not run % 2:
            _, rtc_chained_s = timed(chained, 1)
            _, rtc_independent_s = timed(separate, 1)
        _emit(run=run, chained_s=chained_s, independent_s=independent_s, rtc_chained_s=rtc_chained_s,
              rtc_independent_s=rtc_independent_s, equal=equal)


def _failure_worker(cfg: dict[str, Any]) -> None:
    """A chain of `calls` calls whose call `fail_at` fails on every device, then `calls`
    independent calls, all under the bound; report which calls failed and whether the others
    equal a run without the failure."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P

    exe = _compiled(cfg["elements"])
    sharding = exe.input_shardings[0][0]
    n, calls, bound, fail_at = DEVICES * cfg["elements"], cfg["calls"], cfg["in_flight"], cfg["fail_at"]

    def raise_(x: Any) -> Any:
        raise ValueError("injected failure")

    def body(a: Any) -> Any:
        a = jax.pure_callback(raise_, jax.ShapeDtypeStruct(a.shape, a.dtype), a)
        return a / 2 + jax.lax.psum(a, "x") / 8 + 1

    def flat(v: Any) -> tuple[Any, ...]:
        return (jax.shard_map(body, mesh=sharding.mesh, in_specs=P("x"), out_specs=P("x"))(v),)

    aval = jax.ShapeDtypeStruct((n,), jnp.float32, sharding=sharding)
    failing = jax.jit(flat, in_shardings=(sharding,), out_shardings=(sharding,)).lower(aval).compile()
    start = jax.device_put(np.zeros(n, np.float32), sharding)
    others = [jax.device_put(np.full(n, k, np.float32), sharding) for k in range(calls)]

    def wait(x: Any) -> None:
        with contextlib.suppress(Exception):  # a failed call raises here; read below
            x.block_until_ready()

    def run(with_failure: bool) -> list[bytes | None]:
        outs: list[Any] = []
        pending: deque[Any] = deque()
        y = start
        for i in range(2 * calls):
            while bound > 1 and len(pending) >= bound:
                wait(pending.popleft())
            if i < calls:
                y = (failing if with_failure and i == fail_at else exe)(y)[0]
                out = y
            else:
                out = exe(others[i - calls])[0]
            outs.append(out)
            if bound == 1:
                wait(out)
            elif bound > 1:
                pending.append(out)
        values: list[bytes | None] = []
        for out in outs:
            try:
                values.append(np.asarray(out).tobytes())
            except Exception:
                values.append(None)
        return values

    want = run(with_failure=False)
    _emit(ready=True, pool_threads=len(os.listdir("/proc/self/task")))
    got = run(with_failure=True)
    failed = [i for i, v in enumerate(got) if v is None]
    good_equal = all(g == w for g, w in zip(got, want, strict=True) if g is not None)
    _emit(run=0, failed=failed, expected_failed=list(range(fail_at, calls)), good_equal=good_equal)


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
