"""The cost of a real multi-node Ray: `bench.call_latency` and `bench.dispatch` on a cluster of
network namespaces, beside the same benchmarks on the embedded default.

    python -m bench.multinode --json /tmp/multinode.json [--quick]

Needs root (`bench.netns`). Both runs have the same shape, 2 islands x 2 hosts x 4
simulated CPU devices, on the same machine, one after the other:

- `embedded`: each benchmark as it is (`python -m bench.<name>`): the server starts its own
  Ray on this machine, one node, every executor on it.
- `multinode`: a Ray of five nodes, each in a network namespace with its own address on a
  bridge (the head; a0, a1 labelled island a; b0, b1 labelled island b), token
  authentication on; the server runs on the head's node, joins the cluster
  (`--ray-address`), takes its islands from the labels and pins each executor to its node;
  each benchmark runs outside the namespaces and reaches the server over the bridge
  (`--server`). The baselines (JAX here, a plain Ray actor on a Ray of the benchmark's own)
  run in both, so each run's ratios stand on their own.

`--quick` passes `--quick` to `bench.dispatch` (few rounds, small sizes). Output (`--json
PATH`): `embedded` and `multinode` (benchmark -> its whole JSON), and
`multinode_vs_embedded`: for call latency, multi-node µs per call over embedded µs per call
(`isthmus_sync`, `isthmus_pipelined`); for dispatch, embedded computations/s over multi-node
computations/s (`isthmus_opbyop`, `isthmus_chained`, `isthmus_chain16_parallel`, ...), so
1.0 is no cost and 1.5 is half again as slow; `machine`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.call_latency import machine
from bench.netns import netns_cluster, unusable

WORKERS = {"a0": "a", "a1": "a", "b0": "b", "b1": "b"}
DEVICES = 4
LATENCY_MODES = ("isthmus_sync", "isthmus_pipelined")
DISPATCH_MODES = ("isthmus_opbyop", "isthmus_chained", "isthmus_chained_pipelined",
                  "isthmus_chain16_parallel", "isthmus_chain16_sequential")
ROOT = Path(__file__).resolve().parents[1]


def bench(name: str, out: Path, extra: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", f"bench.{name}", "--json", str(out), *extra]
    print("  " + " ".join(cmd[1:]), file=sys.stderr)
    done = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **(env or {})}, timeout=3600, check=False,
                          stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        raise SystemExit(f"bench.{name} failed ({done.returncode})")
    return json.loads(out.read_text())


def both(tmp: Path, tag: str, dispatch_extra: list[str], server: list[str],
         env: dict[str, str] | None = None) -> dict[str, Any]:
    return {"call_latency": bench("call_latency", tmp / f"{tag}_call_latency.json", server, env),
            "dispatch": bench("dispatch", tmp / f"{tag}_dispatch.json", dispatch_extra + server, env)}


def multinode(tmp: Path, dispatch_extra: list[str]) -> dict[str, Any]:
    with netns_cluster(tmp, WORKERS, devices=DEVICES) as cluster:
        server, token = cluster.start_server(tmp / "state")
        try:
            return both(tmp, "multinode", dispatch_extra, ["--server", server.address],
                        {"ISTHMUS_TOKEN": token})
        finally:
            server.stop()


def ratios(embedded: dict[str, Any], multi: dict[str, Any]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for m in LATENCY_MODES:
        out[f"call_latency.{m}"] = (multi["call_latency"]["us_per_call"][m]
                                    / embedded["call_latency"]["us_per_call"][m])
    for m in DISPATCH_MODES:
        a = embedded["dispatch"]["computations_per_s"].get(m)
        b = multi["dispatch"]["computations_per_s"].get(m)
        out[f"dispatch.{m}"] = a / b if a and b else None
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.multinode", description=__doc__.splitlines()[0])
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--quick", action="store_true", help="bench.dispatch --quick")
    args = p.parse_args(argv)
    why = unusable()
    if why is not None:
        p.error(f"a multi-node cluster of network namespaces {why}")
    extra = ["--quick"] if args.quick else []
    with tempfile.TemporaryDirectory(prefix="isthmus-multinode-") as tmp:
        print("embedded (one node)", file=sys.stderr)
        embedded = both(Path(tmp), "embedded", extra, [])
        print(f"multi-node ({len(WORKERS)} workers and a head, each in a network namespace)", file=sys.stderr)
        multi = multinode(Path(tmp), extra)
    result = {"embedded": embedded, "multinode": multi, "multinode_vs_embedded": ratios(embedded, multi),
              "machine": machine(), "workers": WORKERS, "devices_per_host": DEVICES}
    for k, v in result["multinode_vs_embedded"].items():
        print(f"  {k:<44} {'-' if v is None else f'{v:.2f}'}", file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
