"""The servers a benchmark measures: one it is pointed at, or one it starts for itself.

`own_server(env)` starts a local server (its own Ray, in a temp state dir) with these
`ISTHMUS_*` settings and an admin token made here, given to it in ISTHMUS_TOKEN, so that
whatever ISTHMUS_TOKEN this process has (the token of a server another benchmark was
pointed at) is not taken for its own; it yields (address, admin token) and stops the
server after. `server(address, env, cluster)` is the server at `address`, its admin token
in ISTHMUS_TOKEN, or else `own_server(env, cluster)`. `fork_exec_allowed` silences JAX's
warning about `os.fork()` for the children that exec at once (Ray, the server).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import tempfile
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from client.embedded import EmbeddedServer


@contextlib.contextmanager
def fork_exec_allowed() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        yield


@contextlib.contextmanager
def own_server(env: Mapping[str, str] | None = None, cluster: Mapping[str, Any] | None = None,
               drop: Sequence[str] = (), prefix: str = "isthmus-bench-") -> Iterator[tuple[str, str]]:
    """A local server with these settings (and this `--cluster` file's islands, if given),
    started without the variables `drop` of this process's environment (put back once it
    has started): (address, admin token); stopped (its process group) after."""
    token = secrets.token_urlsafe(32)
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        extra: list[str] = []
        if cluster is not None:
            path = Path(tmp) / "cluster.json"
            path.write_text(json.dumps(cluster))
            extra = ["--cluster", str(path)]
        dropped = {k: os.environ.pop(k) for k in drop if k in os.environ}
        try:
            with fork_exec_allowed():
                srv = EmbeddedServer.start(Path(tmp), extra=extra, env={**(env or {}),
                                           "ISTHMUS_TOKEN": token})
        finally:
            os.environ.update(dropped)
        try:
            yield srv.address, token
        finally:
            srv.stop()


@contextlib.contextmanager
def server(address: str | None, env: Mapping[str, str] | None = None,
           cluster: Mapping[str, Any] | None = None) -> Iterator[tuple[str, str]]:
    """(address, admin token) of the server at `address` (its token in ISTHMUS_TOKEN), or of
    `own_server(env, cluster)` where `address` is None."""
    if address is not None:
        yield address, os.environ.get("ISTHMUS_TOKEN", "")
        return
    with own_server(env, cluster) as s:
        yield s
