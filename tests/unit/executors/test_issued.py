"""What a host keeps of the computations it has issued (`executors.issued`), with stand-in
arrays that are computed when the test says so."""

import pytest

from executors.issued import Issued

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Array:
    def __init__(self, name: str, error: str | None = None) -> None:
        self.name, self.error, self.done, self.waited = name, error, False, 0

    def is_ready(self) -> bool:
        return self.done

    def block_until_ready(self) -> "Array":
        self.waited += 1
        self.done = True
        if self.error is not None:
            raise RuntimeError(self.error)
        return self


def test_a_chain_holds_only_its_newest_computation():
    issued = Issued(2, failed=lambda cause: None)
    v = Array("x")
    for i in range(100):
        out = Array(f"y{i}")
        issued.issue(f"f{i}", [v], [out])
        v = out
    assert len(issued) == 1 and issued.outputs() == [[v]]
    issued.drain()
    assert v.waited == 1 and len(issued) == 0


def test_independent_computations_wait_for_the_oldest_past_the_bound():
    issued = Issued(2, failed=lambda cause: None)
    outs = [Array(f"y{i}") for i in range(3)]
    for i, out in enumerate(outs):
        issued.issue(f"f{i}", [Array("input")], [out])
    assert [o.waited for o in outs] == [1, 0, 0]
    assert issued.outputs() == [[outs[1]], [outs[2]]]


def test_reading_one_output_of_several_stands_for_the_whole_computation():
    issued = Issued(8, failed=lambda cause: None)
    a, b = Array("a"), Array("b")
    issued.issue("two", [], [a, b])
    c = Array("c")
    issued.issue("reads b", [b], [c])
    assert issued.outputs() == [[c]]
    d = Array("d")
    issued.issue("reads a", [a], [d])  # its maker is already stood for: nothing to drop
    assert issued.outputs() == [[c], [d]]


def test_prune_drops_only_finished_computations_from_the_oldest():
    issued = Issued(8, failed=lambda cause: None)
    first, second = Array("first"), Array("second")
    issued.issue("first", [], [first])
    issued.issue("second", [], [second])
    second.done = True
    issued.prune()
    assert len(issued) == 2  # the oldest still runs
    assert issued.oldest_running()[0] == "first"
    first.done = True
    issued.prune()
    assert len(issued) == 0 and issued.oldest_running() is None


def test_a_failure_is_told_once_and_waiting_goes_on():
    told: list[str] = []
    issued = Issued(1, failed=told.append)
    bad, good = Array("bad", error="all-reduce failed"), Array("good")
    issued.issue("bad", [], [bad])
    issued.issue("good", [], [good])  # past the bound: waits for the failed one
    issued.drain()
    assert told == ["RuntimeError: all-reduce failed"] and good.waited == 1


def test_temporaries_in_flight_stay_within_the_budget():
    """Independent computations' temporaries add up: past the budget the oldest are waited
    for first. One alone is never held back (compiling refused it if it does not fit)."""
    issued = Issued(8, failed=lambda cause: None, temp_budget=100)
    outs = [Array(f"y{i}") for i in range(4)]
    for i, out in enumerate(outs[:3]):
        issued.make_room([], 40)
        issued.issue(f"f{i}", [Array("input")], [out], 40)
    assert [o.waited for o in outs] == [1, 0, 0, 0] and issued.temp == 80
    issued.make_room([], 100)
    assert [o.waited for o in outs] == [1, 1, 1, 0] and issued.temp == 0
    issued.issue("f3", [Array("input")], [outs[3]], 100)
    assert issued.temp == 100


def test_a_chain_counts_the_larger_temporaries_of_a_computation_and_what_it_read():
    """A reader runs after what it reads: their temporaries never overlap, so a chain of
    computations each near the budget runs ahead without waiting; two independent ones it
    reads may have run at once, so they count together."""
    issued = Issued(8, failed=lambda cause: None, temp_budget=100)
    v = Array("x")
    for i in range(10):
        issued.make_room([v], 90)
        out = Array(f"y{i}")
        issued.issue(f"f{i}", [v], [out], 90)
        v = out
    assert v.waited == 0 and issued.temp == 90 and len(issued) == 1
    issued.drain()
    a, b = Array("a"), Array("b")
    issued.issue("a", [], [a], 30)
    issued.issue("b", [], [b], 50)
    issued.make_room([a, b], 60)  # 80 (the two) with it: fits
    assert (a.waited, b.waited) == (0, 0)
    c = Array("c")
    issued.issue("c", [a, b], [c], 60)
    assert issued.temp == 80 and issued.outputs() == [[c]]


def test_no_budget_never_waits_for_temporaries():
    issued = Issued(8, failed=lambda cause: None)
    outs = [Array(f"y{i}") for i in range(3)]
    for i, out in enumerate(outs):
        issued.make_room([], 1 << 40)
        issued.issue(f"f{i}", [], [out], 1 << 40)
    assert [o.waited for o in outs] == [0, 0, 0]
