"""Properties of GangScheduler under random interleavings of submit / admit / done / cancel,
for both policies: one island order that every host's order is a restriction of, unique
increasing positions, nothing admitted twice or lost, the window held, each client's own
order kept, and the scheduler never idle with room and work."""

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ir.errors import Conflict
from scheduler import (
    Admitted,
    FifoPolicy,
    GangScheduler,
    Policy,
    ProportionalShare,
    Submission,
    host_orders,
)

pytestmark = pytest.mark.unit

CLIENTS = ["c0", "c1", "c2", "c3"]
HOSTS = ["h0", "h1", "h2", "h3"]

policies = st.one_of(
    st.just(FifoPolicy()),
    st.builds(
        ProportionalShare,
        st.dictionaries(st.sampled_from(CLIENTS), st.floats(0.1, 10.0)),
        st.floats(0.1, 10.0),
    ),
)
ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("submit"),
            st.sampled_from(CLIENTS),
            st.lists(st.sampled_from(HOSTS), min_size=1, max_size=len(HOSTS), unique=True),
            st.sampled_from([0.5, 1.0, 1.0, 3.0, 7.25]),
        ),
        st.tuples(st.just("admit")),
        st.tuples(st.just("done"), st.integers(0, 10)),
        st.tuples(st.just("cancel"), st.sampled_from(CLIENTS)),
        st.tuples(st.just("duplicate"), st.integers(0, 10)),
    ),
    max_size=80,
)


def is_subsequence(part: Sequence[str], whole: Sequence[str]) -> bool:
    it = iter(whole)
    return all(x in it for x in part)


@settings(max_examples=300, deadline=None, database=None)
@given(policies, st.integers(1, 5), ops)
def test_one_island_order_under_any_interleaving(policy: Policy, window: int, script: list) -> None:
    s = GangScheduler("isl", policy, window)
    submitted: list[Submission] = []
    cancelled: set[str] = set()
    order: list[Admitted] = []  # as admit() handed them out
    seen: dict[str, list[str]] = {h: [] for h in HOSTS}  # what each host was sent, in turn

    def admit() -> None:
        batch = s.admit()
        for a in batch:
            assert a.position == len(order)  # unique, consecutive, never reused
            order.append(a)
        for host, sub_ids in host_orders(batch).items():
            seen[host].extend(sub_ids)
        assert len(s.in_flight) <= window
        # Work conserving: it stops only when the window is full or nothing is queued.
        assert len(s.in_flight) == window or not s.queued

    for op in script:
        match op:
            case ("submit", client, hosts, cost):
                sub = Submission(f"s{len(submitted)}", client, tuple(hosts), cost)
                s.submit(sub)
                submitted.append(sub)
            case ("admit",):
                admit()
            case ("done", k):
                if s.in_flight:
                    s.done(s.in_flight[k % len(s.in_flight)].submission.id)
            case ("cancel", client):
                before = {q.id for q in s.queued if q.client == client}
                dropped = s.cancel_client(client)
                assert {d.id for d in dropped} == before
                cancelled |= before
            case ("duplicate", k):
                live = [*s.queued, *(a.submission for a in s.in_flight)]
                if live:
                    with pytest.raises(Conflict):
                        s.submit(live[k % len(live)])
        assert len(s.in_flight) <= window
    while s.queued or s.in_flight:  # drain
        for a in s.in_flight:
            s.done(a.submission.id)
        admit()

    island = [a.submission.id for a in order]
    # Nothing admitted twice; nothing lost; nothing cancelled admitted.
    assert len(island) == len(set(island))
    assert set(island) == {sub.id for sub in submitted} - cancelled
    # Every host's order is the island order restricted to it, so any two hosts agree on
    # the relative order of the computations they share.
    for host, got in seen.items():
        assert got == [a.submission.id for a in order if host in a.submission.hosts]
        assert is_subsequence(got, island)
    assert {h: got for h, got in seen.items() if got} == host_orders(order)
    for h1 in HOSTS:
        for h2 in HOSTS:
            common = set(seen[h1]) & set(seen[h2])
            assert [i for i in seen[h1] if i in common] == [i for i in seen[h2] if i in common]
    # Each client's own submissions keep their order; FIFO keeps everyone's.
    remaining = [sub.id for sub in submitted if sub.id not in cancelled]
    for client in CLIENTS:
        mine = {sub.id for sub in submitted if sub.client == client}
        assert [i for i in island if i in mine] == [i for i in remaining if i in mine]
    if isinstance(policy, FifoPolicy):
        assert island == remaining
