"""What is being traced in this context: a jitted function (`jitting`), or a program
(`tracing`). A leaf module: a buffer reads both to refuse what would not run as asked, a
`Function` sets the first and records itself into the second, and neither needs the
other's module for it.

Contract:
- `jitting(name)` marks `name` as the jitted function whose export is being traced here:
  a buffer it closes over cannot be read (its value is on the executors; it would be
  fetched and embedded), so reading one raises, naming the function.
- `tracing(trace)` makes `trace` the program trace of this context (`client.trace`):
  a `Function` called meanwhile becomes one node of it (`ProgramTrace.apply`) instead of
  a call. `current_trace()` is that trace, or None.
Both are context variables: another thread, or another task, sees its own.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any, Protocol, TypeVar

__all__ = ["ProgramTrace", "current_trace", "jitted_here", "jitting", "tracing"]


class ProgramTrace(Protocol):
    """What a traced program offers a function called inside it."""

    def apply(self, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], static: Any) -> Any:
        """Record a call of `fn` (a `client.jit.Function`) on these arguments; its results
        as traced values."""
        ...


T = TypeVar("T", bound=ProgramTrace)
_JITTED: contextvars.ContextVar[str | None] = contextvars.ContextVar("isthmus_jitting", default=None)
_PROGRAM: contextvars.ContextVar[ProgramTrace | None] = contextvars.ContextVar("isthmus_trace", default=None)


def jitted_here() -> str | None:
    """The name of the jitted function whose export is being traced here, if any."""
    return _JITTED.get()


@contextlib.contextmanager
def jitting(name: str) -> Iterator[None]:
    token = _JITTED.set(name)
    try:
        yield
    finally:
        _JITTED.reset(token)


def current_trace() -> ProgramTrace | None:
    """The program being traced here, if any."""
    return _PROGRAM.get()


@contextlib.contextmanager
def tracing(trace: T) -> Iterator[T]:
    token = _PROGRAM.set(trace)
    try:
        yield trace
    finally:
        _PROGRAM.reset(token)
