"""Training through an in-graph loop: one step of a recurrent model whose forward pass is
`isthmus.fori_loop` over a sequence, differentiated on the hosts (`isthmus.value_and_grad`),
against the same loop unrolled in Python and against the training loop driven by the client.

    python -m bench.loop_grad --json /tmp/loop_grad.json
    python -m bench.loop_grad --smoke --json /tmp/loop_grad.json   # seconds: every mode, tiny

The model: a cell `h = tanh(h @ W + b)` on island a, run `length` times, and a squared-error
head `h @ V` on island b; a step is its loss and gradient and an SGD update of every
parameter on its own slice, all in one program. Modes, measured in one run on one machine
(median of rounds, each mode in turn):

- `ingraph`: the loop in the graph (`fori_loop(0, length, ...)`, the length a program
  argument): one trace and one compile whatever the length; its backward runs the trip
  count backwards on the hosts, popping what each forward iteration saved there.
- `unrolled`: the same cell called `length` times in Python inside `@c.program`: a
  straight-line program, traced and compiled once per length.
- `client_loop`: the recurrence driven by the client, as a user without in-graph loops
  would: a call of the cell per time step forward (each output kept as a buffer), the
  head's loss and gradient, then a call of the cell's VJP (`jax.vjp` inside a jitted
  function) per time step backward, adding up W's and b's gradients, and the updates.
- `client_steps` and `ingraph_steps`: `steps` training steps, driven by the client (the
  `ingraph` step program run once a step, its loss read each time, as a training loop that
  logs it does) or in one program (`fori_loop` over the steps around the step).
- `jax_scan`: the same step with `jax.lax.scan` under `jax.jit` in this process (the limit:
  no hosts, no network).

Swapping, on a server of its own whose hosts keep `stack_mb` of loop stacks on their devices
and `swap_mb` more in host memory (`SWAP`; for the smoke `SWAP_SMOKE`, whose iterations save
more), or on a running server with small stack budgets of its own (`--swap-server URL`, its
settings ISTHMUS_EXECUTOR_STACK_MB and ISTHMUS_EXECUTOR_STACK_SWAP_MB): `max_len` is the
longest sequence that trains with the loop's `swap=False`, with swapping, and with
`remat=True` and no swapping (doubling, then bisecting, each probe a run), and
`swap_step_s` the seconds per step at 0.9 of the swapping one's,
on that server (its stacks swapping) and on the measured server (none swapping).

`--hidden N --batch N` time the steps on a wider cell (the swap measurement keeps its own
size): at the default size each computation takes tens of microseconds, so a step is
mostly the executors' work per step, not XLA's.

`step_s` is seconds per training step per mode; `trace_s` the first call's seconds (trace,
compile and run) of `ingraph` and `unrolled` at each length measured. Ratios, larger is
better for Isthmus's in-graph loop:
- `dynamic_vs_unrolled`: unrolled over in-graph seconds per step (TensorFlow's goal: 1.0,
  dynamic as fast as static);
- `ingraph_vs_client_training_loop`: `client_loop` over `ingraph` seconds per step;
- `ingraph_steps_vs_client_steps`: client- over graph-driven seconds for `steps` steps;
- `jax_scan_vs_ingraph`: in-graph over JAX's seconds per step;
- `max_len_swap_vs_no_swap`: the longest length with swapping over without (goal ≥ 2);
- `max_len_remat_vs_no_swap`: the longest length of the loop with `remat=True` (saving only
  its carry an iteration; no swapping) over the plain loop's;
- `swap_overhead`: seconds per step swapping over not swapping (goal ≤ 1.2).

Every mode's parameters are checked against JAX's. `--server URL` measures a running server
(admin token in ISTHMUS_TOKEN; islands a and b). Output (`--json PATH`, the keys
`JSON_KEYS`): `step_s`, `trace_s`, `max_len`, `swap_step_s`, `ratios`, `config`, `machine`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import client as isthmus
from bench import servers
from bench.call_latency import isthmus_client
from bench.machine import describe
from bench.output import write_json

LR = 0.05
FULL = {"hidden": 64, "batch": 16, "lengths": (16, 64), "steps": 20, "rounds": 5}
SMOKE = {"hidden": 8, "batch": 2, "lengths": (2, 3), "steps": 2, "rounds": 1}
JSON_KEYS = ("step_s", "trace_s", "max_len", "swap_step_s", "ratios", "config", "machine")
# the swapping server's budgets and model (the smoke's saves 512 KiB an iteration, its state
# and an activation: short lengths, few probes)
SWAP = {"hidden": 64, "batch": 16, "stack_mb": 1, "swap_mb": 1, "longest": 4096}
SWAP_SMOKE = {"hidden": 256, "batch": 256, "stack_mb": 1, "swap_mb": 1, "longest": 16}


def cell(w: Any, h: Any) -> Any:
    return jnp.tanh(h @ w["W"] + w["b"])


def head(v: Any, h: Any, y: Any) -> Any:
    return jnp.mean((h @ v - y) ** 2)


def sgd(p: Any, g: Any) -> Any:
    return jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g)


def data(hidden: int, batch: int) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    params = {"a": {"W": (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32),
                    "b": np.zeros(hidden, np.float32)},
              "b": (rng.standard_normal((hidden, 4)) / np.sqrt(hidden)).astype(np.float32)}
    h0 = rng.standard_normal((batch, hidden)).astype(np.float32)
    return params, h0, rng.standard_normal((batch, 4)).astype(np.float32)


class Model:
    """The model's functions on islands a and b, and its step programs."""

    def __init__(self, c: isthmus.Client, swap: bool = True, remat: bool = False) -> None:
        self.swap, self.remat = swap, remat
        sa, sb = c.slice({"x": 1}, island="a"), c.slice({"y": 1}, island="b")
        self.cell, self.head = c.jit(cell, slice=sa, name="cell"), c.jit(head, slice=sb, name="head")
        self.sgd_a, self.sgd_b = c.jit(sgd, slice=sa, name="sgd_a"), c.jit(sgd, slice=sb, name="sgd_b")
        self.head_grad = c.jit(jax.value_and_grad(head, argnums=(0, 1)), slice=sb, name="head_grad")
        self.cell_vjp = c.jit(lambda w, h, ct: jax.vjp(cell, w, h)[1](ct), slice=sa, name="cell_vjp")
        self.add = c.jit(lambda a, b: jax.tree_util.tree_map(jnp.add, a, b), slice=sa, name="add")
        self.c = c
        self.ingraph = c.program(self._step)
        self.ingraph_steps = c.program(lambda p, h0, y, n, steps: isthmus.fori_loop(
            0, steps, lambda k, p: self._step(p, h0, y, n)[0], p))

    def _update(self, p: Any, g: Any) -> Any:
        return {"a": self.sgd_a(p["a"], g["a"]), "b": self.sgd_b(p["b"], g["b"])}

    def _step(self, p: Any, h0: Any, y: Any, n: Any) -> Any:
        def loss(p: Any) -> Any:
            h = isthmus.fori_loop(0, n, lambda i, h: self.cell(p["a"], h), h0, swap=self.swap,
                                  remat=self.remat)
            return self.head(p["b"], h, y)

        value, g = isthmus.value_and_grad(loss)(p)
        return self._update(p, g), value

    def client_loop(self, p: Any, h0: Any, y: Any, length: int) -> Any:
        """One step with the recurrence driven from here, call by call (asynchronous: the
        client waits only for the loss at the end)."""
        hs = [self.c.put(h0, self.cell.slice) if isinstance(h0, np.ndarray) else h0]
        for _ in range(length):
            hs.append(self.cell(p["a"], hs[-1]))
        value, (gv, gh) = self.head_grad(p["b"], hs[-1], y)
        gw = None
        for t in reversed(range(length)):
            dw, gh = self.cell_vjp(p["a"], hs[t], gh)
            gw = dw if gw is None else self.add(gw, dw)
        return self._update(p, {"a": gw, "b": gv}), value

    def unrolled(self, length: int) -> Callable[..., Any]:
        def step(p: Any, h0: Any, y: Any) -> Any:
            def loss(p: Any) -> Any:
                h = h0
                for _ in range(length):
                    h = self.cell(p["a"], h)
                return self.head(p["b"], h, y)

            value, g = isthmus.value_and_grad(loss)(p)
            return self._update(p, g), value

        return self.c.program(step)


