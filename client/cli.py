"""The `isthmus` command: `serve`, `demo`, `program show`, the status commands `devices`,
`slices`, `runs` and `top` (rich tables, or `--json` for scripts; `client.views`), and
`trace RUN_ID -o FILE` (a traced run's Chrome trace, `client.traces`).

The status commands connect as `connect()` does (`--address`, else `ISTHMUS_ADDRESS`, else
the local server; the admin token from `ISTHMUS_TOKEN` or the local server's state dir, or
a session's `ISTHMUS_CLIENT_SECRET`). With the admin token they show every client's slices
and runs, with a session's secret that session's own. They do not wait for a server that
cannot be reached unless `ISTHMUS_RESTART_GRACE_S` says so. An error is one line on stderr
and a non-zero exit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import client.connection as connection
from client.devices import DeviceTable
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

RUNS_LISTED = 256  # the most `isthmus runs` asks for (the server keeps the last 256 runs)
STATUS_CLIENT = "isthmus-cli"  # the name of the session a status command opens


def _serve(rest: list[str]) -> None:
    # The server is its own program (it imports Ray and the executors; the client does not).
    os.execv(sys.executable, [sys.executable, "-m", "server", *rest])


@contextlib.contextmanager
def _connect(args: argparse.Namespace) -> Iterator[connection.Client]:
    """A client for a status command: a session of its own, opened with the admin token and
    closed after; or the session of `ISTHMUS_CLIENT_SECRET`, left open (it is its opener's)."""
    grace = None if "ISTHMUS_RESTART_GRACE_S" in os.environ else 0.0
    c = connection.connect(args.address, name=STATUS_CLIENT, restart_grace_s=grace)
    try:
        yield c
    finally:
        if c.admin:
            c.close()
        else:
            c.detach()


def _print(args: argparse.Namespace, doc: Any, view: Callable[[], Any]) -> None:
    """`doc` as JSON with `--json`, else `view()` as rich renders it."""
    if args.json:
        print(json.dumps(doc, indent=2))
        return
    from rich.console import Console

    Console().print(view())


def _devices(args: argparse.Namespace) -> None:
    from client import views

    with _connect(args) as c:
        table = DeviceTable(c.raw_view("/v1/islands"), c.raw_view("/v1/devices"))
    _print(args, {"islands": table.islands, "devices": table.devices}, lambda: views.devices_table(table))


def _slices(args: argparse.Namespace) -> None:
    from client import views

    with _connect(args) as c:
        slices, admin = c.raw_view("/v1/slices"), c.admin
    _print(args, slices, lambda: views.slices_table(slices, owners=admin))


def _runs(args: argparse.Namespace) -> None:
    from client import views

    if not 1 <= args.limit <= RUNS_LISTED:
        raise InvalidArgument(f"--limit: expected 1 to {RUNS_LISTED}, got {args.limit}")
    with _connect(args) as c:
        runs, admin = c.raw_view("/v1/runs", {"limit": args.limit}), c.admin
    _print(args, runs, lambda: views.runs_table(runs, clients=admin))


def _top(args: argparse.Namespace) -> None:
    from client import views

    if not args.interval > 0:
        raise InvalidArgument(f"--interval: expected seconds > 0, got {args.interval}")
    if args.json and not args.once:
        raise InvalidArgument("--json: a live view is not JSON; add --once for one JSON object")
    with _connect(args) as c:
        def frame() -> views.Frame:
            table = DeviceTable(c.raw_view("/v1/islands"), c.raw_view("/v1/devices"))
            runs = c.raw_view("/v1/runs", {"limit": views.TOP_RUNS})
            return views.Frame(c.address, time.time(), table, runs, c.admin)

        if args.once:
            f = frame()
            _print(args, f.to_json(), lambda: views.top_view(f))
            return
        from rich.live import Live

        with Live(views.top_view(frame()), auto_refresh=False, screen=False) as live:
            try:
                while True:
                    time.sleep(args.interval)
                    live.update(views.top_view(frame()), refresh=True)
            except KeyboardInterrupt:
                return


def _trace(args: argparse.Namespace) -> None:
    from client import traces

    with _connect(args) as c:
        trace = traces.fetch(c, args.run_id)
    text = json.dumps(trace)
    if args.output == "-":
        print(text)
        return
    try:
        Path(args.output).write_text(text)
    except OSError as e:
        raise InvalidArgument(f"-o: cannot write {args.output}: {e}") from None
    events = sum(1 for e in trace["traceEvents"] if e.get("ph") == "X")
    hosts = sum(1 for e in trace["traceEvents"] if e.get("name") == "process_name") - 1
    missing = trace.get("otherData", {}).get("missing_hosts") or {}
    print(f"{args.output}: {events} events from {hosts} hosts and the server"
          + (f"; no answer from {', '.join(sorted(missing))}" if missing else "")
          + " (open it in ui.perfetto.dev or chrome://tracing)")


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
    devices = sub.add_parser("devices", help="islands, hosts and devices with their status and load")
    slices = sub.add_parser("slices", help="slices: this client's, or with the admin token every "
                            "client's with its owner")
    runs = sub.add_parser("runs", help="the calls and program runs that ended last, with how long "
                          "they waited and ran (the admin sees every client's)")
    runs.add_argument("--limit", type=int, default=50, help=f"at most this many (1 to {RUNS_LISTED})")
    top = sub.add_parser("top", help="a live view: islands' queues and in-flight work, hosts up or "
                         "down and their load, recent runs (Ctrl-C ends it)")
    top.add_argument("--once", action="store_true", help="print one frame and exit")
    top.add_argument("--interval", type=float, default=1.0, help="seconds between frames (default 1)")
    for command in (devices, slices, runs, top):
        command.add_argument("--json", action="store_true", help="print JSON for scripts (top: with --once)")
    trace = sub.add_parser("trace", help="a traced run's Chrome trace JSON (program(..., trace=True)), "
                           "for ui.perfetto.dev or chrome://tracing")
    trace.add_argument("run_id", help="the run's id (`isthmus runs`)")
    trace.add_argument("-o", "--output", default="-", help="write it here (default: stdout)")
    for command in (devices, slices, runs, top, trace):
        command.add_argument("--address", help="server address (env ISTHMUS_ADDRESS)")
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
        {"devices": _devices, "slices": _slices, "runs": _runs, "top": _top, "trace": _trace, "demo": _demo,
         "program": _program_show}[args.command](args)
    except IsthmusError as e:
        sys.exit(f"isthmus {args.command}: {e}")
    except KeyboardInterrupt:  # (Ctrl-C: `top` ends quietly in its loop, anything else here)
        sys.exit(130)
    except BrokenPipeError:  # (its output piped into `head`, say): nothing more to say
        sys.stderr.close()
        sys.exit(1)


if __name__ == "__main__":
    main()
