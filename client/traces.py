"""A traced run's Chrome trace (`Client.trace`, `isthmus trace`): by its run id, or by a
value the run computed.

A program traced with `program(fn, trace=True)` (or every run, where the server sets
`ISTHMUS_TRACE=1`) leaves on the server each host's steps, sends, receives, loop tests and
waits, and the server's scheduling, on one clock: `GET /v1/runs/{id}/trace` assembles it,
once the run has ended, as JSON that Perfetto (ui.perfetto.dev) and chrome://tracing open.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import jax

from client.buffer import Buffer
from ir import InvalidArgument


class Viewer(Protocol):
    def flush(self) -> None: ...
    def raw_json(self, method: str, path: str) -> Any: ...
    def raw_view(self, path: str, params: dict[str, Any] | None = None) -> Any: ...


def run_id_of(client: Viewer, of: Any) -> str:
    """`of` itself, a run id; else the id of the run that computes its first `Buffer` leaf."""
    if isinstance(of, str):
        if not of:
            raise InvalidArgument("trace: expected a run id or a Buffer a run computed, got ''")
        return of
    buffer = next((x for x in jax.tree_util.tree_leaves(of) if isinstance(x, Buffer)), None)
    if buffer is None:
        raise InvalidArgument(f"trace: expected a run id or a Buffer a run computed, got {type(of).__name__}")
    client.flush()  # its run submitted
    run_id = client.raw_json("GET", f"/v1/buffers/{quote(buffer.id, safe='')}").get("run_id")  # its own
    if not run_id:
        raise InvalidArgument(f"trace: buffer {buffer.id} was uploaded, not computed by a run")
    return str(run_id)


def fetch(client: Viewer, of: Any, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The run's trace, once it has ended; written to `path` too, if given."""
    run_id = run_id_of(client, of)
    trace: dict[str, Any] = client.raw_view(f"/v1/runs/{quote(run_id, safe='/')}/trace")
    if path is not None:
        Path(path).write_text(json.dumps(trace))
    return trace
