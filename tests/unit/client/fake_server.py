"""A fake transport that answers the session's batches as the server's contract says
(`server.routes.batch`), and sessions on it: the one place a fake stands in for the server,
in the unit tests of the session's pure queue logic."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from client.arrays import PLAIN
from client.retry import Retry
from client.session import Session
from client.transport import Dropped
from ir import Aval, RemoteError, Spec, Unavailable

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
