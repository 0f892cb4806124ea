"""`isthmus serve` / `python -m server`: start Ray, the executors and the REST API.

Prints one line, `isthmus: serving on http://HOST:PORT`, once every executor is up and the
socket accepts connections; SIGINT and SIGTERM stop the executors and the Ray it started.
With `--stop-with-stdin`, the end of standard input stops it the same way: a process that
starts a server with a pipe there takes it down with itself, however it dies.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

if TYPE_CHECKING:
    from server.settings import Settings

READY = "isthmus: serving on"


class ReadyServer(uvicorn.Server):
    """uvicorn's server, printing the ready line once the app has started and it listens.

    uvicorn binds the socket itself: a socket handed to it loses TCP_NODELAY, which costs
    40 ms a request on loopback.
    """

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.should_exit or not self.servers:
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        print(f"{READY} http://{host}:{port}", flush=True)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="isthmus serve", description=__doc__.splitlines()[0])
    p.add_argument("--host", help="address to bind (env ISTHMUS_HOST, default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port (env ISTHMUS_PORT, default 8470; 0 picks one)")
    p.add_argument("--cluster", type=Path, help="cluster file, JSON or YAML (env ISTHMUS_CLUSTER_FILE)")
    p.add_argument("--state-dir", type=Path, help="token and state (env ISTHMUS_STATE_DIR)")
    p.add_argument("--ray-address", help="join this Ray cluster instead of starting one")
    p.add_argument("--insecure-ray", action="store_true", default=None,
                   help="allow joining a Ray cluster without token authentication (env ISTHMUS_INSECURE_RAY)")
    p.add_argument("--stop-with-stdin", action="store_true",
                   help="stop when standard input ends (the process that started this one is gone)")
    return p.parse_args(argv)


def stop_with_stdin() -> None:
    """SIGTERM this process once standard input ends (the server stops as on Ctrl-C)."""
    def watch() -> None:
        # The file descriptor, not sys.stdin: a daemon thread blocked in sys.stdin's reader
        # holds its lock, and the interpreter, finding it held at exit, aborts the process.
        while os.read(sys.stdin.fileno(), 1 << 12):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="stop-with-stdin", daemon=True).start()


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    # The server only reads artifacts; keep it off any accelerator the executors need.
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from ir import IsthmusError
    from server.app import create_app
    from server.http import guarded_http
    from server.settings import Settings

    overrides = {k: v for k, v in {
        "host": args.host, "port": args.port, "cluster_file": args.cluster,
        "state_dir": args.state_dir, "ray_address": args.ray_address,
        "insecure_ray": args.insecure_ray,
    }.items() if v is not None}
    try:
        settings = Settings(**overrides)
        settings.resolve_token()  # the state dir and the token are checked before anything starts
        preflight(settings)
    except (ValueError, OSError, IsthmusError) as e:  # IsthmusError: an unsafe state dir or token
        sys.exit(f"isthmus serve: {e}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if args.stop_with_stdin:
        stop_with_stdin()
    config = uvicorn.Config(create_app(settings), host=settings.host, port=settings.port,
                            http=guarded_http(settings.header_timeout_s, settings.max_idle_connections),
                            log_level="warning", lifespan="on", timeout_graceful_shutdown=5)
    # uvicorn stops on SIGTERM in order (the app's shutdown stops the executors and the Ray
    # it started), then raises the signal again for the handler found before it: this one,
    # so that a stop asked for is a clean exit (0), not death by the signal.
    signal.signal(signal.SIGTERM, _stopped)
    ReadyServer(config).run()


def preflight(settings: Settings) -> None:
    """What would stop the server from starting, found before Ray and the executors start
    (and said in one line, not in the traceback of the app's startup): a cluster file that
    cannot be read, another server on the state dir, a state database that cannot be read,
    the port taken."""
    from executors.ray_daemon import hold_server_lock
    from server.service import load_cluster
    from server.store import check_readable

    if settings.cluster_file:
        load_cluster(settings.cluster_file)
    hold_server_lock(settings.state_dir).release()  # (taken again, for good, as it starts)
    if settings.db_path is not None:
        check_readable(settings.db_path)
    if settings.port:
        family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds it
            try:
                probe.bind((settings.host, settings.port))
            except OSError as e:
                raise OSError(f"cannot listen on {settings.host}:{settings.port}: {e.strerror}") from None


def _stopped(signum: int, frame: object) -> None:
    sys.exit(0)


if __name__ == "__main__":
    main()
