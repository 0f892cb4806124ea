"""What a host's steps need of an executable, worked out once, and its arguments laid out
as it takes them. For the dispatch thread only.

Contract:
- `Signatures.of(key, exe)` is what a step needs of an executable each time it runs: its
  input shardings, whether it spans hosts (its shardings name devices of other processes:
  an island's JAX group), and the bytes of temporaries it allocates on this host
  (`executors.memory`). Worked out once per key, until `forget`.
- `laid_out(value, sharding)` is an argument as the executable takes it: a received array
  as it is (JAX places it as it calls), an array laid out as it takes it as it is, any
  other resharded. Whether an array is laid out so is asked once per pair of sharding
  objects (a chain's outputs share one object, its inputs another), as the comparison
  costs more than issuing a small computation's share of it; at most `FITTING_KEPT` pairs
  are remembered.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from executors.compile import HostArray
from executors.memory import working_bytes

FITTING_KEPT = 1024  # pairs of shardings known to fit each other, or not


@dataclass(frozen=True)
class Signature:
    in_shardings: tuple[Any, ...]
    spans_hosts: bool  # its shardings name devices of other processes (an island's JAX group)
    temp: int  # bytes of temporaries it allocates on this host while it runs (`executors.memory`)


class Signatures:
    def __init__(self) -> None:
        self._known: dict[str, Signature] = {}
        self._fitting: dict[tuple[int, int, int], tuple[Any, Any, bool]] = {}

    def of(self, key: str, exe: Any) -> Signature:
        known = self._known.get(key)
        if known is None:
            import jax

            shardings = exe.input_shardings[0]
            every = jax.tree_util.tree_leaves((exe.input_shardings, exe.output_shardings))
            known = self._known[key] = Signature(
                tuple(shardings), not all(s.is_fully_addressable for s in every), working_bytes(exe)[0])
        return known

    def forget(self, keys: Iterable[str]) -> None:
        for key in keys:
            self._known.pop(key, None)

    def laid_out(self, value: Any, sharding: Any) -> Any:
        if isinstance(value, HostArray):
            return value.array
        if self._fits(value, sharding):
            return value
        import jax

        return jax.device_put(value, sharding)

    def _fits(self, array: Any, sharding: Any) -> bool:
        if array.sharding is sharding:
            return True
        pair = (id(array.sharding), id(sharding), array.ndim)
        known = self._fitting.get(pair)
        if known is not None and known[0] is array.sharding and known[1] is sharding:
            return known[2]
        if len(self._fitting) >= FITTING_KEPT:
            self._fitting.clear()
        fits = bool(array.sharding.is_equivalent_to(sharding, array.ndim))
        self._fitting[pair] = (array.sharding, sharding, fits)  # (kept alive: ids stay theirs)
        return fits
