"""ProportionalShare under load: shares follow the weights (by count and by cost), idle
clients bank no credit, and the scheduler never idles with work queued."""

import random
from collections import Counter
from collections.abc import Callable

import pytest

from scheduler import GangScheduler, ProportionalShare, Submission

pytestmark = pytest.mark.unit

WEIGHTS = {"w1": 1.0, "w2": 2.0, "w4": 4.0, "w8": 8.0}


class Backlog:
    """Keeps each of its clients at `depth` queued submissions on `sched` and completes the
    oldest in-flight submission every step, as a busy island would."""

    def __init__(self, sched: GangScheduler, depth: int = 3) -> None:
        self.sched = sched
        self.depth = depth
        self.costs: dict[str, Callable[[], float]] = {}
        self.active: set[str] = set()
        self.count = 0
        self.log: list[Submission] = []

    def join(self, client: str, cost: Callable[[], float] = lambda: 1.0) -> None:
        self.costs[client] = cost
        self.active.add(client)
        for _ in range(self.depth):
            self.submit_one(client)

    def leave(self, client: str) -> None:
        """Stop submitting for `client`: its queue drains and it goes idle."""
        self.active.discard(client)

    def submit_one(self, client: str) -> None:
        self.sched.submit(Submission(f"{client}-{self.count}", client, ("h0", "h1"), self.costs[client]()))
        self.count += 1

    def step(self, n: int) -> list[Submission]:
        """Run until `n` more submissions are admitted; return them."""
        start = len(self.log)
        while len(self.log) - start < n:
            for a in self.sched.admit():
                self.log.append(a)
                if a.client in self.active:
                    self.submit_one(a.client)
            oldest = self.sched.in_flight[0]
            self.sched.done(oldest.id)
        del self.log[start + n:]  # the last batch may overshoot
        return self.log[start:]


def shares(admitted: list[Submission], by_cost: bool = False) -> dict[str, float]:
    got: Counter[str] = Counter()
    for a in admitted:
        got[a.client] += a.cost if by_cost else 1
    total = sum(got.values())
    return {c: v / total for c, v in got.items()}


def assert_shares(got: dict[str, float], weights: dict[str, float], rel: float = 0.05) -> None:
    total = sum(weights.values())
    for client, w in weights.items():
        want = w / total
        assert got.get(client, 0.0) == pytest.approx(want, rel=rel), (client, got, want)


@pytest.mark.parametrize("window", [1, 4, 16])
def test_backlogged_clients_share_by_weight(window: int) -> None:
    load = Backlog(GangScheduler("a", ProportionalShare(WEIGHTS), window), depth=window + 2)
    for client in WEIGHTS:
        load.join(client)
    admitted = load.step(3000)
    assert_shares(shares(admitted), WEIGHTS)
    # Not just on average: every stretch of 150 admissions is already close.
    for k in range(0, 3000, 150):
        assert_shares(shares(admitted[k:k + 150]), WEIGHTS, rel=0.1)
    assert len({a.id for a in admitted}) == 3000  # nothing admitted twice


def test_unequal_costs_share_cost_by_weight() -> None:
    rng = random.Random(7)
    # The lightest client sends the most expensive runs, and costs vary run to run.
    costs = {
        "w1": lambda: rng.uniform(4.0, 12.0),
        "w2": lambda: rng.choice([1.0, 2.0, 5.0]),
        "w4": lambda: 1.0,
        "w8": lambda: rng.uniform(0.2, 3.0),
    }
    load = Backlog(GangScheduler("a", ProportionalShare(WEIGHTS), window=4), depth=6)
    for client, cost in costs.items():
        load.join(client, cost)
    admitted = load.step(3000)
    assert_shares(shares(admitted, by_cost=True), WEIGHTS)
    counts = shares(admitted)
    assert counts["w1"] < counts["w4"] / 4  # by count, the expensive client runs far less


def test_default_weight_applies_to_unnamed_clients() -> None:
    load = Backlog(GangScheduler("a", ProportionalShare({"vip": 3.0}, default_weight=0.5), 2))
    for client in ("vip", "anon1", "anon2"):
        load.join(client)
    assert_shares(shares(load.step(1200)), {"vip": 3.0, "anon1": 0.5, "anon2": 0.5})


@pytest.mark.parametrize("returning_weight", [1.0, 8.0])
def test_idle_client_that_returns_gets_its_share_not_a_burst(returning_weight: float) -> None:
    weights = {"a": 1.0, "b": 2.0, "c": 4.0, "late": returning_weight}
    load = Backlog(GangScheduler("isl", ProportionalShare(weights), window=2))
    for client in ("a", "b", "c"):
        load.join(client)
    load.join("late")
    load.step(40)
    load.leave("late")  # the late client goes quiet for a long time...
    before = load.step(2000)
    assert "late" not in {a.client for a in before[100:]}
    assert "late" not in {q.client for q in load.sched.queued}
    load.join("late")  # ...and comes back with a backlog
    after = load.step(600)

    # It is served at once, at its share, not in a burst paid for by its idle time.
    total = sum(weights.values())
    first = [a.client for a in after].index("late")
    assert first <= 3  # at most one admission of each client it ties with
    for k in (30, 60, 600):
        got = sum(a.client == "late" for a in after[:k])
        assert got <= k * returning_weight / total + 2, (k, got)
    assert_shares(shares(after), weights, rel=0.05)
    # Nobody else starves meanwhile: each waits a bounded number of admissions (stride
    # scheduling's lag is under one stride per competing client).
    for client in ("a", "b", "c"):
        spots = [i for i, a in enumerate(after) if a.client == client]
        gaps = [j - i for i, j in zip([-1, *spots], spots, strict=False)]
        assert max(gaps) <= total / weights[client] + len(weights), (client, max(gaps))


def test_a_client_that_just_ran_is_not_forgiven_by_going_idle() -> None:
    # Closed loop: "x" submits its next expensive run only once the last one is admitted,
    # so it is idle (nothing queued) after every admission. Going idle must not wipe what
    # it just ran, or it would jump the queue each time and take most of the island.
    s = GangScheduler("a", ProportionalShare(), window=1)
    for k in range(1000):
        s.submit(Submission(f"y{k}", "y", ("h0",), cost=1.0))
    got: Counter[str] = Counter()
    for k in range(400):
        if not any(q.client == "x" for q in s.queued):
            s.submit(Submission(f"x{k}", "x", ("h0",), cost=10.0))
        [a] = s.admit()
        got[a.client] += a.cost
        s.done(a.id)
    assert got["x"] / (got["x"] + got["y"]) == pytest.approx(0.5, rel=0.05), got


def test_work_conserving_a_lone_client_fills_the_window() -> None:
    s = GangScheduler("a", ProportionalShare({"x": 1.0, "y": 100.0}), window=3)
    for k in range(5):
        s.submit(Submission(f"x{k}", "x", ("h0",)))
    assert [a.id for a in s.admit()] == ["x0", "x1", "x2"]
