"""Deletes coalesced per host and turn (`executors.deletes`), with a fake send: one request
per host a turn, a long queue leaving at once, a request naming a queued id never
overtaking its delete, and the queues of replaced hosts dropped."""

import pytest

from executors.deletes import Deletes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Fake:
    def __init__(self, eager: int = 100) -> None:
        self.sent: list[tuple[str, list[str]]] = []
        self.scheduled = 0
        self.deletes = Deletes(lambda host, ids: self.sent.append((host, ids)), self.schedule, eager)

    def schedule(self) -> None:
        self.scheduled += 1


def test_the_ids_of_a_turn_leave_in_one_request_per_host() -> None:
    f = Fake()
    f.deletes.add("h0", ["a"])
    f.deletes.add("h1", ["b"])
    f.deletes.add("h0", ["c", "a"])
    assert f.sent == [] and f.scheduled == 1  # one flush arranged for the turn's end
    f.deletes.flush()
    assert f.sent == [("h0", ["a", "c"]), ("h1", ["b"])]
    f.deletes.add("h0", ["d"])
    assert f.scheduled == 2  # the next turn arranges its own


def test_a_long_queue_leaves_at_once() -> None:
    f = Fake(eager=3)
    f.deletes.add("h0", ["a", "b"])
    f.deletes.add("h0", ["c"])
    assert f.sent == [("h0", ["a", "b", "c"])]
    f.deletes.flush()
    assert f.sent == [("h0", ["a", "b", "c"])]  # nothing left to send


def test_a_request_naming_a_queued_id_sends_the_queue_first() -> None:
    f = Fake()
    f.deletes.add("h0", ["a", "b"])
    f.deletes.before_use("h1", ["a"])  # another host: its queue is empty
    f.deletes.before_use("h0", ["x"])  # no queued id
    assert f.sent == []
    f.deletes.before_use("h0", ["x", "b"])
    assert f.sent == [("h0", ["a", "b"])]


def test_a_replaced_hosts_queue_is_dropped() -> None:
    f = Fake()
    f.deletes.add("h0", ["a"])
    f.deletes.add("h1", ["b"])
    f.deletes.drop(["h0"])
    f.deletes.flush()
    assert f.sent == [("h1", ["b"])]
