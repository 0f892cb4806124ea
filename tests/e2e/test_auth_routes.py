"""Every `/v1` route and method, asked by the wrong caller, gives nothing away.

The routes are read from the live server's OpenAPI document, so a new route is covered by
itself. Each is sent, with real ids of a victim client (alice) in its path, query and body:
- with no credential, a wrong, empty or blank one, alice's secret without its scheme, her
  client id as a credential, the old `X-Isthmus-Client: <alice>` header, a closed client's
  secret: 401, before the body is read (a malformed body, or one claiming a terabyte,
  still gets 401, not 422 or 413);
- with another client's secret (mallory's): 403 for the admin's routes, and for alice's ids
  exactly what an id that never existed gets (404), byte for byte once the id is swapped;
  mallory's own routes show only mallory's (nothing of alice's);
- with the admin token on a client's route: 403.
Afterwards alice's objects are all there, unchanged.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from http.client import HTTPConnection
from pathlib import Path
from typing import Any
from urllib.parse import urlencode, urlsplit

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import client as isthmus
from ir import to_wire

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

# Routes only the admin token may use; a client's secret gets 403 there.
ADMIN_ONLY = {("GET", "/v1/clients"), ("POST", "/v1/clients"), ("POST", "/v1/islands/{name}/restart")}
# Routes both may use; every other route acts for one client, and the admin token gets 403.
# (Listing slices and runs, the admin sees every client's, a client its own; a trace, any.)
EITHER = {("GET", "/v1/devices"), ("GET", "/v1/islands"), ("DELETE", "/v1/clients/{client_id}"),
          ("GET", "/v1/slices"), ("GET", "/v1/runs"), ("GET", "/v1/runs/{run_id}/trace")}
OCTETS = "application/octet-stream"


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # the template, e.g. /v1/buffers/{buffer_id}
    params: tuple[tuple[str, str, bool], ...]  # (name, in: path or query, required)
    body: str | None  # the media type of its body, if it takes one
    schema: dict[str, Any] | None  # the JSON body's schema, $refs resolved

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def operations(doc: dict[str, Any]) -> list[Operation]:
    def resolve(s: Any) -> Any:
        if isinstance(s, dict):
            if "$ref" in s:
                return resolve(doc["components"]["schemas"][s["$ref"].rsplit("/", 1)[1]])
            return {k: resolve(v) for k, v in s.items()}
        return [resolve(v) for v in s] if isinstance(s, list) else s

    ops = []
    for path, items in doc["paths"].items():
        if not path.startswith("/v1/"):
            continue
        for method, op in items.items():
            params = tuple((p["name"], p["in"], p.get("required", False))
                           for p in op.get("parameters", []) if p["in"] in ("path", "query"))
            content = op.get("requestBody", {}).get("content", {})
            media = next(iter(content), None)
            schema = resolve(content[media]["schema"]) if media == "application/json" else None
            ops.append(Operation(method.upper(), path, params, media, schema))
    return ops


@dataclass
class Alice:
    """The victim: a client holding one of everything, and what her objects are worth."""

    client: Any
    values: dict[str, Any]  # name in a route (slice_id, ...) -> her object's id
    x: Any  # an uploaded buffer
    y: Any  # a computed one
    run: Any  # a program run's output
    step: Any
    status: dict[str, Any]  # GET /v1/clients/self before the attacks

    @property
    def ids(self) -> dict[str, str]:
        """Each of her ids -> an id of the same form that never existed."""
        named = ("slice_id", "buffer_id", "computation_id", "program_id", "client_id", "run_id")
        ids = {self.values[k] for k in named} | {self.x.id, self.y.id, self.run.id}
        return {i: i.split("-")[0] + "-" + "0" * len(i.split("-", 1)[1]) for i in ids}


@pytest.fixture(scope="module")
def token(server: Any) -> str:
    return (Path(server.state_dir) / "token").read_text().strip()


@pytest.fixture(scope="module")
def alice(server: Any, token: str) -> Iterator[Alice]:
    a = isthmus.connect(server.address, token=token, name="alice")
    try:
        s = a.slice({"x": 2})
        x = a.put(np.arange(4, dtype=np.float32), s, P("x"))
        f = a.jit(lambda v: v * 2, slice=s, in_specs=P("x"), out_specs=P("x"))
        y = f(x)
        step = a.program(lambda v: f(f(v)))
        run = step(x)
        np.testing.assert_array_equal(run.numpy(), np.arange(4) * 4)
        traced = a.program(lambda v: f(v), trace=True, name="traced")(x)  # a run with a trace
        traced_run = a.trace(traced)["otherData"]["run_id"]
        [computation] = a.raw_json("GET", "/v1/computations")
        [program] = [p for p in a.raw_json("GET", "/v1/programs") if p["name"] != "traced"]
        rep = NamedSharding(s.abstract_mesh, P())
        artifact = jax.export.export(jax.jit(lambda v: v * 3, in_shardings=rep, out_shardings=rep),
                                     platforms=["cpu"])(jax.ShapeDtypeStruct((4,), jnp.float32))
        values = {
            "slice_id": s.id, "buffer_id": x.id, "computation_id": computation["id"],
            "program_id": program["id"], "client_id": a.id, "name": s.island, "run_id": traced_run,
            "ids": [x.id, y.id], "inputs": [x.id], "release": [y.id, run.id],
            "mesh": {"x": 2}, "program": to_wire(step.trace(x)),
            "artifact": base64.b64encode(artifact.serialize()).decode(),
            "in_specs": [[]], "out_specs": [[]], "dtype": "float32", "shape": "4", "spec": "[]",
        }
        yield Alice(a, values, x, y, run, step, a.raw_json("GET", "/v1/clients/self"))
    finally:
        a.close()


@pytest.fixture(scope="module")
def mallory(server: Any, token: str) -> Iterator[Any]:
    with isthmus.connect(server.address, token=token, name="mallory") as m:
        yield m


@pytest.fixture(scope="module")
def ops(server: Any) -> list[Operation]:
    found = operations(httpx.get(f"{server.address}/openapi.json", timeout=60).json())
    # The enumeration must see the API, or every check below would pass on nothing.
    assert {("GET", "/v1/buffers/{buffer_id}/data"), ("POST", "/v1/runs"), *ADMIN_ONLY, *EITHER} <= {
        (o.method, o.path) for o in found}
    return found


@pytest.fixture(scope="module")
def http(server: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.address, timeout=60) as h:
        yield h


def fill(schema: dict[str, Any] | None, values: dict[str, Any]) -> Any:
    """A minimal body of the schema, with alice's values in the fields that name them."""
    if schema is None:
        return None
    props = schema.get("properties", {})
    return {k: values[k] if k in values else _default(props[k])
            for k in props if k in values or k in schema.get("required", ())}


