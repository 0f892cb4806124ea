"""Donated arguments of a jitted function, as `jax.jit`'s `donate_argnums` / `donate_argnames`.

In JAX a donated argument's memory may be reused for the results, and the caller must not
use the argument again. Here the buffers of a donated argument are the call's once it is
queued: they travel with it, the server frees them after it if it accepts it (the
executors free each value once the call has read it), and using a donated `Buffer` again
raises `NotFound` (JAX raises for a deleted array). A call the server refuses (a quota,
the host's memory, a host down) or that never reached it leaves them: they are usable
again once that is known. What
donating saves is the value's lifetime (a training step's old parameters are freed by the
step, not when Python drops them); the executors do not alias the donated memory into the
results, as an exported artifact carries no donation. An
argument that is no `Buffer` (a numpy array, a Python scalar) is uploaded for the call
alone and released after it anyway. Numbers and names follow `jax.jit`: positions count
every positional argument, static ones included, and a static argument cannot be donated;
a donated buffer passed twice in one call is refused, as `jax.jit` refuses it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import jax

from client.buffer import Buffer
from client.statics import Statics, numbered
from ir import InvalidArgument


@dataclass(frozen=True)
class Donated:
    argnums: tuple[int, ...] = ()
    argnames: tuple[str, ...] = ()

    @classmethod
    def of(cls, fn: Callable[..., Any], argnums: int | Iterable[int] | None,
           argnames: str | Iterable[str] | None, statics: Statics) -> Donated:
        nums, names = numbered(fn, argnums, argnames, "donate")
        static = [*sorted(set(names) & set(statics.argnames)), *sorted(set(nums) & set(statics.argnums))]
        if static:
            raise InvalidArgument(f"donate_argnums / donate_argnames: argument {static[0]!r} is static; "
                                  "only array arguments can be donated")
        return cls(nums, names)

    def buffers(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Buffer]:
        """The buffers among the donated arguments (all the positional and keyword ones,
        before the static ones are taken out)."""
        if not self.argnums and not self.argnames:
            return []
        at = {i if i >= 0 else len(args) + i for i in self.argnums}
        chosen = [a for i, a in enumerate(args) if i in at]
        chosen += [v for k, v in kwargs.items() if k in self.argnames]
        donated = [x for x in jax.tree_util.tree_leaves(chosen) if isinstance(x, Buffer)]
        if donated:
            passed = jax.tree_util.tree_leaves((args, kwargs))
            _unshared(donated, [x for x in passed if isinstance(x, Buffer)])
        return donated


def _unshared(donated: list[Buffer], passed: list[Buffer]) -> None:
    """A donated buffer is passed once in the call, as `jax.jit` requires of a donated array
    (its memory is the call's, so no other argument may read it)."""
    uses = Counter(x.id for x in passed)  # (not a scan per donated leaf: states have thousands)
    for b in donated:
        if uses[b.id] > 1:
            raise InvalidArgument(f"donate_argnums / donate_argnames: buffer {b.id} is donated and passed "
                                  "more than once in the same call (as jax.jit, this refuses it): pass "
                                  "a copy for the other use, or do not donate it")
