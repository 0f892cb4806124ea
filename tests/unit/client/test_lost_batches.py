"""A batch whose answer was lost while the server restarted: the session asks the server
what it has of the batch's ids and sends again only what it did not take (the fake
transport of `fake_server.py`; fake time, nothing sleeps)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from fake_server import OUT, FakeServer, queued_chain, waiting_session

from client.sender import unsent_part
from ir import Spec

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


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
