"""What the server knows of each client, buffer and computation: control metadata only.

Array data never lives here; it lives on the executors, keyed by the same ids.
"""

from __future__ import annotations

import re
import secrets
import time
from collections import Counter, OrderedDict
from collections.abc import Container, Sequence
from dataclasses import dataclass, field

from ir import Aval, Conflict, InvalidArgument, Spec
from server.states import PENDING, CompileStatus

# An id a client chooses for a buffer it is about to create (so it need not wait for the
# server's answer to name it): 8 to 64 characters, a letter or digit first, beginning with
# the client's own id and a dot (`chosen_prefix`).
CHOSEN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{7,63}")
FAILED_KEPT = 10_000  # per client: ids of outputs whose submission was refused, with why


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(6)}"


def chosen_prefix(client_id: str) -> str:
    """What every id a client chooses begins with. Ids are one namespace on the server (the
    executors key values by them), so an id chosen in a client's own part of it can collide
    only with that client's buffers: a refusal for an id in use never tells one tenant what
    another holds, and no tenant can take an id another will choose."""
    return f"{client_id}."


def output_ids(chosen: Sequence[str] | None, count: int, taken: Container[str], what: str,
               owner: str, freeing: Container[str] = ()) -> list[str]:
    """The ids of `count` new buffers of client `owner`: fresh ones, or the ones it chose,
    checked (the right number, well formed, in its own part of the namespace, distinct, not
    in use, and not released with work still queued on them: `freeing`)."""
    if chosen is None:
        return [new_id("b") for _ in range(count)]
    if len(chosen) != count:
        raise InvalidArgument(f"{what}: {len(chosen)} ids for {count} outputs")
    prefix = chosen_prefix(owner)
    for i, b in enumerate(chosen):
        if not isinstance(b, str) or not CHOSEN_ID.fullmatch(b):
            raise InvalidArgument(f"{what}[{i}]: expected 8 to 64 letters, digits or '_.:-' "
                                  f"(a letter or digit first), got {str(b)[:80]!r}")
        if not b.startswith(prefix):
            raise InvalidArgument(f"{what}[{i}]: an id a client chooses begins with its client id "
                                  f"and a dot, {prefix!r}; got {b!r}")
        if len(b) == len(prefix):
            raise InvalidArgument(f"{what}[{i}]: an id a client chooses has at least one character after "
                                  f"its client id and a dot, {prefix!r}; got {b!r}")
        if b in taken:
            raise Conflict(f"{what}[{i}]: buffer id {b!r} is already in use")
        if b in freeing:
            raise Conflict(f"{what}[{i}]: buffer id {b!r} was released and is freed after the work "
                           "queued on it: choose another id, or this one once that work has run")
    if len(set(chosen)) != len(chosen):
        raise InvalidArgument(f"{what}: ids repeat")
    return list(chosen)


@dataclass(eq=False)
class ClientRecord:
    id: str
    name: str
    weight: float = 1.0  # its share of an island under proportional-share scheduling
    key: bytes = field(default=b"", repr=False)  # its secret's digest (server.auth)
    last_seen: float = field(default_factory=time.monotonic)  # its lease runs from here
    in_flight: int = 0  # requests of it in progress (it never expires meanwhile)
    buffer_bytes: int = 0  # the bytes of its live buffers, against its quota
    buffers: set[str] = field(default_factory=set)
    computations: set[str] = field(default_factory=set)
    # what each of its registrations said (a digest) -> the computation or program made of
    # it, so that registering the same again (a function jitted anew in a loop) finds that one
    registered: dict[bytes, str] = field(default_factory=dict, repr=False)
    # computation or program id -> the registrations answered with it that the client has
    # not forgotten since (a session's functions, or several sessions on one secret)
    holds: Counter[str] = field(default_factory=Counter, repr=False)
    programs: set[str] = field(default_factory=set)
    # ids the client chose for outputs of a submission the server refused -> why; a later
    # submission reading one fails with that cause (bounded: the oldest go first)
    failed: OrderedDict[str, str] = field(default_factory=OrderedDict)

    # ids of its buffers freed with their slice -> the slice, so that a later use says so
    # (bounded as `failed`)
    freed_with: OrderedDict[str, str] = field(default_factory=OrderedDict)
    # computation or program id -> the bytes the state dir keeps of it (artifact, program)
    stored: dict[str, int] = field(default_factory=dict, repr=False)

    @property
    def stored_bytes(self) -> int:
        """What the state dir keeps for it, against its quota (`max_stored_mb`)."""
        return sum(self.stored.values())

    def hold(self, said: bytes, record_id: str) -> None:
        """A registration answered with `record_id` (made of what it said, or found by it)."""
        self.registered[said] = record_id
        self.holds[record_id] += 1

    def unregister(self, record_ids: Sequence[str]) -> None:
        """Computations or programs gone: registering the same again makes them anew."""
        gone = set(record_ids)
        self.registered = {k: r for k, r in self.registered.items() if r not in gone}
        for r in gone:
            self.holds.pop(r, None)

    def forgotten(self, ids: Sequence[str]) -> list[str]:
        """Registrations the client forgot (an id once per registration): the ids none
        holds any more."""
        gone = []
        for r in ids:
            self.holds[r] -= 1
            if self.holds[r] <= 0:
                del self.holds[r]
                gone.append(r)
        return gone

    def fail(self, ids: Sequence[str], cause: str) -> None:
        _remember(self.failed, ids, cause)

    def free_with(self, ids: Sequence[str], slice_id: str) -> None:
        _remember(self.freed_with, ids, slice_id)


def _remember(memory: OrderedDict[str, str], ids: Sequence[str], what: str) -> None:
    for b in ids:
        memory[b] = what
        memory.move_to_end(b)
    while len(memory) > FAILED_KEPT:
        memory.popitem(last=False)


@dataclass(frozen=True)
class BufferRecord:
    id: str
    owner: str
    slice_id: str
    hosts: tuple[str, ...]  # one, or every host of a slice spanning an island's hosts
    aval: Aval
    spec: Spec


@dataclass
class ComputationRecord:
    id: str
    owner: str
    slice_id: str
    name: str
    in_avals: tuple[Aval, ...]
    out_avals: tuple[Aval, ...]
    in_specs: tuple[Spec, ...]
    out_specs: tuple[Spec, ...]
    status: CompileStatus = PENDING  # its executable's compile status (`server.lowerings`)
    artifact: bytes = field(default=b"", repr=False)  # kept to compile again on restarted hosts
    compiles: int = 0  # compiles started for it: only the newest one's answer is its status