def jax_step(length: int) -> Callable[..., Any]:
    def loss(p: Any, h0: Any, y: Any) -> Any:
        h, _ = jax.lax.scan(lambda h, _: (cell(p["a"], h), None), h0, None, length=length)
        return head(p["b"], h, y)

    def step(p: Any, h0: Any, y: Any) -> Any:
        value, g = jax.value_and_grad(loss)(p, h0, y)
        return sgd(p, g), value

    return jax.jit(step)


def fetched(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda b: np.asarray(b.numpy() if hasattr(b, "numpy") else b), tree)


def close(got: Any, want: Any, what: str) -> None:
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        if not np.allclose(a, b, rtol=1e-4, atol=1e-5):
            raise RuntimeError(f"{what}: parameters differ from JAX's (max |diff| {np.max(np.abs(a - b))})")


def timed(run: Callable[[], Any], rounds: int) -> list[float]:
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        run()
        samples.append(time.perf_counter() - start)
    return samples


def measure(c: isthmus.Client, hidden: int, batch: int, lengths: tuple[int, ...], steps: int,
            rounds: int) -> dict[str, Any]:
    model = Model(c)
    params, h0, y = data(hidden, batch)
    trace: dict[str, dict[str, float]] = {"ingraph": {}, "unrolled": {}}
    runs: dict[str, Callable[[], Any]] = {}
    unrolled: Callable[..., Any] = model.ingraph
    for length in lengths:
        n = np.int32(length)
        want, _ = jax_step(length)(params, h0, y)
        start = time.perf_counter()
        got, _ = model.ingraph(params, h0, y, n)
        close(fetched(got), want, f"ingraph, length {length}")
        trace["ingraph"][str(length)] = time.perf_counter() - start
        unrolled = model.unrolled(length)
        start = time.perf_counter()
        got, _ = unrolled(params, h0, y)
        close(fetched(got), want, f"unrolled, length {length}")
        trace["unrolled"][str(length)] = time.perf_counter() - start
    length = lengths[-1]  # the last length's programs, traced and compiled above, are timed
    n, local = np.int32(length), jax_step(length)
    runs["ingraph"] = lambda: model.ingraph(params, h0, y, n)[1].numpy()
    runs["unrolled"] = lambda: unrolled(params, h0, y)[1].numpy()
    runs["jax_scan"] = lambda: np.asarray(local(params, h0, y)[1])
    runs["client_loop"] = lambda: model.client_loop(params, h0, y, length)[1].numpy()
    close(fetched(model.client_loop(params, h0, y, length)[0]), local(params, h0, y)[0], "client_loop")

    def client_steps() -> Any:
        p = params
        for _ in range(steps):
            p, value = model.ingraph(p, h0, y, n)
            value.numpy()
        return p

    runs["client_steps"] = client_steps
    runs["ingraph_steps"] = lambda: fetched(model.ingraph_steps(params, h0, y, n, np.int32(steps)))
    want = params
    for _ in range(steps):
        want, _ = local(want, h0, y)
    close(fetched(client_steps()), want, "client_steps")
    close(runs["ingraph_steps"](), want, "ingraph_steps")
    samples: dict[str, list[float]] = {m: [] for m in runs}
    for _ in range(rounds):  # in turn: drift on a shared machine touches every mode alike
        for m, run in runs.items():
            samples[m] += timed(run, 1)
    per_step = {m: statistics.median(s) / (steps if m.endswith("_steps") else 1) for m, s in samples.items()}
    return {"step_s": per_step, "trace_s": trace}


