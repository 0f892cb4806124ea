"""The closed states the server reports: a computation's or program's compile status, and a
buffer's read state.

Contract:
- `CompileStatus` is `Pending`, `Ready` or `Failed(message, down)`: the newest compile's
  answer on a record's hosts (`server.lowerings`). `down` says it failed only because hosts
  were down (`server.program_record.refusal`). A record starts `PENDING`.
- `ReadState` is what reading a buffer finds: pending, ready or failed (`server.reads`).
- Each says itself on the wire as the REST API's strings (`wire`, `ReadState.value`); nothing
  else in the server compares or writes those strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Literal


@dataclass(frozen=True)
class Pending:
    """Not compiled yet."""


@dataclass(frozen=True)
class Ready:
    """Compiled on every host of the record."""


@dataclass(frozen=True)
class Failed:
    """A host's compiler refused it, or a host was down (`down`: only that)."""

    message: str
    down: bool = False


CompileStatus = Pending | Ready | Failed
PENDING, READY = Pending(), Ready()
Wire = Literal["pending", "ready", "failed"]


def wire(status: CompileStatus) -> tuple[Wire, str | None]:
    """The status and message the REST API shows."""
    match status:
        case Pending():
            return "pending", None
        case Ready():
            return "ready", None
        case Failed(message):
            return "failed", message


class ReadState(Enum):
    """A buffer's state as a read finds it (its `value` is what the REST API shows)."""

    _value_: Wire
    PENDING = "pending"  # its computation is queued, or has not finished on every host
    READY = "ready"  # every host holding it has it computed
    FAILED = "failed"  # its computation failed, or its value is lost
