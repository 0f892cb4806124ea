"""GangScheduler mechanics: FIFO order, the window, admission order, cancel, read-only
state, and bad input."""

import math

import pytest

from ir.errors import Conflict, InvalidArgument, NotFound
from scheduler import FifoPolicy, GangScheduler, Policy, ProportionalShare, Submission

pytestmark = pytest.mark.unit


def sub(sid: str, client: str = "c", hosts: tuple[str, ...] = ("a0",), cost: float = 1.0) -> Submission:
    return Submission(sid, client, hosts, cost)


def ids(subs: list[Submission] | tuple[Submission, ...]) -> list[str]:
    return [s.id for s in subs]


def test_fifo_admits_in_submission_order_across_clients() -> None:
    s = GangScheduler("a", FifoPolicy(), window=10)
    order = [("r0", "x"), ("r1", "y"), ("r2", "x"), ("r3", "z"), ("r4", "y")]
    for sid, client in order:
        s.submit(sub(sid, client))
    assert ids(s.admit()) == [sid for sid, _ in order]


def test_the_window_in_seconds_holds_a_backlog_of_long_submissions_to_a_few_in_flight() -> None:
    """A client's 0.5 s submissions: past two in flight, no more than the window's 0.8 s of
    them; another client's then waits behind a few of them, not behind a window of 256.
    Short ones fill the window as before."""
    s = GangScheduler("a", ProportionalShare(), window=256, window_s=0.8)
    for k in range(10):
        s.submit(Submission(f"long{k}", "greedy", ("a0",), seconds=0.5))
    assert ids(s.admit()) == ["long0", "long1"]  # two at once whatever they take
    mine = Submission("mine", "other", ("a0",), seconds=0.5)
    s.submit(mine)
    assert s.admit() == [] and not s.admits_at_once(mine)
    s.done("long0")
    assert ids(s.admit()) == ["long2"]  # (its turn: they are even, and greedy was first)
    s.done("long1")
    assert ids(s.admit()) == ["mine"]  # then the other client's, three places in, not 256
    short = GangScheduler("b", FifoPolicy(), window=256, window_s=0.8)
    for k in range(300):
        short.submit(Submission(f"short{k}", "c", ("b0",), seconds=0.001))
    assert len(short.admit()) == 256
    with pytest.raises(InvalidArgument, match="seconds: expected a finite number >= 0"):
        Submission("bad", "c", ("b0",), seconds=math.inf)


def test_a_backlog_on_one_host_keeps_no_other_host_of_the_island_waiting() -> None:
    """A client's long submissions fill host a1's window in seconds; another client's on a0
    is admitted at once, and one on both hosts waits for a1's room, then goes by its share
    (their clocks even, the older head first)."""
    s = GangScheduler("a", ProportionalShare(), window=256, window_s=0.8)
    for k in range(6):
        s.submit(Submission(f"long{k}", "greedy", ("a1",), seconds=9.0))
    assert ids(s.admit()) == ["long0", "long1"]
    idle = Submission("idle", "other", ("a0",), seconds=0.01)
    assert s.admits_at_once(idle) is False  # (work is queued: not surely at once)
    s.submit(idle)
    both = Submission("both", "other", ("a0", "a1"), seconds=0.01)
    s.submit(both)
    assert ids(s.admit()) == ["idle"]  # a0 has room; "both" waits for a1, and behind it its client
    s.done("idle")
    for finished, admitted in (("long0", "long2"), ("long1", "long3"), ("long2", "both"), ("long3", "long4")):
        s.done(finished)
        assert ids(s.admit()) == [admitted]
    lone = GangScheduler("b", FifoPolicy(), window=4)
    assert lone.admits_at_once(Submission("x", "c", ("b0",), seconds=1.0))