def _default(schema: dict[str, Any]) -> Any:
    kind = schema.get("type") or next((s.get("type") for s in schema.get("anyOf", [])), "null")
    return {"string": "x", "integer": 1, "number": 1.0, "boolean": False, "array": [],
            "object": {}}.get(kind)


def request(op: Operation, values: dict[str, Any]) -> tuple[str, bytes | None, dict[str, str]]:
    """The op's URL, body and content type, every parameter and field filled from `values`."""
    path = op.path
    query = {}
    for name, where, required in op.params:
        if name not in values:
            assert not required, f"{op}: no value for its parameter {name!r}; add one to alice's"
            continue
        if where == "path":
            path = path.replace("{" + name + "}", str(values[name]))
        else:
            query[name] = values[name]
    assert "{" not in path, f"{op}: a path parameter left unfilled: {path}"
    url = f"{path}?{urlencode(query)}" if query else path
    if op.body == OCTETS:
        return url, np.arange(4, dtype=np.float32).tobytes(), {"Content-Type": OCTETS}
    if op.body is not None:
        return url, json.dumps(fill(op.schema, values)).encode(), {"Content-Type": "application/json"}
    return url, None, {}


def send(http: httpx.Client, op: Operation, values: dict[str, Any],
         headers: dict[str, str]) -> httpx.Response:
    """The request, sent as written: through `http.client`, since httpx refuses to send a
    header value with trailing blanks (the empty bearer)."""
    url, body, head = request(op, values)
    address = http.base_url
    conn = HTTPConnection(address.host, address.port, timeout=60)
    try:
        conn.request(op.method, url, body=body, headers={**head, **headers})
        raw = conn.getresponse()
        return httpx.Response(raw.status, headers=raw.getheaders(), content=raw.read())
    finally:
        conn.close()


