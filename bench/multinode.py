"""The cost of a real multi-node Ray: `bench.call_latency` and `bench.dispatch` on a cluster of
network namespaces, beside the same benchmarks on the embedded default.

    python -m bench.multinode --json /tmp/multinode.json
    python -m bench.multinode --smoke --json /tmp/multinode.json   # for CI: the benchmarks' --smoke

Needs root (`bench.netns`). Both runs have the same shape, 2 islands x 2 hosts x 4
simulated CPU devices, on the same machine, one after the other:

- `embedded`: each benchmark as it is: the server starts its own Ray on this machine, one
  node, every executor on it (`--server URL`: a running server of that shape instead, its
  admin token in ISTHMUS_TOKEN).
- `multinode`: a Ray of five nodes, each in a network namespace with its own address on a
  bridge (the head; a0, a1 labelled island a; b0, b1 labelled island b), token
  authentication on; the server runs on the head's node, joins the cluster
  (`--ray-address`), takes its islands from the labels and pins each executor to its node;
  each benchmark runs outside the namespaces and reaches the server over the bridge
  (`--server`). The baselines (JAX here, a plain Ray actor on a Ray of the benchmark's own)
  run in both, so each run's ratios stand on their own.

The benchmarks run in this process, one after the other (`main(argv)`, their JSON read
back), with this process set up as `bench.dispatch` wants it before JAX starts.
`--smoke` passes `--smoke` to both and has two worker nodes (a0, b0; chain16, which needs
four hosts, is then absent on the cluster), for CI; its figures mean nothing. `--cluster-server
URL` runs the multi-node half on a running server of a cluster of namespaces (its admin token
in the file `--cluster-token-file`, its hosts those of its islands' table) instead of starting
one (tests/e2e/test_multinode.py runs the smoke on its own cluster so). Output (`--json
PATH`, the keys `JSON_KEYS`): `embedded` and `multinode` (benchmark -> its whole JSON), and
`multinode_vs_embedded`: for call latency, multi-node µs per call over embedded µs per call
(`isthmus_sync`, `isthmus_pipelined`); for dispatch, embedded computations/s over multi-node
computations/s (`isthmus_opbyop`, `isthmus_chained`, `isthmus_chain16_parallel`, ...), so
1.0 is no cost and 1.5 is half again as slow; `machine`, `workers`, `devices_per_host`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import client as isthmus
from bench.call_latency import machine
from bench.dispatch import configure_processes
from bench.netns import netns_cluster, unusable
from bench.output import write_json

WORKERS = {"a0": "a", "a1": "a", "b0": "b", "b1": "b"}
SMOKE_WORKERS = {"a0": "a", "b0": "b"}  # each `ray start` is seconds; chain16 (four hosts) is then absent
DEVICES = 4
LATENCY_MODES = ("isthmus_sync", "isthmus_pipelined")
DISPATCH_MODES = ("isthmus_opbyop", "isthmus_chained", "isthmus_chained_pipelined",
                  "isthmus_chain16_parallel", "isthmus_chain16_sequential")
JSON_KEYS = ("embedded", "multinode", "multinode_vs_embedded", "machine", "workers", "devices_per_host")


@contextmanager
def environment(env: dict[str, str]) -> Iterator[None]:
    """`env` set in this process's environment for the block, then put back as it was."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def bench(name: str, out: Path, extra: list[str], env: dict[str, str]) -> dict[str, Any]:
    """`bench.<name>`'s main, run here with `env` set; its JSON."""
    argv = ["--json", str(out), *extra]
    print(f"  bench.{name} {' '.join(argv)}", file=sys.stderr)
    with environment(env):
        importlib.import_module(f"bench.{name}").main(argv)
    return dict(json.loads(out.read_text()))


def both(tmp: Path, tag: str, extra: list[str], server: str | None, token: str | None) -> dict[str, Any]:
    """Both benchmarks against the server at `server` (its admin token `token`), or each
    starting its own where None."""
    at = [] if server is None else ["--server", server]
    env = {} if token is None else {"ISTHMUS_TOKEN": token}
    return {"call_latency": bench("call_latency", tmp / f"{tag}_call_latency.json", extra + at, env),
            "dispatch": bench("dispatch", tmp / f"{tag}_dispatch.json", extra + at, env)}


def multinode(tmp: Path, extra: list[str], workers: dict[str, str]) -> dict[str, Any]:
    with netns_cluster(tmp, workers, devices=DEVICES) as cluster:
        server, token = cluster.start_server(tmp / "state")
        try:
            return both(tmp, "multinode", extra, server.address, token)
        finally:
            server.stop()


def shape(address: str, token: str) -> tuple[dict[str, str], int]:
    """A running server's hosts, each with its island, and the most devices a host has."""
    with isthmus.connect(address, token=token, name="bench-multinode") as c:
        table = c.devices()
    hosts = {h["name"]: island["name"] for island in table.islands for h in island["hosts"]}
    return hosts, max(sum(d["host"] == h for d in table.devices) for h in hosts)


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
    p.add_argument("--smoke", action="store_true", help="both benchmarks with --smoke: for CI")
    p.add_argument("--server", help="a running server of the embedded default's shape for the embedded "
                                    "half (admin token in ISTHMUS_TOKEN) instead of one per benchmark")
    p.add_argument("--cluster-server", help="a running server of a cluster of network namespaces for the "
                                            "multi-node half instead of a cluster of its own")
    p.add_argument("--cluster-token-file", type=Path, help="the admin token of --cluster-server")
    args = p.parse_args(argv)
    if (args.cluster_server is None) != (args.cluster_token_file is None):
        p.error("--cluster-server and --cluster-token-file go together")
    why = unusable()
    if why is not None and args.cluster_server is None:
        p.error(f"a multi-node cluster of network namespaces {why}")
    configure_processes()  # before JAX starts here: the devices and pool bench.dispatch needs
    extra, workers = (["--smoke"], SMOKE_WORKERS) if args.smoke else ([], WORKERS)
    with tempfile.TemporaryDirectory(prefix="isthmus-multinode-") as tmp:
        print("embedded (one node)", file=sys.stderr)
        embedded = both(Path(tmp), "embedded", extra, args.server, os.environ.get("ISTHMUS_TOKEN"))
        devices = DEVICES
        if args.cluster_server is None:
            print(f"multi-node ({len(workers)} workers and a head, each in a namespace)", file=sys.stderr)
            multi = multinode(Path(tmp), extra, workers)
        else:
            token = args.cluster_token_file.read_text().strip()
            workers, devices = shape(args.cluster_server, token)
            print(f"multi-node ({len(workers)} workers at {args.cluster_server})", file=sys.stderr)
            multi = both(Path(tmp), "multinode", extra, args.cluster_server, token)
    result = {"embedded": embedded, "multinode": multi, "multinode_vs_embedded": ratios(embedded, multi),
              "machine": machine(), "workers": workers, "devices_per_host": devices}
    for k, v in result["multinode_vs_embedded"].items():
        print(f"  {k:<44} {'-' if v is None else f'{v:.2f}'}", file=sys.stderr)
    write_json(args.json, result, JSON_KEYS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