def test_window_bounds_in_flight_and_admission_goes_on_in_order() -> None:
    s = GangScheduler("a", FifoPolicy(), window=2)
    for k in range(5):
        s.submit(sub(f"r{k}"))
    assert ids(s.admit()) == ["r0", "r1"]
    assert s.admit() == []
    assert ids(s.in_flight) == ["r0", "r1"]
    assert ids(s.queued) == ["r2", "r3", "r4"]

    assert s.done("r1") == sub("r1")  # out-of-order completion frees a slot all the same
    assert ids(s.admit()) == ["r2"]
    assert ids(s.in_flight) == ["r0", "r2"]  # still in admission order
    s.done("r0")
    s.done("r2")
    assert ids(s.admit()) == ["r3", "r4"]
    assert s.admit() == []
    s.done("r3")
    s.done("r4")
    assert s.in_flight == () and s.queued == ()


def test_a_finished_id_may_come_back_and_is_admitted_anew() -> None:
    s = GangScheduler("a", FifoPolicy(), window=1)
    admitted = []
    for k in range(4):
        s.submit(sub(f"r{k}"))
        [a] = s.admit()
        admitted.append(a.id)
        assert s.done(a.id) is a
    assert admitted == ["r0", "r1", "r2", "r3"]
    # Ids are checked among live submissions only, so memory stays bounded by live work.
    again = sub("r0", "other", cost=2.0)
    s.submit(again)
    assert s.admit() == [again]
    assert s.done("r0") is again


def test_a_clients_own_submissions_keep_their_order_under_any_policy() -> None:
    s = GangScheduler("a", ProportionalShare({"x": 8.0, "y": 1.0}), window=100)
    for k in range(10):
        s.submit(sub(f"x{k}", "x", cost=1 + k % 3))
        s.submit(sub(f"y{k}", "y", cost=3 - k % 3))
    admitted = ids(s.admit())
    assert [i for i in admitted if i[0] == "x"] == [f"x{k}" for k in range(10)]
    assert [i for i in admitted if i[0] == "y"] == [f"y{k}" for k in range(10)]


def test_cancel_client_drops_only_its_queued_work() -> None:
    s = GangScheduler("a", FifoPolicy(), window=1)
    s.submit(sub("x0", "x"))
    s.submit(sub("y0", "y"))
    s.submit(sub("x1", "x"))
    s.submit(sub("x2", "x"))
    assert ids(s.admit()) == ["x0"]
    dropped = s.cancel_client("x")
    assert ids(dropped) == ["x1", "x2"]
    assert ids(s.queued) == ["y0"]
    assert s.cancel_client("x") == ()
    assert s.cancel_client("nobody") == ()
    # In-flight work runs on and still needs done.
    assert ids(s.in_flight) == ["x0"]
    s.done("x0")
    assert ids(s.admit()) == ["y0"]
    with pytest.raises(NotFound, match="'x1'"):
        s.done("x1")


def test_set_policy_applies_to_later_admissions() -> None:
    s = GangScheduler("a", FifoPolicy(), window=100)
    for k in range(4):
        s.submit(sub(f"x{k}", "x"))
    for k in range(4):
        s.submit(sub(f"y{k}", "y"))
    s.set_policy(ProportionalShare())
    assert ids(s.admit()) == ["x0", "y0", "x1", "y1", "x2", "y2", "x3", "y3"]
    assert isinstance(s.policy, ProportionalShare)


def test_policies_satisfy_the_protocol() -> None:
    assert isinstance(FifoPolicy(), Policy)
    assert isinstance(ProportionalShare({"x": 2}), Policy)
    assert FifoPolicy().stride(sub("r", cost=5)) == 0.0
    share = ProportionalShare({"x": 2}, default_weight=0.5)
    assert share.stride(sub("r", "x", cost=5)) == 2.5
    assert share.stride(sub("r", "other", cost=5)) == 10.0
    assert ProportionalShare({"x": 2}) == ProportionalShare({"x": 2.0})


# -- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize("weight", [0, -1, -0.5, math.nan, math.inf, True, "2", None])
def test_bad_weight_names_client_and_value(weight: object) -> None:
    with pytest.raises(InvalidArgument, match=rf"client 'bob'.*> 0, got {weight!r}"):
        ProportionalShare({"alice": 1.0, "bob": weight})  # type: ignore[dict-item]


