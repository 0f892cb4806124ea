"""The computations a host has issued to XLA and does not yet know to have finished.

Contract:
- `issue(label, inputs, outputs, temp)` records a computation the dispatch thread has just
  issued. Past `bound` recorded computations, it first waits for the oldest to finish.
- `make_room(inputs, temp)`, before issuing a computation that allocates `temp` bytes of
  temporaries (`executors.memory`), waits for the oldest until those recorded and it take
  at most `temp_budget` together (or none is left: one alone is checked when compiled).
- A computation that reads an output of a recorded one finishes after it (XLA starts it
  once its inputs are defined, and an error in an input reaches its outputs). So the
  reader's record stands for both (its temporaries, or those of what it read if larger:
  they do not run at once): the one it read is dropped, and its outputs are no
  longer held here. A chain thus holds only its newest computation, as `jax.jit` op by op
  holds only its newest array, and the memory of the values it has used up returns to
  XLA's allocator at once, to be reused while it is still in cache (holding the last 8
  outputs of a chain made each of its computations 3 to 7% slower on this machine). How
  far a chain runs ahead is then bounded by XLA itself (32 computations a device).
- Waiting never raises: a failure is told to `failed` and stays in the arrays, for
  whoever reads them. Everything but `oldest_running` is for the dispatch thread only.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(eq=False)
class _Record:
    label: str
    issued: float  # perf_counter
    outputs: Sequence[Any]
    temp: int = 0  # bytes of temporaries it allocates while it runs
    run: str = ""  # the run it is a step of


class Issued:
    def __init__(self, bound: int, failed: Callable[[str], None], temp_budget: int | None = None) -> None:
        self.bound = max(1, bound)
        self.temp_budget = temp_budget  # None: not bounded
        self.temp = 0  # bytes of temporaries of the recorded computations
        self._failed = failed
        self._records: deque[_Record] = deque()  # oldest first
        self._makers: dict[int, _Record] = {}  # id of a held output -> its record

    def __len__(self) -> int:
        return len(self._records)

    def make_room(self, inputs: Sequence[Any], temp: int) -> None:
        """Wait until a computation reading `inputs` and allocating `temp` bytes of
        temporaries fits the budget."""
        if self.temp_budget is not None and temp:
            while self._records and self._temp_with(inputs, temp) > self.temp_budget:
                self._finish_oldest()

    def _temp_with(self, inputs: Sequence[Any], temp: int) -> int:
        absorbed = sum(r.temp for r in self._read(inputs))
        return self.temp - absorbed + max(temp, absorbed)

    def _read(self, inputs: Sequence[Any]) -> list[_Record]:
        """The recorded computations whose outputs are among `inputs`, each once."""
        reads: list[_Record] = []
        for a in inputs:  # (a loop and a short list: it runs once per computation issued)
            r = self._makers.get(id(a))
            if r is not None and r not in reads:  # (records compare by identity)
                reads.append(r)
        return reads

    def issue(self, label: str, inputs: Sequence[Any], outputs: Sequence[Any], temp: int = 0,
              run: str = "") -> None:
        reads = self._read(inputs)  # this computation finishes after each of them
        for read in reads:
            self._records.remove(read)
            self._forget(read)
        # the temporaries of those it reads (which may run at once, before it), or its own
        record = _Record(label, time.perf_counter(), outputs,
                         max(temp, sum(r.temp for r in reads)) if reads else temp, run)
        self.temp += record.temp
        self._records.append(record)
        for array in outputs:
            self._makers[id(array)] = record
        while len(self._records) > self.bound:
            self._finish_oldest()

    def outputs(self) -> list[Sequence[Any]]:
        """The outputs of every recorded computation: once they are all computed, so is
        everything issued before them."""
        return [r.outputs for r in self._records]

    def prune(self) -> None:
        """Drop the oldest records whose computations have finished, without waiting."""
        while self._records and computed(self._records[0].outputs):
            self._finish_oldest()  # finished: returns at once (telling a failure, if any)

    def drain(self) -> None:
        """Wait until every issued computation has finished (failed ones included)."""
        while self._records:
            self._finish_oldest()

    def oldest_running(self) -> tuple[str, float, str] | None:
        """The label, issue time (perf_counter) and run of the oldest recorded computation
        still running, if any (from any thread: it only looks)."""
        for record in list(self._records):
            if not computed(record.outputs):
                return record.label, record.issued, record.run
        return None

    def _finish_oldest(self) -> None:
        record = self._records.popleft()
        self._forget(record)
        try:
            for array in record.outputs:
                array.block_until_ready()
        except Exception as e:  # the arrays carry the error to whoever reads them
            self._failed(f"{type(e).__name__}: {e}")

    def _forget(self, record: _Record) -> None:
        self.temp -= record.temp
        for array in record.outputs:
            if self._makers.get(id(array)) is record:
                del self._makers[id(array)]


def computed(arrays: Any) -> bool:
    """Every array has been computed (or has failed: an error counts as finished)."""
    import jax

    try:
        return all(a.is_ready() for a in jax.tree_util.tree_leaves(arrays) if hasattr(a, "is_ready"))
    except Exception:
        return True
