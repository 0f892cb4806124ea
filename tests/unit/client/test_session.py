"""The session's queue without a server: what travels in which batch, in what order, and
where a refusal or a lost connection lands. The transport is a fake that answers batches as
the server's contract says (the one place a fake stands in: the logic here is pure)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from fake_server import OUT, SHOWN, FakeServer, quiet_session

from client.session import MAX_BATCH, MAX_BATCH_IDS, Session
from client.transport import OverQuota, Unsent
from ir import Conflict, RemoteError, Spec, Unavailable
from server.records import CHOSEN_ID, chosen_prefix

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

def test_calls_issued_back_to_back_travel_in_one_batch_in_order():
    server = FakeServer()
    s = quiet_session(server)
    x = s.put(np.zeros(4, np.float32), "s-1", Spec(()))
    ys = [x]
    for _ in range(5):
        ys += s.call("c-inc", [ys[-1].id], OUT)
    assert server.requests == []  # nothing waited for the server
    s.wait(ys[-1])
    [batch] = server.batches()
    assert [op["op"] for op in batch["ops"]] == ["put"] + ["call"] * 5
    assert batch["ops"][0]["id"] == x.id
    assert [op["inputs"] for op in batch["ops"][1:]] == [[b.id] for b in ys[:-1]]
    assert [op["ids"] for op in batch["ops"][1:]] == [[b.id] for b in ys[1:]]
    assert batch["wait"] == ys[-1].id  # the wait rode on the batch: one request in all
    assert len(server.requests) == 1


def test_ids_are_random_distinct_and_well_formed():
    s = Session(FakeServer(), "cl-0123456789ab", background=False)  # type: ignore[arg-type]
    ids = [b.id for _ in range(1000) for b in s.call("c-inc", [], OUT)]
    assert len(set(ids)) == 1000
    assert all(CHOSEN_ID.fullmatch(i) and i.startswith(chosen_prefix("cl-0123456789ab")) for i in ids)


def test_a_release_rides_after_every_call_that_read_the_buffer_and_wakes_nothing():
    server = FakeServer()
    s = quiet_session(server)
    [x] = s.call("c-inc", [], OUT)
    [y] = s.call("c-inc", [x.id], OUT)
    x_id = x.id
    del x
    gc.collect()
    [z] = s.call("c-inc", [y.id], OUT)
    s.flush()
    ops = server.batches()[0]["ops"]
    assert [op["op"] for op in ops] == ["call", "call", "release", "call"]
    assert ops[2]["ids"] == [x_id]
    del y, z  # two drops in a row: one release op, sent with the next request
    gc.collect()
    s.flush()
    assert [op["op"] for op in server.batches()[1]["ops"]] == ["release"]
    assert len(server.batches()[1]["ops"][0]["ids"]) == 2


def test_an_output_dropped_while_its_call_is_queued_is_released_after_it():
    server = FakeServer()
    s = quiet_session(server)
    s.call("c-inc", [], OUT)  # the result is dropped at once
    gc.collect()
    s.flush()
    ops = server.batches()[0]["ops"]
    assert [op["op"] for op in ops] == ["call", "release"] and ops[1]["ids"] == ops[0]["ids"]


def test_a_refused_call_fails_its_future_and_dependents_while_independents_go_on():
    server = FakeServer()
    s = quiet_session(server)
    [ok1] = s.call("c-inc", [], OUT)
    [bad] = s.call("c-broken", [ok1.id], OUT)
    [dep] = s.call("c-inc", [bad.id], OUT)
    [dep2] = s.call("c-inc", [dep.id], OUT)
    [ok2] = s.call("c-inc", [ok1.id], OUT)
    s.wait(ok2)  # no error: independents are untouched
    with pytest.raises(Conflict, match="c-broken failed to compile: no kernel"):
        s.wait(bad)
    for d in (dep, dep2):
        with pytest.raises(RemoteError, match=r"never made: .*no kernel"):
            s.wait(d)
    with pytest.raises(Conflict):
        s.fetch(bad)
    assert s.ready(bad)  # failed counts as settled
    s.wait(ok1)
    assert ok1.error is None and ok2.error is None


def test_the_refusal_keeps_its_kind():
    s = quiet_session(FakeServer())
    [y] = s.call("c-greedy", [], OUT)
    with pytest.raises(OverQuota, match="buffer bytes"):
        s.wait(y)


def test_a_lost_connection_fails_the_batch_and_the_next_blocking_call_once():
    server = FakeServer()
    s = Session(server, "cl-1")  # type: ignore[arg-type]  # its sender sends in the background
    try:
        server.down = True
        [y] = s.call("c-inc", [], OUT)
        assert server.sent.wait(10)  # the sender tried (and holds the batch until it is done)
        server.down = False
        with pytest.raises(Unavailable):  # the next blocking call, whatever it is about
            s.json("GET", "/v1/buffers")
        assert isinstance(y.error, Unavailable)
        assert s.json("GET", "/v1/buffers")["path"] == "/v1/buffers"  # once only
        with pytest.raises(Unavailable):
            y.result()
    finally:
        s.close()


def test_a_lost_connection_in_the_foreground_raises_there_and_fails_the_futures():
    server = FakeServer()
    s = quiet_session(server)
    [y] = s.call("c-inc", [], OUT)
    [z] = s.call("c-inc", [y.id], OUT)
    server.down = True
    with pytest.raises(Unavailable):
        s.wait(z)
    assert isinstance(y.error, Unavailable) and isinstance(z.error, Unavailable)
    server.down = False
    s.flush()  # nothing deferred: the error was raised where it happened


@pytest.mark.parametrize(("answer", "theirs_again"), [
    ("refused 503", True),  # the server answered: it took nothing of the call
    ("unsent", True),  # the server could not be reached: no byte left
    ("unknown", False),  # cut off: it may have taken the call, and freed them with it
])
def test_a_donating_call_refused_or_never_sent_leaves_the_donated_buffers_to_the_caller(answer, theirs_again):
    server = FakeServer()
    s = quiet_session(server)
    x = s.put(np.zeros(4, np.float32), "s-1", Spec(()))
    s.wait(x)
    server.down, server.down_as = answer != "refused 503", Unsent if answer == "unsent" else Unavailable
    [y] = s.call("c-down" if answer == "refused 503" else "c-inc", [x.id], OUT, donated=[x])
    assert x.is_deleted()  # the call's while it is queued
    with pytest.raises(Unavailable):
        s.wait(y)
    assert x.is_deleted() is not theirs_again
    server.down = False
    s.flush()
    released = [op for batch in server.batches() for op in batch["ops"] if op["op"] == "release"]
    assert bool(released) is not theirs_again


def test_a_long_queue_goes_in_bounded_batches_in_order_with_the_wait_on_the_last():
    server = FakeServer()
    s = quiet_session(server)
    outs = [b for _ in range(2 * MAX_BATCH + 5) for b in s.call("c-inc", [], OUT)]
    s.wait(outs[0])
    batches = server.batches()
    assert [len(b["ops"]) for b in batches] == [MAX_BATCH, MAX_BATCH, 5]
    assert [b["wait"] for b in batches] == [None, None, outs[0].id]
    sent = [op["ids"][0] for b in batches for op in b["ops"]]
    assert sent == [b.id for b in outs]


def test_a_batch_names_at_most_the_server_s_bound_of_ids_in_all_its_operations():
    """Calls of many inputs and the releases between them go in batches the server takes
    (`MAX_BATCH_IDS` in all their lists), in order."""
    server = FakeServer()
    s = quiet_session(server)
    [x] = s.call("c-make", [], OUT)
    outs = []
    for _ in range(60):
        outs += s.call("c-sum", [x.id] * 9_999, OUT)  # 10 000 ids a call
        s.release(f"{x.id}-gone")
    s.wait(outs[-1])
    batches = server.batches()
    named = [sum(len(op.get("inputs", ())) + len(op["ids"]) for op in b["ops"]) for b in batches]
    assert len(batches) == 4 and max(named) <= MAX_BATCH_IDS, named
    sent = [op["ids"][0] for b in batches for op in b["ops"] if op["op"] == "call"]
    assert sent == [x.id, *(b.id for b in outs)]


def test_the_background_sender_sends_what_is_queued_without_a_blocking_call():
    server = FakeServer()
    s = Session(server, "cl-1")  # type: ignore[arg-type]
    try:
        [y] = s.call("c-inc", [], OUT)
        assert server.sent.wait(10)  # no blocking call made it send
        assert server.batches()[0]["ops"][0]["ids"] == [y.id]
    finally:
        s.close()


def test_a_blocking_call_with_nothing_queued_waits_directly():
    server = FakeServer()
    s = quiet_session(server)
    [y] = s.call("c-inc", [], OUT)
    s.flush()
    s.wait(y)
    assert [p for _, p, _ in server.requests] == ["/v1/batch", f"/v1/buffers/{y.id}"]


def test_a_registration_let_go_is_forgotten_after_the_calls_queued_before_it_once_each():
    server = FakeServer()
    s = quiet_session(server)
    s.call("c-a", [], OUT)
    s.let_go("computations", ["c-a", "c-a"])  # two signatures answered with one id: twice
    s.let_go("programs", ["p-1"])
    s.flush()
    ops = server.batches()[0]["ops"]
    assert [op["op"] for op in ops[:1]] == ["call"] and ops[-2:] == [
        {"op": "forget", "computations": ["c-a", "c-a"]}, {"op": "forget", "programs": ["p-1"]}]
    s.let_go("computations", ["c-b"])  # like a release: rides with the next batch, wakes nothing
    assert len(server.batches()) == 1
    s.flush()
    assert server.batches()[1]["ops"] == [{"op": "forget", "computations": ["c-b"]}]


def test_a_forget_not_yet_due_waits_for_the_last_batch_of_what_came_before():
    server = FakeServer()
    s = quiet_session(server)
    outs = [b for _ in range(MAX_BATCH + 1) for b in s.call("c-a", [], OUT)]
    s.let_go("computations", ["c-a"])
    s.wait(outs[-1])
    first, second = server.batches()
    assert all(op["op"] != "forget" for op in first["ops"])
    assert second["ops"][-1] == {"op": "forget", "computations": ["c-a"]}


def test_forgets_in_a_batch_the_server_refused_whole_are_sent_again_not_if_it_may_have_taken_them():
    server = FakeServer()
    s = quiet_session(server)
    answer = server.json
    server.json = lambda *a, **k: (_ for _ in ()).throw(OverQuota("bodies: over the limit"))  # type: ignore[method-assign]
    s.let_go("computations", ["c-a"])
    with pytest.raises(OverQuota):
        s.flush()
    server.json = answer  # type: ignore[method-assign]
    s.flush()
    assert server.batches()[-1]["ops"] == [{"op": "forget", "computations": ["c-a"]}]
    server.down = True
    s.let_go("computations", ["c-b"])
    with pytest.raises(Unavailable):
        s.flush()
    server.down = False
    s.flush()
    sent = [op for b in server.batches() for op in b["ops"] if op.get("computations") == ["c-b"]]
    assert len(sent) == 1  # the attempt the server may have taken, not again


def test_waits_in_a_row_ask_which_other_buffers_exist_and_those_need_no_request():
    server = FakeServer()
    s = quiet_session(server)
    leaves = [b for _ in range(50) for b in s.call("c-inc", [], OUT)]
    for b in leaves[:2]:  # two waits: each one request, nothing more asked
        s.wait(b)
    assert [(body or {}).get("settled") for _, _, body in server.requests] == [None, None]
    s.wait(leaves[2])  # the third in a row asks about the rest, all ready
    assert sorted(server.requests[-1][2]["settled"]) == sorted(b.id for b in leaves[3:])
    sent = len(server.requests)
    for b in leaves:
        b.result()
    assert len(server.requests) == sent and all(b.known_ready for b in leaves)
    [y] = s.call("c-inc", [leaves[0].id], OUT)  # a call between: the next waits start over
    s.wait(y)
    assert "settled" not in (server.requests[-1][2] or {})


def test_buffers_asked_to_copy_to_the_host_are_fetched_together_or_each_alone_if_refused():
    server = FakeServer()
    s = quiet_session(server)
    leaves = [b for _ in range(6) for b in s.call("c-inc", [], SHOWN)]
    s.flush()
    server.fetchable = [b.id for b in leaves]
    for b in leaves[:4]:
        b.copy_to_host_async()
    assert leaves[1].numpy().tolist() == [1.0] * 4  # the four in one request
    assert [leaves[k].numpy()[0] for k in range(6)] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    fetches = [(m, body) for m, p, body in server.requests if p.endswith("/data")]
    assert fetches[0] == ("POST", {"ids": [leaves[1].id, leaves[0].id, leaves[2].id, leaves[3].id]})
    assert [m for m, _ in fetches] == ["POST", "GET", "GET"]  # 4 and 5 were not asked for
    more = [b for _ in range(3) for b in s.call("c-inc", [], SHOWN)]
    s.flush()
    server.fetchable += [b.id for b in more]
    server.failed[more[2].id] = "no kernel"  # the server refuses a fetch naming it
    for b in more:
        b.copy_to_host_async()
    assert more[0].numpy()[0] == 6.0 and more[1].numpy()[0] == 7.0  # each alone after the refusal
    with pytest.raises(RemoteError, match="never made"):
        more[2].numpy()
