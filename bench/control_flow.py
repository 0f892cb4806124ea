"""Iterations/s of a loop in the graph, against the same loop driven by the client (Yu et al. §6).

    python -m bench.control_flow --json /tmp/control_flow.json [--plot docs/control_flow.png]
    python -m bench.control_flow --smoke --json /tmp/control_flow.json   # seconds: every mode, tiny

The loop's body is two small computations on two islands, `f(v) = v * 0.5 + 1` on island a
and `g(v) = v - 0.25` on island b (float32[16], one device each), and its predicate `i < n`
is computed on island a. Modes, measured in one run on one machine (median of rounds):

- `ingraph`: one `c.program` whose `isthmus.fori_loop(0, n, body)` runs on the hosts: the
  value crosses a -> b -> a and the predicate a -> b each iteration, host to host; the
  server and the client take part only at the start and the end.
- `client_loop`: the same body as a program run per iteration (`i + 1`, `g(f(v))` and the
  predicate), the client fetching the predicate after each run to decide whether to go on.
- `jax_while`: `jax.lax.while_loop` of f and g in this process on one device (the limit:
  no hosts, no network).
- `ingraph_one_host` and `client_loop_one_host`: the same two modes with g on f's slice
  (island a, one host): no value crosses hosts, so what is left per iteration is the cost
  of driving the loop, in the graph or from the client.

`ratios.ingraph_vs_client_loop` is the paper's comparison (its claim: about 5x). Every
mode's result is checked against a Python loop of the same float32 arithmetic.
`ingraph` runs one iteration at a time on each host (`parallel_iterations` 1, the default);
`ingraph_parallel_4` and `ingraph_parallel_16` are the same loop with up to 4 or 16 at once
(`c.program(parallel_iterations=...)`): island a's counter and predicate may then run ahead
of the value still crossing to island b and back. The three are timed round by round in
turn, so that drift on a shared machine touches them alike; `parallel_iterations` in the
JSON maps 1, 4 and 16 to their rates.

`--server URL` measures a running server (its admin token in ISTHMUS_TOKEN; islands a and
b) instead of starting one. `--smoke` runs every mode a few iterations (`SMOKE`), the JSON
and the plot in seconds, for CI; its figures mean nothing. Output (`--json PATH`, the keys
`JSON_KEYS`): `iterations_per_s` (mode -> median), `ratios`, `parallel_iterations`,
`config`, `machine`.
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
from bench.call_latency import isthmus_client
from bench.machine import describe
from bench.output import write_json

SIZE = 16
PARALLEL = (1, 4, 16)  # parallel_iterations measured
FULL = {"ingraph": 2000, "client_loop": 300, "jax_while": 100_000, "rounds": 5}
SMOKE = {"ingraph": 20, "client_loop": 5, "jax_while": 1000, "rounds": 1}
JSON_KEYS = ("iterations_per_s", "ratios", "parallel_iterations", "config", "machine")


def f(v: Any) -> Any:
    return v * 0.5 + 1.0


def g(v: Any) -> Any:
    return v - 0.25


def expected(n: int) -> np.ndarray:
    v = np.zeros(SIZE, np.float32)
    for _ in range(n):
        v = (v * np.float32(0.5) + np.float32(1.0)) - np.float32(0.25)
    return v


def timed(run: Callable[[], np.ndarray], n: int, rounds: int) -> float:
    """Median iterations/s over `rounds` runs of n iterations, each result checked."""
    return statistics.median(timed_in_turn({"run": run}, n, rounds)["run"])


def mode(parallel: int) -> str:
    return "ingraph" if parallel == 1 else f"ingraph_parallel_{parallel}"


def timed_in_turn(runs: dict[str, Callable[[], np.ndarray]], n: int, rounds: int) -> dict[str, list[float]]:
    """Iterations/s of each run per round, the runs taking turns within each round."""
    rates: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            out = run()
            rates[name].append(n / (time.perf_counter() - start))
            np.testing.assert_allclose(out, expected(n), rtol=1e-6)
    return rates


def measure(c: isthmus.Client, n_graph: int, n_client: int, rounds: int,
            one_host: bool = False) -> dict[str, float]:
    sa = c.slice({"x": 1}, island="a")
    sb = sa if one_host else c.slice({"x": 1}, island="b")
    fa, gb = c.jit(f, slice=sa), c.jit(g, slice=sb)
    inc, less = c.jit(lambda i: i + 1, slice=sa), c.jit(lambda i, n: i < n, slice=sa)
    x = c.put(np.zeros(SIZE, np.float32), sa)
    zero = c.put(np.int32(0), sa)

    def ingraph(parallel: int) -> Any:
        @c.program(parallel_iterations=parallel, name=f"ingraph_{parallel}")
        def loop(v: Any, n: Any) -> Any:
            return isthmus.fori_loop(0, n, lambda i, w: gb(fa(w)), v)
        return loop

    @c.program
    def step(i: Any, v: Any, n: Any) -> Any:
        j = inc(i)
        return j, gb(fa(v)), less(j, n)

    def client_loop(n: int) -> np.ndarray:
        bound = c.put(np.int32(n), sa)
        i, v = zero, x
        go = True
        while go:
            i, v, pred = step(i, v, bound)
            go = bool(pred.numpy())
        return v.numpy()

    bounds = {k: c.put(np.int32(k), sa) for k in (n_graph, 1)}
    loops = {p: ingraph(p) for p in PARALLEL}
    for loop in loops.values():
        loop(x, bounds[1]).result()  # traced, registered, compiled
    client_loop(1)
    runs = {mode(p): (lambda loop=loop: loop(x, bounds[n_graph]).numpy()) for p, loop in loops.items()}
    rates = {name: statistics.median(r) for name, r in timed_in_turn(runs, n_graph, rounds).items()}
    rates["client_loop"] = timed(lambda: client_loop(n_client), n_client, rounds)
    return rates


def jax_while(n: int, rounds: int) -> float:
    loop = jax.jit(lambda v, k: jax.lax.while_loop(lambda s: s[0] < k, lambda s: (s[0] + 1, g(f(s[1]))),
                                                    (jnp.int32(0), v))[1])
    v0 = np.zeros(SIZE, np.float32)
    loop(v0, 1).block_until_ready()
    return timed(lambda: np.asarray(loop(v0, n)), n, rounds)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.control_flow", description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--smoke", action="store_true", help="every mode a few iterations: seconds, for CI")
    p.add_argument("--plot", type=Path, default=None, help="draw the rates into this PNG")
    p.add_argument("--server", help="a running server's address (admin token in ISTHMUS_TOKEN) "
                                    "instead of a local one")
    args = p.parse_args(argv)
    if args.plot is not None:
        try:  # before the run, not after it
            from bench.plot import plot_control_flow
        except ImportError as e:
            p.error(f"--plot needs matplotlib (pip install -e '.[bench]'): {e}")
    size = SMOKE if args.smoke else FULL
    n_graph, n_client, n_jax, rounds = size["ingraph"], size["client_loop"], size["jax_while"], size["rounds"]
    with isthmus_client(args.server) as c:
        rates = measure(c, n_graph, n_client, rounds)
        local = measure(c, n_graph * 5, n_client, rounds, one_host=True)
    rates |= {f"{mode}_one_host": rate for mode, rate in local.items()}
    rates["jax_while"] = jax_while(n_jax, rounds)
    result = {
        "iterations_per_s": rates,
        "ratios": {"ingraph_vs_client_loop": rates["ingraph"] / rates["client_loop"],
                   "ingraph_vs_client_loop_one_host": (rates["ingraph_one_host"]
                                                       / rates["client_loop_one_host"]),
                   "jax_while_vs_ingraph": rates["jax_while"] / rates["ingraph"]},
        "parallel_iterations": {str(p): rates[mode(p)] for p in PARALLEL},
        "config": {"iterations": {"ingraph": n_graph, "client_loop": n_client, "jax_while": n_jax,
                                  "ingraph_one_host": n_graph * 5},
                   "rounds": rounds, "size": SIZE},
        "machine": describe(),
    }
    print(json.dumps(result, indent=2))
    write_json(args.json, result, JSON_KEYS)
    if args.plot is not None:
        plot_control_flow(result, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
