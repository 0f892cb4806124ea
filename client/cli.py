"""The `isthmus` command: `serve`, `devices`, `demo`, `program show`."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import client.connection as connection
from ir import (
    InvalidArgument,
    IsthmusError,
    Placement,
    Program,
    Unavailable,
    from_wire,
    print_program,
    verify,
)
from ir.passes import host_plans, lower


def _serve(rest: list[str]) -> None:
    # The server is its own program (it imports Ray and the executors; the client does not).
    os.execv(sys.executable, [sys.executable, "-m", "server", *rest])


def _devices(args: argparse.Namespace) -> None:
    with connection.connect(args.address) as c:
        print(c.devices())


def _program_show(args: argparse.Namespace) -> None:
    """Print a program saved in its wire form (`ir.to_wire`) as text, after verifying it."""
    try:
        doc = json.loads(Path(args.file).read_text())
    except (OSError, ValueError) as e:
        raise InvalidArgument(f"{args.file}: not a readable JSON file: {e}") from None
    program = from_wire(doc)
    verify(program)
    print(print_program(program), end="")
    if args.plans:
        print(_plans_text(program))


def _plans_text(program: Program) -> str:
    """Each host's plan, with the control-flow primitives (its loop-control state machines).
    A slice without a placement is shown on host `<island>0` (or `h<k>`), devices 0..n-1."""
    placements = {
        s.name: s.placement or Placement(s.island or "a", tuple(
            (f"{s.island}0" if s.island else f"h{k}", i) for i in range(s.mesh.size)))
        for k, s in enumerate(program.slices)
    }
    plans = host_plans(lower(program, placements))
    return "\n".join(line for h in sorted(plans) for line in plans[h].text())


def _server_running(address: str) -> bool:
    import httpx

    try:
        return httpx.get(f"{address.rstrip('/')}/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _demo(args: argparse.Namespace) -> None:
    from client.demo import run
    from client.embedded import EmbeddedServer

    if args.steps < 1:
        raise InvalidArgument(f"--steps: expected at least 1, got {args.steps}")
    address = args.address or os.environ.get("ISTHMUS_ADDRESS") or connection.DEFAULT_ADDRESS
    if _server_running(address):
        with connection.connect(address, name="demo") as c:
            run(c, steps=args.steps)
        return
    if args.address or os.environ.get("ISTHMUS_ADDRESS"):  # asked for that server: not another
        raise Unavailable(f"no Isthmus server answers at {address} (GET /healthz)")
    print("No Isthmus server is running: starting the embedded one for this demo "
          "(local Ray, 2 islands x 2 hosts x 4 CPU devices; stopped after it) ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="isthmus-demo-") as tmp:
        state = Path(tmp)
        server = EmbeddedServer.start(state)
        try:
            token = (state / "token").read_text().strip()
            with connection.connect(server.address, token=token, name="demo") as c:
                run(c, steps=args.steps)
        finally:
            server.stop()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        _serve(argv[1:])
        return
    parser = argparse.ArgumentParser(prog="isthmus", description="Run JAX on islands of devices.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("serve", help="start the server (see `isthmus serve --help`)")
    devices = sub.add_parser("devices", help="print islands, hosts and devices with their load")
    devices.add_argument("--address", help="server address (env ISTHMUS_ADDRESS)")
    demo = sub.add_parser("demo", help="train a small MLP through Isthmus")
    demo.add_argument("--address", help="use this server (env ISTHMUS_ADDRESS); with neither, the "
                      "one at the default address, else an embedded one started for the demo")
    demo.add_argument("--steps", type=int, default=300)
    program = sub.add_parser("program", help="work with saved IR programs")
    program_sub = program.add_subparsers(dest="action", required=True)
    show = program_sub.add_parser("show", help="print a program (JSON wire form) as text")
    show.add_argument("file", help="a program saved with json.dump(ir.to_wire(program), f)")
    show.add_argument("--plans", action="store_true",
                      help="also lower it and print each host's plan (loops as Enter/Merge/Switch/"
                           "NextIteration/Exit)")
    args = parser.parse_args(argv)
    try:
        {"devices": _devices, "demo": _demo, "program": _program_show}[args.command](args)
    except IsthmusError as e:
        sys.exit(f"isthmus {args.command}: {e}")


if __name__ == "__main__":
    main()
