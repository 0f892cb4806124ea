"""A host's compiled executables: compiled once per key, waited for by the runs that need
them, forgotten when their computation is deleted.

Contract:
- `compile(key, ...)` compiles once per key (off the event loop) and answers None once the
  executable is ready, else the compiler's message. An executable whose temporaries exceed
  the host's budget fails to compile (`executors.memory`).
- `usable(key)` is the future of the executable a step runs: an unknown key is waited for
  (still compiling, or its request on its way), a forgotten one fails at once (a run queued
  before its computation was deleted).
- Compile requests are numbered by the server per host. `expect(key, number)` says one is on
  its way (the pool sends it over the fast channel ahead of the large request through Ray,
  which may come after runs sent later), so runs wait for it rather than fail as deleted.
  `forget({key: number})` drops executables, unless a compile request numbered above the
  one given has come since; a request numbered at or below a forget of its key arrives late
  for a deleted computation and is refused. At most `FORGOTTEN_KEPT` forgotten keys are
  remembered (oldest go first).
- `restart()` (a new server took the host over) forgets the numbers, keeping the executables.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Mapping
from concurrent.futures import Future
from typing import Any

from executors.compile import compile_artifact, make_mesh
from executors.memory import check, working_bytes
from executors.store import Failure
from ir import DeviceMesh, Spec

FORGOTTEN_KEPT = 65_536  # forgotten executable keys remembered (a late call on one fails at once)


class Executables:
    def __init__(self, host: str, temp_budget: int) -> None:
        self.host = host
        self.temp_budget = temp_budget
        self._executables: dict[str, Future[Any]] = {}
        self._building: set[str] = set()
        # Executables forgotten (their computations deleted), by key: the number of compile
        # requests for the key the server had sent when it asked. Bounded: oldest go first.
        self._forgotten: OrderedDict[str, int] = OrderedDict()
        self._compiles: dict[str, int] = {}  # key -> the latest compile request's number

    def __len__(self) -> int:
        return len(self._executables)

    def _future(self, key: str) -> Future[Any]:
        fut = self._executables.get(key)
        return fut if fut is not None else self._executables.setdefault(key, Future())

    def usable(self, key: str) -> Future[Any]:
        """The executable a step runs (see the module)."""
        if key in self._forgotten:
            raise Failure(f"executable {key} was deleted with its computation on host {self.host}")
        return self._future(key)

    def expect(self, key: str, number: int) -> bool:
        """A compile request numbered `number` for `key` is on its way. False, and nothing
        changes, for a request older than a forget of the key."""
        forgotten_at = self._forgotten.get(key)
        if forgotten_at is not None:
            if number <= forgotten_at:
                return False
            del self._forgotten[key]
        self._compiles[key] = max(number, self._compiles.get(key, 0))
        self._future(key)
        return True

    async def compile(self, key: str, artifact: bytes, mesh: DeviceMesh, in_specs: list[Any],
                      out_specs: list[Any], number: int = 0) -> str | None:
        """Compile once per key; None when ready, else the compiler's message."""
        if not self.expect(key, number):
            return f"executable {key} was deleted on host {self.host}"
        fut = self._future(key)
        if not fut.done() and key not in self._building:
            self._building.add(key)
            ins = [Spec.from_json(s) for s in in_specs]
            outs = [Spec.from_json(s) for s in out_specs]

            def build() -> None:
                try:
                    exe = compile_artifact(artifact, make_mesh(mesh), ins, outs)
                    check(*working_bytes(exe), self.temp_budget, self.host)
                    fut.set_result(exe)
                except Exception as e:  # the compiler's message is the user's answer
                    fut.set_exception(Failure(f"compiling failed: {type(e).__name__}: {e}"))

            await asyncio.to_thread(build)
        try:
            await asyncio.wrap_future(fut)
        except Failure as f:
            return f.cause
        return None

    def forget(self, executables: Mapping[str, int]) -> None:
        """Drop these executables (key -> the compile request number the server had sent),
        but those asked for again since."""
        for key, number in executables.items():
            if self._compiles.get(key, 0) > number:
                continue
            self._executables.pop(key, None)
            self._building.discard(key)
            self._compiles.pop(key, None)
            self._forgotten[key] = number
            while len(self._forgotten) > FORGOTTEN_KEPT:
                self._forgotten.popitem(last=False)

    def restart(self) -> None:
        self._forgotten.clear()
        self._compiles.clear()
