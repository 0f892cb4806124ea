"""`client.views`: the status commands' tables and `top`'s JSON, from documents shaped as the
REST API's; and the commands' one-line errors, with no server to ask."""

from __future__ import annotations

import json
import socket

import pytest
from rich.console import Console

from client import views
from client.cli import main
from client.devices import DeviceTable

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def host(name: str, island: str, status: str = "up", queued: int = 0, completed: int = 7) -> dict:
    return {"name": name, "island": island, "status": status, "devices": [], "queued": queued,
            "completed": completed, "running": None, "running_s": 0.25 if queued else None, "buffers": 3,
            "buffer_bytes": 3 << 20, "buffer_budget_bytes": 1 << 30}


ISLANDS = [
    {"name": "a", "devices": 2, "slices": 1, "load": 0.5, "queued": 2, "in_flight": 1, "admitted": {},
     "hosts": [host("a0", "a", queued=2)]},
    {"name": "b", "devices": 2, "slices": 0, "load": 0.0, "queued": 0, "in_flight": 0, "admitted": {},
     "hosts": [host("b0", "b", status="down", completed=0)]},
]
DEVICES = [{"id": i, "island": "ab"[i // 2], "host": "ab"[i // 2] + "0", "index": i % 2,
            "platform": "cpu", "kind": "cpu", "memory_bytes": None, "status": "up",
            "load": 1 if i == 0 else 0} for i in range(4)]
RUNS = [
    {"id": "p-1/ab.1", "program_id": "p-1", "name": "step", "what": "program", "client_id": "cl-9",
     "client_name": "trainer", "island": "a", "hosts": ["a0"], "status": "failed", "submitted_at": 1000.0,
     "waited_s": 0.0004, "ran_s": 1.5},
    {"id": "c-2/ab.0", "program_id": "c-2", "name": "mul", "what": "call", "client_id": "cl-9",
     "client_name": "", "island": "a", "hosts": ["a0"], "status": "done", "submitted_at": 990.0,
     "waited_s": 0.02, "ran_s": 75.0},
]


def text(renderable: object, width: int = 160) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(renderable)
    return console.export_text()


def rows(out: str) -> list[list[str]]:
    """A rendered table's body rows, cell by cell."""
    return [[c.strip() for c in line.strip().strip("│").split("│")]
            for line in out.splitlines() if line.startswith("│")]


def test_durations_and_sizes_read_as_people_write_them():
    assert [views.duration(s) for s in (None, 0.00085, 0.0123, 1.2, 123.0, 5 * 3600 + 7 * 60)] == [
        "-", "850us", "12.3ms", "1.20s", "2m03s", "5h07m"]
    assert [views.size(n) for n in (None, 512, 1536, 3 << 20, 5 << 30, 3 << 40)] == [
        "-", "512B", "1.5KiB", "3.0MiB", "5.0GiB", "3.0TiB"]
    assert views.mesh_text({"data": 2, "model": 2}) == "data=2 model=2"


def test_the_device_table_keeps_what_the_plain_one_showed():
    out = text(views.devices_table(DeviceTable(ISLANDS, DEVICES)))
    assert "2 islands, 2 hosts, 4 CPU devices: cpu (cpu)" in out
    assert rows(out) == [["a", "a0", "up", "2", "7", "0:1 1:0"], ["b", "b0", "down", "0", "0", "2:0 3:0"]]


def test_slices_show_their_owner_only_when_asked():
    s = [{"id": "s-1", "mesh": {"x": 2}, "island": "a", "hosts": ["a0"], "device_ids": [0, 1],
          "platform": "cpu", "owner": "cl-9", "owner_name": "trainer"}]
    assert "trainer (cl-9)" in text(views.slices_table(s, owners=True))
    mine = text(views.slices_table(s, owners=False))
    assert "cl-9" not in mine and "s-1" in mine and "x=2" in mine and "1 slice" in mine


def test_runs_show_status_durations_and_age():
    out = text(views.runs_table(RUNS, clients=True, now=1010.0))
    assert rows(out) == [
        ["p-1/ab.1", "step", "program", "trainer (cl-9)", "a", "failed", "400us", "1.50s", "10.00s"],
        ["c-2/ab.0", "mul", "call", "cl-9", "a", "done", "20.0ms", "1m15s", "20.00s"]]
    assert "trainer" not in text(views.runs_table(RUNS, clients=False, now=1010.0))


def test_a_top_frame_as_json_and_as_tables():
    frame = views.Frame("http://127.0.0.1:8470", 1010.0, DeviceTable(ISLANDS, DEVICES), RUNS, admin=True)
    doc = json.loads(json.dumps(frame.to_json()))  # JSON all through
    a, b = doc["islands"]
    assert (a["queued"], a["in_flight"], a["hosts_up"], b["hosts_up"]) == (2, 1, 1, 0)
    assert a["hosts"][0]["device_load"] == 1 and b["hosts"][0]["status"] == "down"
    assert [r["id"] for r in doc["runs"]] == ["p-1/ab.1", "c-2/ab.0"] and len(doc["devices"]) == 4
    out = text(views.top_view(frame), width=200)
    for seen in ("isthmus top", "islands", "hosts", "recent runs (the last 2)", "1/1", "0/1",
                 "3.0MiB / 1.0GiB", "250.0ms", "every client's runs"):
        assert seen in out, seen


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", [
    ["devices"], ["slices", "--json"], ["runs"], ["top", "--once", "--json"]])
def test_a_server_that_does_not_answer_is_one_line_and_a_non_zero_exit(command, monkeypatch, capsys):
    monkeypatch.setenv("ISTHMUS_TOKEN", "whatever")
    monkeypatch.delenv("ISTHMUS_CLIENT_SECRET", raising=False)
    monkeypatch.delenv("ISTHMUS_RESTART_GRACE_S", raising=False)
    address = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(SystemExit) as exit:
        main([*command, "--address", address])
    message = str(exit.value.code)
    assert message.startswith(f"isthmus {command[0]}: ") and address in message and "\n" not in message
    assert capsys.readouterr().out == ""


def test_bad_options_are_named(monkeypatch):
    monkeypatch.setenv("ISTHMUS_TOKEN", "whatever")
    with pytest.raises(SystemExit, match="--limit: expected 1 to 256, got 0"):
        main(["runs", "--limit", "0"])
    with pytest.raises(SystemExit, match="--interval: expected seconds > 0"):
        main(["top", "--interval", "0"])