def trains(model: Model, params: Any, h0: Any, y: Any, length: int) -> bool:
    """Whether a step of this length runs (False: its stacks do not fit the host's)."""
    try:
        model.ingraph(params, h0, y, np.int32(length))[1].numpy()
    except isthmus.RemoteError as e:
        if "does not fit the host's loop stacks" not in str(e):
            raise
        return False
    return True


def longest(fits: Callable[[int], bool], cap: int) -> int:
    """The largest length that fits (doubling from 1, then bisecting), at most `cap`."""
    if not fits(1):
        return 0
    good = 1
    while good < cap and fits(min(2 * good, cap)):
        good = min(2 * good, cap)
    bad = min(2 * good, cap + 1)
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good


def measure_swap(c: isthmus.Client, size: dict[str, int], rounds: int,
                 swap_server: str | None = None) -> dict[str, Any]:
    """The longest lengths without and with swapping, and a step's time swapping or not: on
    the server at `swap_server`, or on one of its own with `size`'s budgets."""
    params, h0, y = data(size["hidden"], size["batch"])
    env = {"ISTHMUS_EXECUTOR_STACK_MB": str(size["stack_mb"]),
           "ISTHMUS_EXECUTOR_STACK_SWAP_MB": str(size["swap_mb"])}
    with servers.server(swap_server, env) as (address, token), \
            isthmus.connect(address, token=token, name="bench-swap") as small:
        models = {"no_swap": Model(small, False), "swap": Model(small, True),
                  "remat": Model(small, False, remat=True)}
        max_len = {name: longest(lambda n, m=m: trains(m, params, h0, y, n), size["longest"])
                   for name, m in models.items()}
        length = max(1, int(0.9 * max_len["swap"]))
        plain, swapping = Model(c), models["swap"]
        want, _ = jax_step(length)(params, h0, y)
        for model in (plain, swapping):
            close(fetched(model.ingraph(params, h0, y, np.int32(length))[0]), want, f"swap, length {length}")
        samples: dict[str, list[float]] = {"swapping": [], "not_swapping": []}
        n = np.int32(length)
        for _ in range(rounds):
            samples["swapping"] += timed(lambda: swapping.ingraph(params, h0, y, n)[1].numpy(), 1)
            samples["not_swapping"] += timed(lambda: plain.ingraph(params, h0, y, n)[1].numpy(), 1)
    return {"max_len": max_len,
            "swap_step_s": {k: statistics.median(v) for k, v in samples.items()} | {"length": length}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.loop_grad", description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--smoke", action="store_true", help="every mode, tiny: seconds, for CI")
    p.add_argument("--server", help="a running server's address (admin token in ISTHMUS_TOKEN) "
                                    "instead of a local one")
    p.add_argument("--swap-server", help="a running server with small stack budgets for the swap "
                                         "measurement (admin token in ISTHMUS_TOKEN) instead of "
                                         "one of its own")
    p.add_argument("--hidden", type=int, help=f"the cell's width, for the steps (default {FULL['hidden']})")
    p.add_argument("--batch", type=int, help=f"the batch for the step timings (default {FULL['batch']})")
    args = p.parse_args(argv)
    size = {**(SMOKE if args.smoke else FULL)}
    size.update({k: getattr(args, k) for k in ("hidden", "batch") if getattr(args, k) is not None})
    with isthmus_client(args.server) as c:
        measured = measure(c, size["hidden"], size["batch"], size["lengths"], size["steps"], size["rounds"])
        swap = SWAP_SMOKE if args.smoke else SWAP
        measured |= measure_swap(c, swap, size["rounds"], args.swap_server)
        if args.swap_server is not None:  # the budgets are that server's, not these
            swap = {k: v for k, v in swap.items() if k not in ("stack_mb", "swap_mb")}
    s, m, w = measured["step_s"], measured["max_len"], measured["swap_step_s"]
    result = {
        **measured,
        "ratios": {"dynamic_vs_unrolled": s["unrolled"] / s["ingraph"],
                   "ingraph_vs_client_training_loop": s["client_loop"] / s["ingraph"],
                   "ingraph_steps_vs_client_steps": s["client_steps"] / s["ingraph_steps"],
                   "jax_scan_vs_ingraph": s["ingraph"] / s["jax_scan"],
                   "max_len_swap_vs_no_swap": m["swap"] / max(1, m["no_swap"]),
                   "max_len_remat_vs_no_swap": m["remat"] / max(1, m["no_swap"]),
                   "swap_overhead": w["swapping"] / w["not_swapping"]},
        "config": ({k: list(v) if isinstance(v, tuple) else v for k, v in size.items()}
                   | {"lr": LR, "swap": swap}),
        "machine": describe(),
    }
    print(json.dumps(result, indent=2))
    write_json(args.json, result, JSON_KEYS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
