"""The session's queue without a server: what travels in which batch, in what order, and
where a refusal or a lost connection lands. The transport is a fake that answers batches as
the server's contract says (the one place a fake stands in: the logic here is pure)."""

from __future__ import annotations

import gc
import threading
from typing import Any

import numpy as np
import pytest

from client.arrays import PLAIN
from client.retry import Retry
from client.sender import unsent_part
from client.session import MAX_BATCH, MAX_BATCH_IDS, Session
from client.transport import Dropped, OverQuota, Unsent
from ir import Aval, Conflict, RemoteError, Spec, Unavailable
from server.records import CHOSEN_ID, chosen_prefix

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]

F32 = Aval((4,), "float32")
OUT = [("s-1", F32, Spec(()), None)]
SHOWN = [("s-1", F32, Spec(()), PLAIN)]  # (read as arrays)


class FakeServer:
    """Answers `POST /v1/batch` by the contract of `server.routes.batch`: ops in order, a
    refused op's ids remembered as failed, what reads one refused with the same cause."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, Any]] = []
        self.live: set[str] = set()
        self.failed: dict[str, str] = {}
        self.down = False
        self.down_as: type[Unavailable] = Unavailable  # what a request raises while down
        self.sent = threading.Event()  # set at every request
        self.fetchable: list[str] = []  # ids a fetch answers, by position
        self.retry = Retry(grace_s=0.0, timeout_s=30.0)  # (the transport's: nothing waits here)
        # Batches with operations whose connection drops before the server reads them, and
        # after it took them (their answer lost); `unfinishing`: what it takes then is lost
        # as by a restart before it finished (`unfinished`).
        self.drops_before = 0
        self.drops_after = 0
        self.unfinishing = False
        self.unfinished: set[str] = set()

    def json(self, method: str, path: str, json: Any = None, **_: Any) -> Any:
        self.requests.append((method, path, json))
        self.sent.set()
        if self.down:
            raise self.down_as("cannot reach the Isthmus server")
        if path != "/v1/batch":
            return {"state": "ready", "path": path}
        if json["ops"] and self.drops_before:
            self.drops_before -= 1
            raise Dropped("the Isthmus server dropped the connection")
        failures = []
        for i, op in enumerate(json["ops"]):
            refused = self._refusal(op)
            if refused is None:
                made = op.get("ids", [op.get("id")]) if op["op"] in ("call", "run", "put") else []
                self.live.update(made)
                self.unfinished.update(made if self.unfinishing else ())
                gone = [*op.get("donate", ()), *(op["ids"] if op["op"] == "release" else ())]
                self.live.difference_update(gone)
                self.unfinished.difference_update(gone)
            else:
                status, detail = refused
                failures.append({"index": i, "status": status, "error": "E", "detail": detail})
                for b in op.get("ids", [op.get("id")]):
                    self.failed[b] = detail
        wait = json.get("wait")
        waited = None
        if wait in self.failed:
            waited = {"status": 424, "error": "RemoteError", "detail": f"never made: {self.failed[wait]}"}
        ready = [b for b in json.get("settled", []) if b in self.live]
        if json["ops"] and self.drops_after:
            self.drops_after -= 1
            self.unfinishing = False
            raise Dropped("the Isthmus server dropped the connection")
        known = json.get("known", [])
        return {"failed": failures, "wait": waited, "ready": ready,
                "unknown": [b for b in known if b not in self.live and b not in self.failed],
                "unfinished": sorted(self.unfinished & set(known))}

    def _refusal(self, op: dict[str, Any]) -> tuple[int, str] | None:
        if op["op"] != "release" and set(op.get("ids", [op.get("id")])) & self.live:
            return 409, "an id is in use"  # (an operation taken twice)
        for b in [*op.get("inputs", ()), *op.get("donate", ())]:
            if b not in self.live and b not in self.failed:
                return 404, f"buffer {b} does not exist"
        for b in op.get("inputs", ()):
            if b in self.failed:
                return 424, f"buffer {b} was never made: {self.failed[b]}"
        if op.get("computation_id") == "c-broken":
            return 409, "computation c-broken failed to compile: no kernel"
        if op.get("computation_id") == "c-greedy":
            return 429, "buffer bytes: over the limit"
        if op.get("computation_id") == "c-down":
            return 503, "a host of it was down"
        return None

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if path.endswith("/data"):  # a fetch: each buffer's bytes are its index (float32[4])
            self.requests.append((method, path, kwargs.get("json_body")))
            ids = kwargs["json_body"]["ids"] if method == "POST" else [path.split("/")[3]]
            if any(b in self.failed for b in ids):
                raise RemoteError(f"buffer {ids[0]}: never made")
            return Fetched(b"".join(np.full(4, self.fetchable.index(b), np.float32).tobytes() for b in ids))
        return self.json(method, path, **kwargs)

    def batches(self) -> list[dict[str, Any]]:
        return [body for _, path, body in self.requests if path == "/v1/batch"]


class Fetched:
    def __init__(self, content: bytes) -> None:
        self.content = content


def quiet_session(server: FakeServer) -> Session:
    """A session without a background sender: what is queued leaves only when a blocking
    call sends it, so each test says exactly when."""
    return Session(server, "cl-1", background=False)  # type: ignore[arg-type]


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


def waiting_session(server: FakeServer) -> Session:
    """A quiet session whose transport waits out a restart (fake time: nothing sleeps)."""
    clock = [0.0]

    def pause(seconds: float) -> bool:
        clock[0] += seconds
        return False

    server.retry = Retry(grace_s=30.0, timeout_s=600.0, clock=lambda: clock[0], pause=pause)
    return quiet_session(server)


def queued_chain(s: Session) -> list[Any]:
    x = s.put(np.zeros(4, np.float32), "s-1", Spec(()))
    [y] = s.call("c-inc", [x.id], OUT)
    [z] = s.call("c-inc", [y.id], OUT)
    return [x, y, z]


def test_a_batch_whose_answer_was_lost_after_the_server_took_it_is_not_sent_again():
    server = FakeServer()
    s = waiting_session(server)
    x, y, z = queued_chain(s)
    server.drops_after = 1
    s.wait(z)  # no error: each operation taken once (a second would be refused, its ids in use)
    first, asked, rest = server.batches()
    assert len(first["ops"]) == 3 and sorted(asked["known"]) == sorted({x.id, y.id, z.id})
    assert rest["ops"] == [] and rest["wait"] == z.id  # only the wait, sent again
    assert x.error is None and y.error is None and z.error is None


def test_a_batch_dropped_before_the_server_read_it_is_sent_again_once():
    server = FakeServer()
    s = waiting_session(server)
    x, y, z = queued_chain(s)
    server.drops_before = 1
    s.wait(z)
    first, _, again = server.batches()
    assert again["ops"] == first["ops"] and again["wait"] == z.id
    assert server.live == {x.id, y.id, z.id}


def test_work_taken_but_lost_unfinished_at_a_restart_is_done_again_where_nothing_was_donated():
    server = FakeServer()
    s = waiting_session(server)
    w = s.put(np.zeros(4, np.float32), "s-1", Spec(()))
    s.wait(w)
    x, y, z = queued_chain(s)
    [d] = s.call("c-inc", [z.id], OUT, donated=[w])
    server.drops_after, server.unfinishing = 1, True
    s.wait(z)
    again = server.batches()[-1]["ops"]
    assert [op["op"] for op in again] == ["release", "put", "release", "call", "release", "call"]
    assert [op["ids"] for op in again if op["op"] == "release"] == [[x.id], [y.id], [z.id]]
    assert w.is_deleted() and d.error is None  # taken with its donation: not done again; reading it says why
    assert d.id in server.unfinished and not server.unfinished - {d.id}


def test_what_is_sent_again_of_a_lost_batch_follows_what_the_server_has():
    ops: list[dict[str, Any]] = [
        {"op": "put", "id": "p"},
        {"op": "call", "inputs": ["p"], "ids": ["a"]},
        {"op": "call", "inputs": ["a"], "ids": ["b"]},
        {"op": "release", "ids": ["p", "a"]},
        {"op": "call", "inputs": ["gone"], "ids": ["c"]},
        {"op": "call", "inputs": [], "ids": ["e"], "donate": ["x"]},
        {"op": "forget", "computations": ["c-1"]},
    ]
    owners: list[Any] = [object() for _ in ops]
    # p and a released (so unknown), b lost unfinished, c's input gone, e taken (x freed by it)
    again, whose = unsent_part(ops, owners, unknown={"p", "a", "gone", "c", "x"}, unfinished={"b"})
    assert again == [ops[0], ops[1], {"op": "release", "ids": ["b"]}, ops[2], ops[3], ops[4]]
    assert whose == [owners[0], owners[1], None, owners[2], None, owners[4]]
    # the same, b's input not there any more: b is left lost (its read says why)
    again, _ = unsent_part(ops[2:3], owners[2:3], unknown={"a"}, unfinished={"b"})
    assert again == []
