"""`isthmus devices | slices | runs | top` against the session's server, as a user runs them,
and `GET /v1/runs` and `GET /v1/slices` as they answer each caller: a tenant sees its own
slices and runs, never another's; the admin token sees every client's, with its owner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from polling import admin_hosts, until

import client as isthmus
from client.cli import main

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def token(server: Any) -> str:
    return (Path(server.state_dir) / "token").read_text().strip()


@pytest.fixture
def cli(server: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Callable[..., Any]:
    """Run `isthmus ... --json` in this process as the admin (`token=`) or a session
    (`secret=`): its JSON."""
    def run(*command: str, token: str | None = None, secret: str | None = None) -> Any:
        for name, value in (("ISTHMUS_TOKEN", token), ("ISTHMUS_CLIENT_SECRET", secret)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        monkeypatch.setenv("ISTHMUS_ADDRESS", server.address)
        main([*command, "--json"])
        return json.loads(capsys.readouterr().out)

    return run


def ran(c: Any, name: str) -> tuple[Any, Any]:
    """A slice of `c` and one program run on it, read back (so it has ended)."""
    s = c.slice({"x": 2})
    f = c.jit(lambda v: v * 2, slice=s, name=f"{name}_double")
    step = c.program(lambda v: f(f(v)), name=f"{name}_step")
    np.testing.assert_array_equal(step(np.arange(4, dtype=np.float32)).numpy(), np.arange(4) * 4)
    return s, step


def test_top_once_json_from_the_command_line(server, token, connect):
    alice = connect("alice")
    ran(alice, "alice")
    env = {**os.environ, "ISTHMUS_ADDRESS": server.address, "ISTHMUS_TOKEN": token}
    env.pop("ISTHMUS_CLIENT_SECRET", None)
    done = subprocess.run([sys.executable, "-m", "client.cli", "top", "--once", "--json"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    frame = json.loads(done.stdout)
    assert frame["admin"] is True and [i["name"] for i in frame["islands"]] == ["a", "b"]
    assert len(frame["devices"]) == 16
    for island in frame["islands"]:
        assert island["hosts_up"] == len(island["hosts"]) == 2
        assert {"queued", "in_flight", "load", "slices"} <= island.keys()
        assert all({"status", "device_load", "queued", "completed"} <= h.keys() for h in island["hosts"])
    assert "alice_step" in {r["name"] for r in frame["runs"] if r["client_id"] == alice.id}
    # and as tables, one frame
    table = subprocess.run([sys.executable, "-m", "client.cli", "top", "--once"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert table.returncode == 0, table.stderr
    assert "islands" in table.stdout and "recent runs" in table.stdout


def test_devices_json(cli, token):
    doc = cli("devices", token=token)
    assert [i["name"] for i in doc["islands"]] == ["a", "b"]
    assert sorted(d["id"] for d in doc["devices"]) == list(range(16))
    assert {d["status"] for d in doc["devices"]} == {"up"}


def test_a_tenant_sees_its_own_slices_and_runs_and_the_admin_everyones(cli, token, connect):
    alice, bob = connect("alice"), connect("bob")
    sa, _ = ran(alice, "alice")
    sb, _ = ran(bob, "bob")
    mine = cli("slices", secret=alice.secret)
    assert [(s["id"], s["owner"]) for s in mine] == [(sa.id, alice.id)]
    assert [s["id"] for s in cli("slices", secret=bob.secret)] == [sb.id]
    assert alice.raw_json("GET", "/v1/clients/self")["slices"] == 1  # her session is left open
    every = {s["id"]: s for s in cli("slices", token=token)}
    assert (every[sa.id]["owner"], every[sa.id]["owner_name"]) == (alice.id, "alice")
    assert (every[sb.id]["owner"], every[sb.id]["owner_name"]) == (bob.id, "bob")

    def runs_of(**who: str) -> list[dict[str, Any]]:
        return cli("runs", "--limit", "256", **who)

    # (a run is recorded as it ends; the read that saw its result may come first)
    until(lambda: {"alice_step", "bob_step"} <= {r["name"] for r in runs_of(token=token)}, 30,
          "both programs' runs listed for the admin")
    alices = runs_of(secret=alice.secret)
    assert alices and {r["client_id"] for r in alices} == {alice.id}
    assert {r["name"] for r in alices} == {"alice_step"}
    assert {r["client_id"] for r in runs_of(secret=bob.secret)} == {bob.id}
    run = next(r for r in alices if r["name"] == "alice_step")
    assert (run["what"], run["status"], run["client_name"]) == ("program", "done", "alice")
    assert run["waited_s"] >= 0 and run["ran_s"] > 0 and run["island"] in ("a", "b")


def test_a_run_ended_on_purpose_is_listed_failed(cli, token, server, connect):
    """A loop counting to 2**30 (the session's server has no run limit to speak of), ended
    by deleting its slice: the run is listed failed, for its client."""
    c = connect("looper")
    s = c.slice({"x": 1}, island="a")
    lt = c.jit(lambda i, n: i < n, slice=s)
    inc = c.jit(lambda i: i + 1, slice=s)
    count = c.program(lambda i, n: isthmus.while_loop(lambda j: lt(j, n), inc, i), name="forever")
    out = count(np.int32(0), np.int32(2**30))
    until(lambda: "run p-" in str(admin_hosts(server.address, token)[s.hosts[0]]["running"]), 60,
          "the loop running")
    s.delete()
    del out
    ended = until(lambda: [r for r in cli("runs", secret=c.secret) if r["name"] == "forever"], 60,
                  "the ended loop listed")
    assert [(r["status"], r["what"], r["client_id"]) for r in ended] == [("failed", "program", c.id)]


def test_the_tables_render(token, connect, capsys, monkeypatch, server):
    alice = connect("alice")
    ran(alice, "alice")
    monkeypatch.setenv("COLUMNS", "240")  # (rich's width where the output is no terminal)
    monkeypatch.setenv("ISTHMUS_ADDRESS", server.address)
    monkeypatch.setenv("ISTHMUS_TOKEN", token)
    monkeypatch.delenv("ISTHMUS_CLIENT_SECRET", raising=False)
    for command, seen in ((["devices"], "2 islands, 4 hosts, 16 CPU devices"), (["slices"], "alice"),
                          (["runs"], "recent run")):
        main(command)
        assert seen in capsys.readouterr().out, command


def test_the_listings_refuse_bad_input_naming_the_field(server, c, token):
    for credential in (c.secret, token):
        with httpx.Client(base_url=server.address, timeout=60,
                          headers={"Authorization": f"Bearer {credential}"}) as http:
            for path, bad in (("/v1/runs", "0"), ("/v1/runs", "257"), ("/v1/runs", "many"),
                              ("/v1/slices", "0"), ("/v1/slices", "4097")):
                r = http.get(path, params={"limit": bad})
                assert r.status_code == 422 and "limit" in r.text, (path, bad, r.text)
            assert http.get("/v1/runs", params={"limit": 1}).status_code == 200
    with pytest.raises(SystemExit, match="--limit: expected 1 to 256"):
        main(["runs", "--limit", "300", "--address", server.address])
