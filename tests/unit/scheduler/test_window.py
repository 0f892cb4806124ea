"""Durations: what a submission is expected to take, from the times passed in; and whether
another client's work waits behind a run on a host (`GangScheduler.others_behind`)."""

import pytest

from scheduler import Durations, FifoPolicy, GangScheduler, Submission

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def test_a_kind_not_seen_yet_is_expected_to_take_the_whole_window_at_most_an_hour() -> None:
    assert Durations(window_s=2.0).expected("p-1") == 2.0
    assert Durations().expected("p-1") == 3600.0


def test_a_kind_takes_what_its_last_one_took_at_the_head_of_its_island() -> None:
    d = Durations(window_s=10.0)
    d.finished("a", "p-1", admitted=100.0, now=103.0)
    assert d.expected("p-1") == 3.0
    # Admitted before the previous one ended: counted from that end, not from its admission.
    d.finished("a", "p-2", admitted=101.0, now=104.5)
    assert d.expected("p-2") == 1.5
    d.finished("b", "p-3", admitted=101.0, now=102.0)  # another island's head is its own
    assert d.expected("p-3") == 1.0
    d.finished("a", "", admitted=104.5, now=110.0)  # untimed: only the island's end moves
    d.finished("a", "p-1", admitted=109.0, now=111.0)
    assert d.expected("p-1") == 1.0


def test_only_the_newest_kinds_are_remembered() -> None:
    d = Durations(window_s=5.0, kept=2)
    for k, kind in enumerate(["p-1", "p-2", "p-3"]):
        d.finished("a", kind, admitted=float(k), now=k + 1.0)
    assert d.expected("p-1") == 5.0 and d.expected("p-2") == d.expected("p-3") == 1.0


def test_another_client_s_work_behind_a_run_on_its_host_is_seen() -> None:
    s = GangScheduler("a", FifoPolicy(), window=1)
    s.submit(Submission("mine", "c", ("a0", "a1")))
    s.submit(Submission("theirs", "d", ("a1",)))
    s.submit(Submission("again", "c", ("a0",)))
    s.admit()
    assert s.others_behind("a1", "mine")  # d's work waits for a1
    assert not s.others_behind("a0", "mine")  # only c's own waits for a0
    assert not s.others_behind("a1", "theirs")  # not in flight
    assert not s.others_behind("a2", "mine")  # not on that host