@pytest.mark.parametrize("weight", [0, -2.0, math.nan])
def test_bad_default_weight(weight: float) -> None:
    with pytest.raises(InvalidArgument, match=rf"default_weight.*got {weight!r}"):
        ProportionalShare({}, default_weight=weight)


def test_bad_weights_mapping() -> None:
    with pytest.raises(InvalidArgument, match="mapping"):
        ProportionalShare([("a", 1.0)])  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="non-empty client names, got ''"):
        ProportionalShare({"": 1.0})


def test_unknown_done_id_is_not_found_and_named() -> None:
    s = GangScheduler("isl", FifoPolicy(), window=2)
    with pytest.raises(NotFound, match=r"island 'isl'.*'ghost'"):
        s.done("ghost")


def test_done_twice_is_an_error() -> None:
    s = GangScheduler("a", FifoPolicy(), window=2)
    s.submit(sub("r"))
    s.admit()
    s.done("r")
    with pytest.raises(NotFound, match=r"'r' is not in flight"):
        s.done("r")


def test_done_before_admission_is_a_conflict() -> None:
    s = GangScheduler("a", FifoPolicy(), window=1)
    s.submit(sub("r0"))
    s.submit(sub("r1"))
    s.admit()
    with pytest.raises(Conflict, match="'r1' is queued, not admitted"):
        s.done("r1")


def test_duplicate_submission_id_is_a_conflict() -> None:
    s = GangScheduler("a", FifoPolicy(), window=1)
    s.submit(sub("r0", "x"))
    s.submit(sub("r1", "x"))
    with pytest.raises(Conflict, match="'r1' is already queued"):
        s.submit(sub("r1", "y"))
    s.admit()
    with pytest.raises(Conflict, match="'r0' is already in flight"):
        s.submit(sub("r0", "y"))
    assert ids(s.queued) == ["r1"]  # the refused submissions left no trace


@pytest.mark.parametrize("window", [0, -1, 1.5, True, None])
def test_bad_window(window: object) -> None:
    with pytest.raises(InvalidArgument, match=rf"window: expected an int >= 1, got {window!r}"):
        GangScheduler("a", FifoPolicy(), window=window)  # type: ignore[arg-type]


def test_bad_scheduler_arguments() -> None:
    with pytest.raises(InvalidArgument, match="island: expected a non-empty string"):
        GangScheduler("", FifoPolicy(), window=1)
    with pytest.raises(InvalidArgument, match="policy: expected a Policy"):
        GangScheduler("a", "fifo", window=1)  # type: ignore[arg-type]
    s = GangScheduler("a", FifoPolicy(), window=1)
    with pytest.raises(InvalidArgument, match="expected a Submission"):
        s.submit(("r", "c", ("a0",)))  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="policy: expected a Policy"):
        s.set_policy(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"id": ""}, "id: expected a non-empty string"),
        ({"client": 3}, "client: expected a non-empty string"),
        ({"hosts": ()}, "hosts: expected a non-empty tuple"),
        ({"hosts": ["a0"]}, "hosts: expected a non-empty tuple"),
        ({"hosts": ("a0", "a0")}, "distinct host names"),
        ({"hosts": ("a0", "")}, "distinct host names"),
        ({"cost": 0}, "cost: expected a finite number > 0, got 0"),
        ({"cost": -1.0}, "cost: expected a finite number > 0, got -1.0"),
        ({"cost": math.inf}, "cost: expected a finite number > 0, got inf"),
        ({"cost": False}, "cost: expected a finite number > 0, got False"),
    ],
)
def test_bad_submission(kwargs: dict[str, object], message: str) -> None:
    fields: dict[str, object] = {"id": "r", "client": "c", "hosts": ("a0",), "cost": 1.0} | kwargs
    with pytest.raises(InvalidArgument, match=message):
        Submission(**fields)  # type: ignore[arg-type]

