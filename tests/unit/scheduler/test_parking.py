"""Parking: which buffers queued, parked and admitted work touches, who must park, and which
waiting actions are due. Pure: no event loop; the actions handed back are run by hand."""

import pytest

from scheduler import Parking

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def test_a_buffer_named_twice_is_touched_until_released_twice() -> None:
    p = Parking(["a"])
    p.hold("a", ["x", "x", "y"])
    p.release("a", ["x", "y"])
    assert p.touched("x") and not p.touched("y")
    p.release("a", ["x"])
    assert not p.touched("x")


def test_besides_an_island_only_other_islands_queued_work_counts() -> None:
    p = Parking(["a", "b"])
    p.hold("a", ["x"])
    assert not p.touched("x", besides="a") and p.touched("x", besides="b")
    assert p.must_park("a", ["x", "z"]) == [] and p.must_park("b", ["x", "z"]) == ["x"]


def test_a_parked_submission_waits_for_other_islands_and_for_those_parked_before_it() -> None:
    p = Parking(["a", "b"])
    p.hold("a", ["y"])  # a producer queued on island a
    first = p.next_seq()
    assert p.must_park("b", ["y"]) == ["y"]
    p.park(first, ["y", "z"])
    later = p.next_seq()
    assert later > first and p.must_park("a", ["z"]) == ["z"]  # parked work touches z
    p.park(later, ["z"])
    assert p.blocked("b", ["y"], first) and p.blocked("a", ["z"], later)
    p.release("a", ["y"])  # the producer is admitted
    assert not p.blocked("b", ["y"], first)  # a later parked one does not hold an earlier one
    assert p.blocked("a", ["z"], later)  # an earlier parked one holds a later one
    p.unpark(first, ["y", "z"])
    assert not p.blocked("a", ["z"], later)
    assert p.touched("z")  # still parked as `later`: reads and deletes wait for it


def test_a_watch_acts_at_once_on_free_buffers_and_once_every_buffer_was_free_since() -> None:
    p, done = Parking(["a"]), []
    assert p.watch(["x"], lambda: done.append("now"), reads=False)  # nothing touches x: at once
    assert done == []  # (the caller acts)
    p.hold("a", ["x", "y"])
    assert not p.watch(["x", "y"], lambda: done.append("both"), reads=False)
    for act in p.release("a", ["x"]):
        act()
    assert done == []  # y is still touched
    due = p.release("a", ["y"])
    assert len(due) == 1
    due[0]()
    assert done == ["both"]
    assert p.look(["x", "y"]) == []  # a watch acts once


def test_a_watch_on_reads_waits_for_admitted_readers_too() -> None:
    p, done = Parking(["a"]), []
    p.read(["x", "x"])  # two admitted submissions read x
    assert p.watch(["x"], lambda: done.append("later"), reads=False)  # reads do not count for it
    assert not p.watch(["x"], lambda: done.append("after reads"), reads=True)
    assert p.unread(["x"]) == []  # one reader left
    [act] = p.unread(["x"])
    act()
    assert done == ["after reads"]


def test_islands_that_join_are_counted_like_the_first() -> None:
    p = Parking()
    p.add_island("c")
    p.hold("c", ["x"])
    assert p.touched("x") and p.must_park("c", ["x"]) == []
