"""Where the server's records outlive it: one small storage interface, SQLite by default.

Contract:
- A record is (kind, id, owner, doc, data): `doc` a JSON-able mapping, `data` bytes kept
  beside it (a computation's artifact), `owner` the client it belongs to ("" for the
  server's own). Kinds are the registry's (`server.registry`); the store knows none of them.
  A row is serialized when it is committed: its doc must not change after `put`.
- Writes are queued and committed together, in one transaction, by `flush` (the
  registry flushes before the server answers any request, and at the end of the event
  loop's turn for changes no request made): a server killed at any point has stored every
  change it had answered for (and perhaps some it had not yet answered). One commit per
  request, not per record: a batch of 256 calls costs one. What is committed is each
  record's last change since the previous commit (and every `delete_owner` in its place
  among them), which is what committing every change in order would leave.
- `SqliteStore` keeps one database file in WAL mode with `synchronous=NORMAL`: a commit
  survives the server process being killed at any point, and costs a write to the log, not
  a flush to disk (a power loss may lose the latest commits, never corrupt the file). The
  file is created 0600 inside the state directory. A file written by another schema
  version is refused by name rather than misread.
- Another backend (PostgreSQL, say) implements the same six methods.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from ir import InvalidArgument

log = logging.getLogger("isthmus.server")

SCHEMA_VERSION = 1
_INSERT = "INSERT OR REPLACE INTO records VALUES (?, ?, ?, ?, ?)"
_DELETE = "DELETE FROM records WHERE kind = ? AND id = ?"
_DELETE_OWNER = "DELETE FROM records WHERE owner = ?"


class Unwritable(Exception):
    """A commit failed (the disk is full, say): what it held stays queued."""


@dataclass(frozen=True)
class Row:
    kind: str
    id: str
    owner: str
    doc: dict[str, Any]
    data: bytes = b""


class Store(Protocol):
    def put(self, rows: Iterable[Row]) -> None: ...  # insert or replace
    def delete(self, kind: str, ids: Iterable[str]) -> None: ...
    def delete_owner(self, owner: str) -> None: ...  # every record of a client
    def flush(self) -> None: ...  # commit what is queued
    def load(self, kind: str) -> Iterator[Row]: ...  # after a flush
    def close(self) -> None: ...  # after a flush


class SqliteStore:
    def __init__(self, path: Path, connect: Callable[..., sqlite3.Connection] = sqlite3.connect) -> None:
        """`connect` opens the database (`sqlite3.connect`; tests give one whose commits fail)."""
        self.path = path
        if str(path) != ":memory:":
            # created private before SQLite opens it (SQLite would use the umask)
            os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600))
        # The event loop's thread writes; `check_same_thread` off only so that a close at
        # exit from another thread is allowed (the lock keeps uses apart).
        self._db = connect(str(path), isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version not in (0, SCHEMA_VERSION):
            self._db.close()
            raise InvalidArgument(f"state database {path}: schema version {version}, this server "
                                  f"reads {SCHEMA_VERSION}; move it aside to start with an empty one")
        self._db.execute("CREATE TABLE IF NOT EXISTS records (kind TEXT NOT NULL, id TEXT NOT NULL, "
                         "owner TEXT NOT NULL, doc TEXT NOT NULL, data BLOB NOT NULL, "
                         "PRIMARY KEY (kind, id))")
        self._db.execute("CREATE INDEX IF NOT EXISTS records_owner ON records (owner)")
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
        # What to write, in order: each record's last change (its row, or None to delete it),
        # then owners whose records all go, then again the records' last changes after that.
        self._queued: list[dict[tuple[str, str], Row | None] | str] = [{}]

    def put(self, rows: Iterable[Row]) -> None:
        changes = self._changes()
        for r in rows:
            changes[r.kind, r.id] = r

    def delete(self, kind: str, ids: Iterable[str]) -> None:
        changes = self._changes()
        for i in ids:
            changes[kind, i] = None

    def delete_owner(self, owner: str) -> None:
        self._queued += [owner, {}]

    def pending(self) -> list[dict[tuple[str, str], Row | None] | str]:
        """What the next commit writes, in order: each record's last change (its row, or None
        to delete it), and owners whose records all go between them."""
        return [dict(item) if isinstance(item, dict) else item for item in self._queued]

    def _changes(self) -> dict[tuple[str, str], Row | None]:
        """The latest changes, by record: a record written and deleted before the next
        commit (a call's output that the next call's release frees, say) costs one delete,
        and the rest one `executemany` per statement, however the writes alternated."""
        return self._queued[-1]  # type: ignore[return-value]  # (always a dict: see above)

    def flush(self) -> None:
        """Commit what is queued; if the commit fails (the disk is full, say), nothing of it
        is written and all of it stays queued, in order, for the next flush, and the error
        is raised."""
        queued, self._queued = self._queued, [{}]
        if len(queued) == 1 and not queued[0]:
            return
        try:
            with self._lock, self._transaction():
                for item in queued:
                    if isinstance(item, str):
                        self._db.execute(_DELETE_OWNER, (item,))
                        continue
                    self._db.executemany(_DELETE, [key for key, row in item.items() if row is None])
                    self._db.executemany(_INSERT, [
                        (r.kind, r.id, r.owner, json.dumps(r.doc, separators=(",", ":")), r.data)
                        for r in item.values() if r is not None])
        except BaseException as e:
            self._queued = queued if self._queued == [{}] else queued + self._queued
            if isinstance(e, sqlite3.Error | OSError):
                raise Unwritable(f"state database {self.path}: {e}") from e
            raise

    def load(self, kind: str) -> Iterator[Row]:
        self.flush()
        with self._lock:
            rows = self._db.execute("SELECT id, owner, doc, data FROM records WHERE kind = ? "
                                    "ORDER BY rowid", (kind,)).fetchall()
        for i, owner, doc, data in rows:
            try:
                parsed = json.loads(doc)
            except ValueError as e:  # a torn row: skipped, as a row of the wrong fields is
                log.warning("state database %s: %s record %s is unreadable (%s); skipped", self.path,
                            kind, i, e)
                continue
            yield Row(kind, i, owner, parsed, bytes(data))

    def close(self) -> None:
        self.flush()
        with self._lock:
            self._db.close()

    def _transaction(self) -> _Transaction:
        return _Transaction(self._db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    def __enter__(self) -> None:
        self._db.execute("BEGIN")

    def __exit__(self, kind: object, value: object, tb: object) -> None:
        try:
            if kind is None:
                self._db.execute("COMMIT")
        finally:  # a failed statement or commit leaves nothing half written
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")


def check_readable(path: Path) -> None:
    """Raise `OSError` naming the file if the database at `path` (if any) cannot be read."""
    if not path.exists():
        return
    try:
        db = sqlite3.connect(str(path))  # (as the server opens it: a crash's WAL is recovered)
        try:
            found = db.execute("PRAGMA quick_check").fetchone()[0]
        finally:
            db.close()
    except sqlite3.Error as e:
        found = str(e)
    if found != "ok":
        raise OSError(f"state database {path} is unreadable ({found}); move it aside to start with an empty "
                      "one (it holds the server's clients, buffers and programs)")


def open_store(path: Path | None) -> Store:
    """The store at `path`; None keeps records in memory only (they end with the server)."""
    return SqliteStore(path if path is not None else Path(":memory:"))