def swapped(text: str, ids: dict[str, str]) -> str:
    for real, fake in ids.items():
        text = text.replace(real, fake)
    return text


def leaks(text: str, alice: Alice) -> list[str]:
    return [i for i in [*alice.ids, alice.client.secret, "alice"] if i in text]


def bad_credentials(alice: Alice) -> dict[str, dict[str, str]]:
    leaked = {"X-Isthmus-Client": alice.client.id}
    return {
        "none": {},
        "wrong": {"Authorization": "Bearer wrong"},
        "empty": {"Authorization": "Bearer "},
        "blank": {"Authorization": "Bearer     "},
        "no scheme": {"Authorization": alice.client.secret},
        "basic": {"Authorization": "Basic " + base64.b64encode(f"{alice.client.id}:".encode()).decode()},
        "client id": {"Authorization": f"Bearer {alice.client.id}"},
        "leaked id": leaked,
        "leaked id, wrong": {**leaked, "Authorization": "Bearer wrong"},
    }


def test_no_wrong_or_empty_credential_gets_401_on_every_route(http, ops, alice):
    failures = []
    cases = bad_credentials(alice)
    for op in ops:
        for case, headers in cases.items():
            r = send(http, op, alice.values, headers)
            if r.status_code != 401 or r.json()["error"] != "Unauthorized" or leaks(r.text, alice):
                failures.append(f"{op} [{case}]: {r.status_code} {r.text[:200]}")
    assert not failures, "\n".join(failures)


def test_a_route_outside_the_document_needs_a_credential_too(http):
    assert http.get("/v1/nothing-here").status_code == 401
    assert http.post("/v1/nothing-here", content=b"{").status_code == 401


def test_401_comes_before_the_body_is_read(server, http, ops, alice):
    """A malformed body, or one claiming a terabyte (of which a few bytes are sent), is
    answered 401 when the credential is bad: the body is never read or parsed."""
    failures = []
    host = urlsplit(server.address)
    for op in (o for o in ops if o.body is not None):
        url, _, head = request(op, alice.values)
        r = http.request(op.method, url, content=b'{"ids": [', headers=head)
        if r.status_code != 401:
            failures.append(f"{op} [malformed body]: {r.status_code} {r.text[:200]}")
        conn = HTTPConnection(host.hostname, host.port, timeout=60)
        try:
            conn.putrequest(op.method, url)
            conn.putheader("Content-Type", head["Content-Type"])
            conn.putheader("Content-Length", str(1 << 40))
            conn.endheaders(b'{"ids": ["' + b"b" * 1000)
            raw = conn.getresponse()
            if raw.status != 401:
                failures.append(f"{op} [a terabyte claimed]: {raw.status} {raw.read()[:200]!r}")
        finally:
            conn.close()
    assert not failures, "\n".join(failures)


