"""A corpus of hostile input, sent over HTTP by a client (eve) to a server that holds another
client's (bob's) values: pickles, random and truncated artifacts, artifacts with a smuggled
custom call or host callback or waived safety checks, the wrong device count, deeply nested
and oversized JSON, oversized chunked uploads, shapes that overflow int64, huge meshes, ids
of 10 000 characters and lists of 100 000 of them.

Every case gets a 4xx whose detail names the problem (or, where the input is bounded but
legal, an answer that changes nothing). Afterwards the server serves, bob's buffers hold
what they held, nothing was unpickled, and eve owns only what she made legitimately.

It runs on a server of its own with 1 MiB body limits (`ISTHMUS_MAX_UPLOAD_MB`,
`ISTHMUS_MAX_JSON_MB`), so oversized bodies cost little to send, and one island of one host.
(tests/e2e/test_bad_input.py has the everyday mistakes: unknown ids, mismatched inputs,
zeroed bytes inside an artifact, wrong upload lengths.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
from attacks import CASES, LIMIT_MB, Attack
from jax.sharding import PartitionSpec as P

import client as isthmus
from client.embedded import EmbeddedServer
from ir import to_wire

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


# -- the server, the victim and the attacker -------------------------------------------------

@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A server of its own with 1 MiB body limits: one island, one host of 4 devices."""
    state = tmp_path_factory.mktemp("isthmus-limited")
    cluster = tmp_path_factory.mktemp("cluster") / "cluster.json"
    cluster.write_text(json.dumps({"islands": [{"name": "a", "hosts": 1, "devices_per_host": 4,
                                                "platform": "cpu"}]}))
    env = {"ISTHMUS_MAX_UPLOAD_MB": str(LIMIT_MB), "ISTHMUS_MAX_JSON_MB": str(LIMIT_MB)}
    srv = EmbeddedServer.start(state, extra=["--cluster", str(cluster)], env=env)
    srv.token = (state / "token").read_text().strip()  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def bob(limited: Any) -> Iterator[dict[str, Any]]:
    with isthmus.connect(limited.address, token=limited.token, name="bob") as c:
        s = c.slice({"x": 2})
        x = c.put(np.arange(8, dtype=np.float32), s, P("x"))
        f = c.jit(lambda v: v * 3 + 1, slice=s, in_specs=P("x"), out_specs=P("x"))
        y = f(x)
        yield {"client": c, "x": x, "y": y, "f": f, "values": {x.id: x.numpy(), y.id: y.numpy()}}


@pytest.fixture(scope="module")
def eve(limited: Any, bob: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attack]:
    with isthmus.connect(limited.address, token=limited.token, name="eve") as c:
        s = c.slice({"x": 1})
        g = c.jit(lambda v: v + 1, slice=s)
        step = c.program(lambda v: g(v))
        program = to_wire(step.trace(np.ones(4, np.float32)))
        headers = {"Authorization": f"Bearer {c.secret}"}
        with httpx.Client(base_url=limited.address, headers=headers, timeout=120) as http:
            yield Attack(http, s.id, program, list(bob["values"]),
                         tmp_path_factory.mktemp("marker") / "unpickled", holdings(http))


def holdings(http: httpx.Client) -> dict[str, Any]:
    me = http.get("/v1/clients/self").json()
    listed = {what: sorted(o["id"] for o in http.get(f"/v1/{what}").json())
              for what in ("slices", "buffers", "computations", "programs")}
    return {**{k: me[k] for k in ("slices", "buffers", "buffer_bytes", "computations", "programs")},
            **listed}


# -- the tests -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input_is_refused_by_name(name: str, eve: Attack) -> None:
    send, status, words = CASES[name]
    r = send(eve)
    assert r.status_code == status, f"{name}: {r.status_code} {r.text[:500]}"
    # No amplification: an answer names the field, id or op at fault, never repeats the input.
    assert len(r.content) <= 20_000, f"{name}: an answer of {len(r.content)} bytes"
    if status != 204:
        detail = r.json()["detail"]
        text = detail if isinstance(detail, str) else json.dumps(detail)
        for w in words:
            assert w in text, f"{name}: {w!r} not in {text[:500]}"


def test_afterwards_the_server_serves_and_nothing_changed_hands(limited: Any, bob: dict[str, Any],
                                                               eve: Attack) -> None:
    assert httpx.get(f"{limited.address}/healthz", timeout=60).json()["status"] == "ok"
    assert not eve.marker.exists(), "a pickle was loaded"
    for b in (bob["x"], bob["y"]):  # unchanged, and still bob's alone
        np.testing.assert_array_equal(b.numpy(), bob["values"][b.id])
        assert eve.http.get(f"/v1/buffers/{b.id}").status_code == 404
    np.testing.assert_array_equal(bob["f"](bob["x"]).numpy(), np.arange(8) * 3 + 1)
    assert {b["id"] for b in bob["client"].buffers()} >= set(bob["values"])
    assert holdings(eve.http) == eve.legit, "eve owns something she did not make legitimately"


def test_a_refused_operation_naming_another_client_s_ids_does_not_tell_them_apart(bob: dict[str, Any],
                                                                                   eve: Attack) -> None:
    """Eve names one of bob's live ids and one bob never made as outputs of a refused call:
    both read afterwards as ids that do not exist, alike."""
    live = bob["x"].id
    never = live.rsplit(".", 1)[0] + ".nevermade1"
    ops = [{"op": "call", "computation_id": "c-nope", "inputs": [], "ids": [b]} for b in (live, never)]
    eve.http.post("/v1/batch", json={"ops": ops})
    answers = [eve.http.get(f"/v1/buffers/{b}") for b in (live, never)]
    assert [a.status_code for a in answers] == [404, 404], [a.text for a in answers]
    assert answers[0].json()["detail"].replace(live, "ID") == answers[1].json()["detail"].replace(never, "ID")
    np.testing.assert_array_equal(bob["x"].numpy(), bob["values"][live])
