"""Schemathesis against the live server's OpenAPI document: whatever a client sends to any
operation, the server answers without a 5xx, with a status the operation documents, and a
body that matches the schema documented for that status.

Bounded for CI: Schemathesis's fuzzing phase only, a fixed number of generated requests per
operation (a few hundred in all), from a fixed seed (a failure reproduces), each request
given `REQUEST_S` to answer. (Its coverage phase and 80 examples per operation, run by hand,
found nothing more, in about twice the time.) One
client's secret authenticates the client routes, the admin token the admin's;
`POST /v1/islands/{name}/restart` is not fuzzed: it replaces an island's executors, and
every client's values on them would be lost (tests/e2e/test_auth_routes.py checks its
credential).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from jax.sharding import PartitionSpec as P
from schemathesis.checks import (
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

EXAMPLES = 16  # per operation (26 of them, some with fewer distinct inputs)
REQUEST_S = 30.0
SEED = 20240917
CHECKS = [not_a_server_error, status_code_conformance, response_schema_conformance]
ADMIN_ONLY = {("GET", "/v1/clients"), ("POST", "/v1/clients")}
NOT_FUZZED = ("POST", "/v1/islands/{name}/restart")

SENT: Counter[tuple[str, str]] = Counter()  # requests sent per operation, by this module


@pytest.fixture(scope="module")
def admin_token(server: Any) -> str:
    return (Path(server.state_dir) / "token").read_text().strip()


@pytest.fixture(scope="module")
def fuzzed(server: Any, admin_token: str) -> Iterator[isthmus.Client]:
    """The client whose secret the fuzzer sends; closing it frees whatever it made."""
    with isthmus.connect(server.address, token=admin_token, name="schemathesis") as c:
        yield c


@pytest.fixture(scope="module")
def api(server: Any, fuzzed: isthmus.Client) -> Any:
    """The live schema; half the ids the fuzzer sends to reads and creations are real ones
    of its client's (a slice, buffers, a computation, a program), so it gets past the
    lookups into the checks behind them."""
    s = fuzzed.slice({"x": 2})
    x = fuzzed.put(np.arange(4, dtype=np.float32), s, P("x"))
    f = fuzzed.jit(lambda v: v * 2, slice=s, in_specs=P("x"), out_specs=P("x"))
    y = f(x)
    fuzzed.program(lambda v: f(f(v)))(x).result()
    ids = {
        "slices": [s.id],
        "buffers": [x.id, y.id],
        "computations": [c["id"] for c in fuzzed.raw_json("GET", "/v1/computations")],
        "programs": [p["id"] for p in fuzzed.raw_json("GET", "/v1/programs")],
        "dtypes": ["float32", "int32", "bfloat16", "bool"],
        "shapes": ["4", "2,2", ""],
        "specs": ["[]", '["x"]', '[null, "x"]'],
    }
    bound = {
        "slices": ("path.slice_id", "query.slice_id", "body.slice_id"),
        "buffers": ("path.buffer_id", "body.inputs[*]"),
        "computations": ("path.computation_id", "body.computation_id"),
        "programs": ("path.program_id", "body.program_id"),
        "dtypes": ("query.dtype",), "shapes": ("query.shape",), "specs": ("query.spec",),
    }
    config = schemathesis.Config.from_dict({
        "seed": SEED,
        "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
        "dictionaries": {name: {"values": values} for name, values in ids.items()},
        # Not on DELETE: one of those would free the slice, and every later id with it.
        "operations": [{"include-method-regex": "^(GET|POST)$", "parameters": {
            key: {"dictionary": name, "probability": 0.5} for name, keys in bound.items() for key in keys}}],
    })
    return schemathesis.openapi.from_url(f"{server.address}/openapi.json", config=config)


schema = schemathesis.pytest.from_fixture("api").exclude(method=NOT_FUZZED[0], path=NOT_FUZZED[1])


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
def test_every_operation_answers_as_documented(case: Any, fuzzed: isthmus.Client, admin_token: str,
                                               server: Any) -> None:
    op = (case.method.upper(), case.path)
    credential = admin_token if op in ADMIN_ONLY else fuzzed.secret
    headers = {"Authorization": f"Bearer {credential}"}
    SENT[op] += 1
    response = case.call_and_validate(headers=headers, checks=CHECKS, timeout=REQUEST_S)
    if op == ("POST", "/v1/clients") and response.status_code == 201:  # a client it opened
        closed = httpx.delete(f"{server.address}/v1/clients/{response.json()['id']}",
                              headers={"Authorization": f"Bearer {admin_token}"}, timeout=REQUEST_S)
        assert closed.status_code == 204, closed.text


def test_every_operation_was_fuzzed_and_the_server_serves(server: Any, fuzzed: isthmus.Client) -> None:
    if not SENT:
        pytest.skip("counts what test_every_operation_answers_as_documented sent; run it first")
    doc = httpx.get(f"{server.address}/openapi.json", timeout=REQUEST_S).json()
    ops = {(m.upper(), p) for p, items in doc["paths"].items() for m in items} - {NOT_FUZZED}
    assert ops == set(SENT), ops ^ set(SENT)
    assert sum(SENT.values()) >= 100, SENT
    assert httpx.get(f"{server.address}/healthz", timeout=REQUEST_S).json()["status"] == "ok"
    assert fuzzed.buffers() is not None  # its secret still works