def test_another_clients_secret_finds_nothing_of_alices(http, ops, alice, mallory):
    mine = {"Authorization": f"Bearer {mallory.secret}"}
    for what in ("slices", "buffers", "computations", "programs"):
        assert http.get(f"/v1/{what}", headers=mine).json() == [], what
    fakes = alice.ids
    never = json.loads(swapped(json.dumps(alice.values), fakes))
    failures = []
    for op in ops:
        for case, headers in {"mallory": mine, "mallory, leaked id": {
                **mine, "X-Isthmus-Client": alice.client.id}}.items():
            where = f"{op} [{case}]"
            r = send(http, op, alice.values, headers)
            url, body, _ = request(op, alice.values)
            names_alice = any(i in url or i in (body or b"").decode(errors="replace") for i in fakes)
            if (op.method, op.path) in ADMIN_ONLY:
                if r.status_code != 403:
                    failures.append(f"{where}: expected 403, got {r.status_code} {r.text[:200]}")
            elif names_alice:
                # Alice's ids read exactly as ids that never existed: 404 (or, for the bulk
                # release that skips unknown ids, 204), and the same words.
                other = send(http, op, never, headers)
                if r.status_code not in (204, 404) or (r.status_code, swapped(r.text, fakes)) != (
                        other.status_code, other.text):
                    failures.append(f"{where}: {r.status_code} {r.text[:200]} for alice's ids, "
                                    f"{other.status_code} {other.text[:200]} for ids never made")
            elif not r.is_success or leaks(r.text, alice):
                failures.append(f"{where}: mallory's own route: {r.status_code} {r.text[:300]}")
    assert not failures, "\n".join(failures)
    assert http.get("/v1/clients/self", headers={**mine, "X-Isthmus-Client": alice.client.id}).json()[
        "id"] == mallory.id
    assert_alice_intact(http, alice)


def test_the_admin_token_is_not_a_clients_secret(http, ops, alice, token):
    admin = {"Authorization": f"Bearer {token}"}
    never = json.loads(swapped(json.dumps(alice.values), alice.ids)) | {"name": "no-such-island"}
    failures = []
    for op in ops:
        key = (op.method, op.path)
        if key in ADMIN_ONLY and op.method == "POST" and op.path == "/v1/clients":
            continue  # opening a client is what the admin token is for (every test does it)
        r = send(http, op, never, admin)
        want = 403 if key not in ADMIN_ONLY | EITHER else 404 if "{" in op.path else 200
        if r.status_code != want:
            failures.append(f"{op}: expected {want}, got {r.status_code} {r.text[:200]}")
    assert not failures, "\n".join(failures)
    listed = http.get("/v1/clients", headers=admin).json()
    assert {"alice", "mallory"} <= {c["name"] for c in listed}
    assert_alice_intact(http, alice)


def test_a_closed_clients_secret_gets_401_everywhere(server, http, ops, alice, token):
    carol = isthmus.connect(server.address, token=token, name="carol")
    secret = carol.secret
    carol.close()
    failures = []
    for op in ops:
        r = send(http, op, alice.values, {"Authorization": f"Bearer {secret}"})
        if r.status_code != 401:
            failures.append(f"{op}: {r.status_code} {r.text[:200]}")
    assert not failures, "\n".join(failures)


def assert_alice_intact(http: httpx.Client, alice: Alice) -> None:
    mine = {"Authorization": f"Bearer {alice.client.secret}"}
    v = alice.values
    for path in (f"/v1/slices/{v['slice_id']}", f"/v1/computations/{v['computation_id']}",
                 f"/v1/programs/{v['program_id']}", f"/v1/buffers/{alice.y.id}"):
        assert http.get(path, headers=mine).status_code == 200, path
    np.testing.assert_array_equal(alice.x.numpy(), np.arange(4))
    np.testing.assert_array_equal(alice.y.numpy(), np.arange(4) * 2)
    np.testing.assert_array_equal(alice.run.numpy(), np.arange(4) * 4)
    status = http.get("/v1/clients/self", headers=mine).json()
    counted = ("slices", "buffers", "buffer_bytes", "computations", "programs")
    assert {k: status[k] for k in counted} == {k: alice.status[k] for k in counted}
