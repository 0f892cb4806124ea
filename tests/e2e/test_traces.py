"""A traced run's trace (`program(..., trace=True)`, `Client.trace`, `GET /v1/runs/{id}/trace`,
`isthmus trace`): a loop whose body moves between islands a and b, traced, is valid Chrome
trace JSON with events from every host it ran on and the server's scheduling, each
iteration's test on both hosts, and every receive ending after its send began. A run not
traced has no trace, and a tenant never reads another's."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import client as isthmus
from client.cli import main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

X0 = np.linspace(-1.0, 1.0, 8, dtype=np.float32)
TRIPS = 5


def scale(v):
    return v * 1.5 + 0.25


def looped(c: Any, trace: bool) -> tuple[Any, Any, Any]:
    """A loop whose body runs on island a then island b; its program and slices."""
    sa, sb = c.slice({"x": 2}, island="a"), c.slice({"y": 2}, island="b")
    f = c.jit(scale, slice=sa, in_specs=P("x"), out_specs=P("x"))
    g = c.jit(jax.numpy.sin, slice=sb, in_specs=P("y"), out_specs=P("y"))
    lt = c.jit(lambda i, n: i < n, slice=sa)
    inc = c.jit(lambda i: i + 1, slice=sa)

    @c.program(trace=trace, name="traced_loop" if trace else "untraced_loop")
    def loop(x, n):
        zero = c.put(np.int32(0), sa)
        return isthmus.while_loop(lambda s: lt(s[0], n), lambda s: (inc(s[0]), g(f(s[1]))), (zero, x))[1]

    return loop, sa, sb


def oracle() -> np.ndarray:
    want = X0
    for _ in range(TRIPS):
        want = np.asarray(jax.jit(lambda v: jax.numpy.sin(scale(v)))(want))
    return want


def check_chrome_trace(trace: dict[str, Any]) -> None:
    """What Chrome's trace viewer and Perfetto require of each event."""
    assert isinstance(trace["traceEvents"], list) and trace["traceEvents"]
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M", "s", "f"), e
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int), e
        if e["ph"] == "X":
            assert isinstance(e["name"], str) and isinstance(e["cat"], str), e
            assert isinstance(e["ts"], float | int) and e["dur"] >= 0, e
        if e["ph"] in ("s", "f"):
            assert isinstance(e["id"], int) and isinstance(e["ts"], float | int), e


def test_a_traced_loop_across_islands_is_a_chrome_trace_of_every_host_in_causal_order(c, tmp_path):
    loop, sa, sb = looped(c, trace=True)
    out = loop(X0, np.int32(TRIPS))
    np.testing.assert_allclose(out.numpy(), oracle(), rtol=1e-6)

    trace = c.trace(out, tmp_path / "run.json")
    assert json.loads((tmp_path / "run.json").read_text()) == trace
    check_chrome_trace(trace)
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    hosts = {*sa.hosts, *sb.hosts}
    assert set(names.values()) == {"server", *(f"host {h}" for h in hosts)}
    assert not trace["otherData"]["missing_hosts"]
    spans = [e for e in events if e["ph"] == "X"]
    by_host = {names[pid]: [e for e in spans if e["pid"] == pid] for pid in names}

    # The server's scheduling: the wait in island a's queue, the dispatch, the run.
    server = Counter(e["cat"] for e in by_host["server"])
    assert server["queue"] == 3, by_host["server"]
    # Every host: its computations, and the loop's test at each iteration (TRIPS + the last).
    for h in hosts:
        mine = by_host[f"host {h}"]
        assert any(e["cat"] == "compute" for e in mine), h
        tests = [e for e in mine if e["cat"] == "loop" and e["name"].endswith(" test")]
        assert len(tests) == TRIPS + 1, (h, [e["name"] for e in mine])
        assert any(f"iteration {TRIPS}" in e["args"].get("where", "") for e in tests), h
    # Values sent between the hosts: each send's flow ends in a receive on the other host,
    # which ends after the send began (the hosts' clocks aligned).
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = [e for e in events if e["ph"] == "f"]
    assert len(ends) >= 2 * TRIPS  # the predicate to b and the carry there and back, per iteration
    for end in ends:
        start = starts[end["id"]]
        assert start["pid"] != end["pid"], (start, end)
        assert end["ts"] >= start["ts"], (start, end)

    # Listed as traced, and fetched by its id from the command line, as the admin.
    (run,) = [r for r in c.raw_json("GET", "/v1/runs", params={"limit": 256}) if r["name"] == "traced_loop"]
    assert run["traced"] and run["status"] == "done"
    assert c.trace(run["id"])["traceEvents"] == events


def test_the_trace_command_writes_the_run_s_trace(c, server, monkeypatch, tmp_path, capsys):
    loop, _, _ = looped(c, trace=True)
    out = loop(X0, np.int32(2))
    run_id = c.trace(out)["otherData"]["run_id"]
    monkeypatch.setenv("ISTHMUS_TOKEN", (Path(server.state_dir) / "token").read_text().strip())
    monkeypatch.delenv("ISTHMUS_CLIENT_SECRET", raising=False)
    monkeypatch.setenv("ISTHMUS_ADDRESS", server.address)
    main(["trace", run_id, "-o", str(tmp_path / "cli.json")])
    assert "events from 2 hosts and the server" in capsys.readouterr().out
    check_chrome_trace(json.loads((tmp_path / "cli.json").read_text()))
    with pytest.raises(SystemExit, match="no trace of run nope/0"):
        main(["trace", "nope/0"])


def test_a_run_not_traced_has_no_trace_and_a_tenant_never_reads_another_s(connect):
    alice, bob = connect("alice"), connect("bob")
    loop, _, _ = looped(alice, trace=False)
    out = loop(X0, np.int32(1))
    with pytest.raises(isthmus.NotFound, match="no trace of run"):
        alice.trace(out)
    traced, _, _ = looped(alice, trace=True)
    run_id = alice.trace(traced(X0, np.int32(1)))["otherData"]["run_id"]
    with pytest.raises(isthmus.NotFound, match="no trace of run"):  # (bob's own secret, not the admin's)
        bob.raw_json("GET", f"/v1/runs/{run_id}/trace")
    assert alice.raw_json("GET", f"/v1/runs/{run_id}/trace")["otherData"]["run_id"] == run_id
    with pytest.raises(isthmus.InvalidArgument, match="uploaded, not computed by a run"):
        alice.trace(alice.put(X0, alice.slice({"x": 2})))
