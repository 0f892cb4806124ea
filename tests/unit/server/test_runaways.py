"""server.healing: which busy host is a runaway, from its stats alone (the restart that
follows is the healer's, tested end to end in tests/e2e). The healer's other components
are stand-ins: the island's queue (`others_wait`) and the runs with loops (`cancel_run`)."""

from types import SimpleNamespace

import pytest

from server.healing import STOP_GRACE_S, Healer

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

LIMIT_S = 100.0
HOLD_S = 30.0


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def healer(waiting: frozenset[tuple[str, str]] = frozenset(),
           looping: dict[str, str] | None = None) -> tuple[Healer, Clock]:
    """`waiting`: the (host, run) pairs behind which another client's work waits;
    `looping`: the runs with in-graph loops, each told why to end them once told."""
    clock = Clock()
    loops = {} if looping is None else looping

    def cancel_run(run: str, why: str) -> bool:
        if run not in loops:
            return False
        loops[run] = why
        return True

    unused = SimpleNamespace()  # what only a restart uses
    healer = Healer(
        settings=SimpleNamespace(max_run_s=LIMIT_S, max_hold_s=HOLD_S),
        rm=SimpleNamespace(host_island=lambda host: host[0]),
        pool=unused, restarting=unused, buffers=unused, lineage=unused, lowerings=unused,
        gangs=SimpleNamespace(others_wait=lambda island, host, run: (host, run) in waiting),
        loops=SimpleNamespace(cancel_run=cancel_run),
        clock=clock)
    return healer, clock


def test_a_host_busy_with_a_run_told_to_stop_is_a_runaway_only_past_the_grace():
    h, clock = healer()
    assert h.runaway("c-1/ab.3", 50.0) is None  # long, but nobody said stop
    h.stop(["c-1", "p-2"], "client k was closed")
    assert h.runaway("c-1/ab.3", 50.0) is None  # told just now: it may end by itself
    clock.now += STOP_GRACE_S + 1
    why = h.runaway("c-1/ab.3", 50.0)
    assert why is not None and why.startswith("a run was still running 10s after it was told to stop")
    assert "c-1" not in why and "client k" not in why  # said to other clients too: names neither
    assert h.runaway("c-1/ab.4", STOP_GRACE_S / 2) is None  # a new run of it, just started
    assert h.runaway("c-9/ab.3", 50.0) is None  # another client's
    assert h.runaway(None, None) is None and h.runaway("c-1/ab.3", None) is None  # not busy


def test_a_host_busy_with_any_run_past_the_limit_and_the_grace_is_a_runaway():
    h, _ = healer()
    assert h.runaway("p-7/ab.1", LIMIT_S + STOP_GRACE_S) is None
    why = h.runaway("p-7/ab.1", LIMIT_S + STOP_GRACE_S + 1)
    assert why is not None and "past max_run_s (100s)" in why


def test_a_host_held_past_max_hold_s_while_another_client_waits_is_a_runaway():
    h, _ = healer(waiting=frozenset({("a0", "c-1/ab.3")}))
    assert h.runaway("c-1/ab.3", HOLD_S, "a0") is None  # not past it yet
    assert h.runaway("c-1/ab.3", HOLD_S + 1, "a1") is None  # nobody waits on a1
    assert h.runaway("c-2/ab.3", HOLD_S + 1, "a0") is None  # nobody waits behind that run
    why = h.runaway("c-1/ab.3", HOLD_S + 1, "a0")
    assert why is not None and "past max_hold_s (30s)" in why and "c-1" not in why


def test_a_looping_run_holding_a_shared_host_is_told_to_end_its_loops_first():
    loops = {"p-3/ab.1": ""}
    h, clock = healer(waiting=frozenset({("a0", "p-3/ab.1")}), looping=loops)
    assert h.runaway("p-3/ab.1", HOLD_S + 1, "a0") is None  # its loops end at their next test
    assert "past max_hold_s" in loops["p-3/ab.1"]
    clock.now += STOP_GRACE_S
    assert h.runaway("p-3/ab.1", HOLD_S + 1 + STOP_GRACE_S, "a0") is None
    clock.now += 1  # still there past the grace: a computation inside it does not end
    why = h.runaway("p-3/ab.1", HOLD_S + 2 + STOP_GRACE_S, "a0")
    assert why is not None and "past max_hold_s" in why
