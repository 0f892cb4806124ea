"""What the `isthmus` status commands show (`devices`, `slices`, `runs`, `top`): the server's
JSON documents as `rich` tables, and the one JSON object of a `top` frame. Pure: documents
in, renderables or JSON out; reading them from the server is `client.cli`'s.

The documents are the REST API's, as JSON: `GET /v1/islands` and `/v1/devices` (a
`DeviceTable`), `GET /v1/slices`, `GET /v1/runs`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from client.devices import DeviceTable

Doc = dict[str, Any]
TOP_RUNS = 10  # the recent runs a `top` frame shows (its JSON has all it read)
STATUS_STYLE = {"up": "green", "down": "bold red", "done": "green", "failed": "bold red"}


def duration(seconds: float | None) -> str:
    """Seconds, readably: 850us, 12.3ms, 1.20s, 2m03s, 5h07m; '-' for none."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}us"
    if seconds < 1:
        return f"{seconds * 1e3:.1f}ms"
    if seconds < 60:
        return f"{seconds:.2f}s"
    minutes = int(seconds // 60)
    if minutes < 60:
        return f"{minutes}m{int(seconds % 60):02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def size(n: int | None) -> str:
    """Bytes, readably: 512B, 1.5KiB, 3.0MiB, ...; '-' for none."""
    if n is None:
        return "-"
    if n < 1024:
        return f"{n}B"
    value = n / 1024
    for unit in ("KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.1f}{unit}"
        value /= 1024
    return f"{value:.1f}TiB"


def mesh_text(mesh: dict[str, int]) -> str:
    """A slice's mesh as `data=2 model=2`."""
    return " ".join(f"{axis}={n}" for axis, n in mesh.items())


def status(word: str) -> Text:
    return Text(word, style=STATUS_STYLE.get(word, ""))


def client_text(name: str, client_id: str) -> str:
    return f"{name} ({client_id})" if name else client_id


# -- devices ---------------------------------------------------------------------------------

def devices_table(table: DeviceTable) -> Table:
    """Islands -> hosts -> devices: each host's status, queue, completed requests, and its
    devices with the virtual devices mapped onto each (`id:load`); the summary as title."""
    kinds = sorted({f"{d['platform']} ({d['kind']})" for d in table.devices})
    out = Table(title=f"{table.summary()}: {', '.join(kinds)}", title_justify="left")
    for column in ("island", "host", "status", "queued", "done", "devices (id:load)"):
        out.add_column(column, justify="right" if column in ("queued", "done") else "left")
    by_host: dict[str, list[str]] = {}
    for d in table.devices:
        by_host.setdefault(d["host"], []).append(f"{d['id']}:{d['load']}")
    for island in table.islands:
        for h in island["hosts"]:
            out.add_row(island["name"], h["name"], status(h["status"]), str(h["queued"]),
                        str(h["completed"]), " ".join(by_host.get(h["name"], [])))
    return out


# -- slices and runs -------------------------------------------------------------------------

def slices_table(slices: Sequence[Doc], owners: bool) -> Table:
    """Slices: id, mesh, island, hosts, devices, platform; with `owners`, whose each is."""
    out = Table(title=f"{len(slices)} slice{'' if len(slices) == 1 else 's'}", title_justify="left")
    columns = ["slice", *(["owner"] if owners else []), "mesh", "island", "hosts", "devices", "platform"]
    for column in columns:
        out.add_column(column)
    for s in slices:
        owner = [client_text(s.get("owner_name", ""), s.get("owner", "?"))] if owners else []
        out.add_row(s["id"], *owner, mesh_text(s["mesh"]), s["island"], " ".join(s["hosts"]),
                    " ".join(str(d) for d in s["device_ids"]), s["platform"])
    return out


def runs_table(runs: Sequence[Doc], clients: bool, now: float | None = None,
               title: str | None = None) -> Table:
    """Runs that ended, the last to end first: what ran, where, how it ended, how long it waited and
    ran, how long ago it was submitted; with `clients`, whose each was."""
    now = time.time() if now is None else now
    out = Table(title=title or f"{len(runs)} recent run{'' if len(runs) == 1 else 's'}",
                title_justify="left")
    columns = ["run", "name", "what", *(["client"] if clients else []), "island", "status", "waited",
               "ran", "ago"]
    for column in columns:
        out.add_column(column, justify="right" if column in ("waited", "ran", "ago") else "left")
    for r in runs:
        client = [client_text(r["client_name"], r["client_id"])] if clients else []
        out.add_row(r["id"], r["name"], r["what"], *client, r["island"], status(r["status"]),
                    duration(r["waited_s"]), duration(r["ran_s"]),
                    duration(max(0.0, now - r["submitted_at"])))
    return out


# -- top -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Frame:
    """One look at the cluster: what `top` shows, read at `at` (Unix seconds)."""

    address: str
    at: float
    table: DeviceTable
    runs: list[Doc]
    admin: bool  # read with the admin token: every client's runs

    def to_json(self) -> Doc:
        """`top --once --json`: islands (queues, in-flight work, hosts up and down with their
        load), the devices, and the recent runs."""
        loads = host_loads(self.table.devices)
        islands = [{
            "name": i["name"], "devices": i["devices"], "slices": i["slices"], "load": i["load"],
            "queued": i["queued"], "in_flight": i["in_flight"],
            "hosts_up": sum(h["status"] == "up" for h in i["hosts"]), "hosts": [
                {**h, "device_load": loads.get(h["name"], 0)} for h in i["hosts"]],
        } for i in self.table.islands]
        return {"address": self.address, "at": self.at, "admin": self.admin, "islands": islands,
                "devices": self.table.devices, "runs": self.runs}


def host_loads(devices: Sequence[Doc]) -> dict[str, int]:
    """Per host: the virtual devices (slice members) mapped onto its devices."""
    loads: dict[str, int] = {}
    for d in devices:
        loads[d["host"]] = loads.get(d["host"], 0) + int(d["load"])
    return loads


def top_view(frame: Frame) -> RenderableType:
    """A `top` frame: a header, the islands' queues, the hosts, the recent runs."""
    t = frame.table
    header = Text.assemble(
        ("isthmus top", "bold"), f"  {frame.address}  ",
        time.strftime("%H:%M:%S", time.localtime(frame.at)), f"  {t.summary()}",
        ("  (admin: every client's runs)" if frame.admin else "  (this client's runs)", "dim"))
    islands = Table(title="islands", title_justify="left")
    for column in ("island", "hosts up", "devices", "slices", "load", "queued", "in flight"):
        islands.add_column(column, justify="left" if column == "island" else "right")
    for i in t.islands:
        up = sum(h["status"] == "up" for h in i["hosts"])
        hosts_up = Text(f"{up}/{len(i['hosts'])}", style="green" if up == len(i["hosts"]) else "bold red")
        islands.add_row(i["name"], hosts_up, str(i["devices"]), str(i["slices"]), f"{i['load']:.2f}",
                        str(i["queued"]), str(i["in_flight"]))
    loads = host_loads(t.devices)
    hosts = Table(title="hosts", title_justify="left")
    for column in ("island", "host", "status", "device load", "queued", "running", "done", "buffers",
                   "buffer bytes"):
        hosts.add_column(column, justify="left" if column in ("island", "host", "status") else "right")
    for i in t.islands:
        for h in i["hosts"]:
            budget = h.get("buffer_budget_bytes")
            held = size(h.get("buffer_bytes", 0)) + (f" / {size(budget)}" if budget else "")
            hosts.add_row(i["name"], h["name"], status(h["status"]), str(loads.get(h["name"], 0)),
                          str(h["queued"]), duration(h.get("running_s")), str(h["completed"]),
                          str(h.get("buffers", 0)), held)
    runs = runs_table(frame.runs[:TOP_RUNS], frame.admin, frame.at,
                      title=f"recent runs (the last {min(len(frame.runs), TOP_RUNS)})")
    return Group(header, islands, hosts, runs)
