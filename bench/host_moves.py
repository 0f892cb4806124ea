"""Host-to-host moves inside a program: over the peers' channels, against Ray actor calls.

    python -m bench.host_moves --json /tmp/host_moves.json [--moves 200] [--rounds 5]
    python -m bench.host_moves --smoke --json /tmp/host_moves.json   # seconds, for CI

Two islands of one host each (a0, b0; one CPU device each), driven through `ExecutorPool`
without the server. One program bounces a float32[8] between the hosts: a0 sends it to b0,
b0 sends what it received back, `--moves` sends in all, then a0 holds the last value. A
round is one run of it, timed from its submission to the wait on its result; a move is a
round's time over its sends, so it includes each send's serialization and the receiving
host's placement of the value on its device. Two modes, each on a pool of its own (one Ray
at a time), each warmed up by one round:

- `link`: the default: each host writes its sends on the peer's channel (`executors.ray_host`).
- `ray`: the same program with `RayOptions(peer_links=False)`: each send is an actor call
  from executor to executor, through Ray.

Every round's value is checked (a float32[8] comes back unchanged). Where this process has
joined a Ray already, both pools use it (and leave it up). `--smoke` runs both modes one
round of two moves (`SMOKE`), for CI; its figures mean nothing. Output (`--json PATH`, the
keys `JSON_KEYS`): `us_per_move` (mode -> median over rounds), `ratio_ray_vs_link`,
`samples_us`, `machine`, `moves`, `rounds`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

import numpy as np

from bench.call_latency import BenchError, machine
from bench.output import write_json
from executors import ExecutorPool, RayOptions, RunMessage
from ir import DeviceMesh, Spec
from ir.plan import HostPlan, Recv, Send
from resource_manager import ClusterSpec

CLUSTER = ClusterSpec.from_json({"islands": [{"name": "a", "hosts": 1, "devices_per_host": 1},
                                             {"name": "b", "hosts": 1, "devices_per_host": 1}]})
ONE = DeviceMesh((0,), (("x", 1),))
X = np.arange(8, dtype=np.float32)
SMOKE = {"moves": 2, "rounds": 1}
JSON_KEYS = ("us_per_move", "ratio_ray_vs_link", "samples_us", "machine", "moves", "rounds")


def plans(moves: int) -> tuple[HostPlan, HostPlan, str]:
    """a0's and b0's plans for `moves` sends back and forth, and a0's name of the last value."""
    a, b, held = [], [], "%0"
    for k in range(0, moves, 2):
        a.append(Send(held, ("b0",), f"t{k}"))
        b += [Recv(f"%b{k}", ("a0",), f"t{k}", ONE, Spec(())), Send(f"%b{k}", ("a0",), f"t{k + 1}")]
        held = f"%a{k}"
        a.append(Recv(held, ("b0",), f"t{k + 1}", ONE, Spec(())))
    return (HostPlan("a0", ((0, "%0"),), tuple(a), tuple(range(len(a))), ((0, held),), ()),
            HostPlan("b0", (), tuple(b), tuple(range(len(b))), (), ()), held)


async def rounds(pool: ExecutorPool, moves: int, count: int) -> list[float]:
    loop = asyncio.get_running_loop()
    a, b, last = plans(moves)
    pool.put(["a0"], "x", X.tobytes(), "float32", X.shape, ONE, [])
    await pool.wait("a0", "x", 60)
    samples = []
    for r in range(count + 1):  # the first warms up
        start = loop.time()
        to_a = RunMessage(f"r{r}", a.key, 0, len(a.steps), [("%0", "x")], [(last, f"y{r}")], True, 60)
        to_b = RunMessage(f"r{r}", b.key, 0, len(b.steps), [], [], True, 60)
        pool.run([("a0", to_a, a), ("b0", to_b, b)])
        await pool.wait("a0", f"y{r}", 120)
        elapsed = loop.time() - start
        got = np.frombuffer(await pool.fetch("a0", f"y{r}", 60), np.float32)
        if not np.array_equal(got, X):
            raise BenchError(f"round {r}: the value came back as {got}, expected {X}")
        pool.delete("a0", [f"y{r}"])
        if r:
            samples.append(elapsed / moves * 1e6)
    return samples


def mode(peer_links: bool, moves: int, count: int) -> list[float]:
    loop = asyncio.new_event_loop()
    options = RayOptions(num_cpus=2, object_store_bytes=256 << 20, peer_links=peer_links)
    pool = loop.run_until_complete(ExecutorPool.start(CLUSTER, options))
    try:
        return loop.run_until_complete(rounds(pool, moves, count))
    finally:
        pool.shutdown()
        loop.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.host_moves", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--moves", type=int, default=200, help="sends per round (even)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help=f"{SMOKE}: seconds, for CI")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    moves = max(2, args.moves - args.moves % 2)
    samples = {"link": mode(True, moves, args.rounds), "ray": mode(False, moves, args.rounds)}
    us = {m: statistics.median(s) for m, s in samples.items()}
    out = {"us_per_move": us, "ratio_ray_vs_link": us["ray"] / us["link"], "samples_us": samples,
           "machine": machine(), "moves": moves, "rounds": args.rounds}
    for m, v in us.items():
        print(f"  {m:<6} {v:9.1f} us per move", file=sys.stderr)
    print(f"  ray / link: {out['ratio_ray_vs_link']:.2f}", file=sys.stderr)
    write_json(args.json, out, JSON_KEYS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
