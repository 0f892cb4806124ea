"""server.healing: which busy host is a runaway, from its stats alone (the restart that
follows is the healer's, tested end to end in tests/e2e)."""

from types import SimpleNamespace

import pytest

from server.healing import STOP_GRACE_S, Healer

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

LIMIT_S = 100.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def healer() -> tuple[Healer, Clock]:
    clock = Clock()
    service = SimpleNamespace(settings=SimpleNamespace(max_run_s=LIMIT_S))
    return Healer(service, clock), clock  # type: ignore[arg-type]


def busy(run: str | None, seconds: float | None) -> dict:
    return {"longest_run": run, "longest_run_s": seconds}


def test_a_host_busy_with_a_run_told_to_stop_is_a_runaway_only_past_the_grace():
    h, clock = healer()
    assert h.runaway(busy("c-1/ab.3", 50.0)) is None  # long, but nobody said stop
    h.stop(["c-1", "p-2"], "client k was closed")
    assert h.runaway(busy("c-1/ab.3", 50.0)) is None  # told just now: it may end by itself
    clock.now += STOP_GRACE_S + 1
    why = h.runaway(busy("c-1/ab.3", 50.0))
    assert why is not None and why.startswith("a run was still running 10s after it was told to stop")
    assert "c-1" not in why and "client k" not in why  # said to other clients too: names neither
    assert h.runaway(busy("c-1/ab.4", STOP_GRACE_S / 2)) is None  # a new run of it, just started
    assert h.runaway(busy("c-9/ab.3", 50.0)) is None  # another client's
    assert h.runaway(busy(None, None)) is None and h.runaway({}) is None


def test_a_host_busy_with_any_run_past_the_limit_and_the_grace_is_a_runaway():
    h, _ = healer()
    assert h.runaway(busy("p-7/ab.1", LIMIT_S + STOP_GRACE_S)) is None
    why = h.runaway(busy("p-7/ab.1", LIMIT_S + STOP_GRACE_S + 1))
    assert why is not None and "past max_run_s (100s)" in why
