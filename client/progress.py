"""Progress bars for a client's long requests: uploads, fetches and compiles.

- Shown on stderr where it is a terminal (`ISTHMUS_PROGRESS=1` shows them anyway, `0` never),
  and only for what is long: a body or an answer of at least `MIN_BYTES` (its bytes as they
  go), or a wait past `AFTER_S` (a registration the server answers once it has compiled:
  the time as it goes, since the server tells no fraction). Drawn by `rich`, transient: a
  bar is gone once its request is done.
- A request below those sizes pays a length test; rich is imported only to draw.
- A body sent in chunks is the same bytes in the same order (`chunks`), sent again from its
  start if its request is tried again.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any, Protocol

MIN_BYTES = 32 << 20  # a body or answer at least this large shows its bytes going
AFTER_S = 1.0  # a wait longer than this shows its time going
CHUNK = 1 << 20  # bytes sent or read between two updates of a bar


class Readable(Protocol):
    def read(self, amt: int | None = None) -> bytes: ...
    def getheader(self, name: str) -> str | None: ...


def enabled() -> bool:
    """Whether bars are drawn: `ISTHMUS_PROGRESS` (1 or 0), else whether stderr is a terminal."""
    forced = os.environ.get("ISTHMUS_PROGRESS", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return sys.stderr.isatty()


def _console() -> Any:
    from rich.console import Console

    # asked for where stderr is no terminal (a log, say): drawn there as on one
    forced = os.environ.get("ISTHMUS_PROGRESS", "").strip() == "1"
    return Console(stderr=True, force_terminal=forced or None)


@contextlib.contextmanager
def _bar(label: str, total: float | None, unit_bytes: bool) -> Iterator[Any]:
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    columns: list[Any] = [TextColumn("{task.description}")]
    if unit_bytes:
        columns += [BarColumn(), DownloadColumn(binary_units=True), TransferSpeedColumn()]
    else:
        columns += [SpinnerColumn(), TimeElapsedColumn()]
    with Progress(*columns, console=_console(), transient=True) as progress:
        task = progress.add_task(label, total=total)
        yield lambda n: progress.update(task, advance=n)


def chunks(label: str, data: bytes) -> bytes | Iterator[bytes]:
    """`data` as is, or, where a bar is due, as chunks that advance it as they are sent."""
    if len(data) < MIN_BYTES or not enabled():
        return data

    def sent() -> Iterator[bytes]:
        view = memoryview(data)
        with _bar(label, len(data), unit_bytes=True) as advance:
            for at in range(0, len(data), CHUNK):
                piece = view[at:at + CHUNK]
                yield bytes(piece)
                advance(len(piece))

    return sent()


def read(label: str | None, raw: Readable) -> bytes:
    """The whole answer's body; with a bar where one is due (`label`, a known large length)."""
    length = raw.getheader("content-length")
    if label is None or length is None or not length.isdigit() or int(length) < MIN_BYTES or not enabled():
        return raw.read()
    parts = []
    with _bar(label, int(length), unit_bytes=True) as advance:
        while piece := raw.read(CHUNK):
            parts.append(piece)
            advance(len(piece))
    return b"".join(parts)


@contextlib.contextmanager
def waiting(label: str | None) -> Iterator[None]:
    """A wait that shows its time going once it has lasted `AFTER_S`."""
    if label is None or not enabled():
        yield
        return
    done = threading.Event()

    def show() -> None:
        if done.wait(AFTER_S):
            return
        with _bar(label, None, unit_bytes=False):
            done.wait()

    drawer = threading.Thread(target=show, name="isthmus-progress", daemon=True)
    drawer.start()
    try:
        yield
    finally:
        done.set()
        drawer.join()
