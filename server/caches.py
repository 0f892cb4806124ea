"""What each host caches for the server's records, counted, so nothing unused stays there.

Hosts keep compiled executables (by key) and program plans (by key), shared between every
computation and program that names the same key on that host. Each record holds its keys
while it exists; when the last holder of a key on a host goes (its computation deleted,
its program forgotten or re-lowered, its client closed or expired), the host is told to
forget it. So a host's caches are bounded by what the live clients hold, and those by
their quotas (`server.quotas`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from ir import HostPlan

Forget = Callable[[str, Sequence[str], Sequence[str]], None]  # (host, executable keys, plan keys)
Pairs = Iterable[tuple[str, str]]  # (host, key)


class HostCaches:
    def __init__(self, forget: Forget) -> None:
        self._forget = forget
        self._executables: Counter[tuple[str, str]] = Counter()  # (host, key) -> holders
        self._plans: Counter[tuple[str, str]] = Counter()

    def hold(self, executables: Pairs = (), plans: Pairs = ()) -> None:
        self._executables.update(executables)
        self._plans.update(plans)

    def drop(self, executables: Pairs = (), plans: Pairs = ()) -> None:
        """Let go of these (host, key) pairs; tell each host what nobody holds any more."""
        unused: dict[str, tuple[list[str], list[str]]] = {}
        for counts, pairs, k in ((self._executables, executables, 0), (self._plans, plans, 1)):
            for host, key in pairs:
                counts[host, key] -= 1
                if counts[host, key] <= 0:
                    del counts[host, key]
                    unused.setdefault(host, ([], []))[k].append(key)
        for host, (keys, plan_keys) in unused.items():
            self._forget(host, keys, plan_keys)

    def held(self, host: str) -> tuple[int, int]:
        """(executables, plans) held on the host."""
        return (sum(h == host for h, _ in self._executables), sum(h == host for h, _ in self._plans))


def of_plans(plans: dict[str, HostPlan]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The (host, key) pairs a lowering's host plans use: executables, and the plans."""
    executables = [(h, job.key) for h, plan in plans.items() for job in plan.compiles]
    return executables, [(h, plan.key) for h, plan in plans.items()]
