"""The device table that `Client.devices()` returns and `isthmus devices` prints."""

from __future__ import annotations

from typing import Any


class DeviceTable:
    def __init__(self, islands: list[dict[str, Any]], devices: list[dict[str, Any]]) -> None:
        self.islands = islands
        self.devices = devices

    @property
    def hosts(self) -> list[dict[str, Any]]:
        return [h for i in self.islands for h in i["hosts"]]

    def summary(self) -> str:
        platforms = sorted({d["platform"].upper() for d in self.devices})
        return (f"{len(self.islands)} islands, {len(self.hosts)} hosts, "
                f"{len(self.devices)} {'/'.join(platforms)} devices")

    def __str__(self) -> str:
        rows = [("island", "host", "status", "queued", "done", "devices (id:load)")]
        by_host: dict[str, list[str]] = {}
        for d in self.devices:
            by_host.setdefault(d["host"], []).append(f"{d['id']}:{d['load']}")
        for island in self.islands:
            for h in island["hosts"]:
                rows.append((island["name"], h["name"], h["status"], str(h["queued"]),
                             str(h["completed"]), " ".join(by_host.get(h["name"], []))))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        kinds = sorted({f"{d['platform']} ({d['kind']})" for d in self.devices})
        return "\n".join([self.summary() + ": " + ", ".join(kinds), *lines])

    def __repr__(self) -> str:
        return f"DeviceTable({self.summary()})"
