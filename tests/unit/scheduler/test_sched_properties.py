"""Properties of GangScheduler under random interleavings of submit / admit / done / cancel,
for both policies: nothing admitted twice or lost, nothing cancelled admitted, `in_flight`
in admission order, the window held, each client's own order kept (FIFO: everyone's), and
the scheduler never idle with room and work."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ir.errors import Conflict
from scheduler import FifoPolicy, GangScheduler, Policy, ProportionalShare, Submission

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


@settings(max_examples=300, deadline=None, database=None)
@given(policies, st.integers(1, 5), ops)
def test_admission_under_any_interleaving(policy: Policy, window: int, script: list) -> None:
    s = GangScheduler("isl", policy, window)
    submitted: list[Submission] = []
    cancelled: set[str] = set()
    order: list[str] = []  # ids as admit() handed them out, over all calls
    live: list[str] = []  # ids admitted and not yet done, in admission order

    def admit() -> None:
        batch = s.admit()
        order.extend(a.id for a in batch)
        live.extend(a.id for a in batch)
        assert [a.id for a in s.in_flight] == live
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
                    sub_id = s.in_flight[k % len(s.in_flight)].id
                    assert s.done(sub_id).id == sub_id
                    live.remove(sub_id)
            case ("cancel", client):
                before = {q.id for q in s.queued if q.client == client}
                dropped = s.cancel_client(client)
                assert {d.id for d in dropped} == before
                cancelled |= before
            case ("duplicate", k):
                pending = [*s.queued, *s.in_flight]
                if pending:
                    with pytest.raises(Conflict):
                        s.submit(pending[k % len(pending)])
        assert len(s.in_flight) <= window
    while s.queued or s.in_flight:  # drain
        for a in s.in_flight:
            s.done(a.id)
        live.clear()
        admit()

    # Nothing admitted twice; nothing lost; nothing cancelled admitted.
    assert len(order) == len(set(order))
    assert set(order) == {sub.id for sub in submitted} - cancelled
    # Each client's own submissions keep their order; FIFO keeps everyone's.
    remaining = [sub.id for sub in submitted if sub.id not in cancelled]
    for client in CLIENTS:
        mine = {sub.id for sub in submitted if sub.client == client}
        assert [i for i in order if i in mine] == [i for i in remaining if i in mine]
    if isinstance(policy, FifoPolicy):
        assert order == remaining
