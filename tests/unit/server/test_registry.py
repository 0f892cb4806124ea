"""The registry writes every change through to its store, and a new registry on the same
file reads the same records back."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from ir import Aval, InvalidArgument, MeshAxes, Spec
from resource_manager import Slice
from server.records import BufferRecord, ClientRecord, ComputationRecord
from server.registry import Registry
from server.store import SqliteStore, open_store

pytestmark = pytest.mark.timeout(30)


def _buffer(i: int, owner: str) -> BufferRecord:
    return BufferRecord(f"b-{i:08d}", owner, "s-1", ("a0",), Aval((4, 2), "float32"), Spec.of([None, "x"]))


def test_records_survive_a_new_registry_on_the_same_file(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    first = Registry(open_store(path))
    client = ClientRecord("cl-1", "alice", 2.0, b"\x01" * 32)
    first.add_client(client)
    first.add_slice(Slice("s-1", "cl-1", MeshAxes.of({"x": 2}), "a", ("a0",), (0, 1)))
    first.add_buffers(client, [_buffer(i, "cl-1") for i in range(3)])
    first.remove_buffers(client, ["b-00000001"])
    first.lose(["b-00000002"], "its island restarted")
    comp = ComputationRecord("c-1", "cl-1", "s-1", "f", (Aval((2,), "int32"),), (Aval((2,), "int32"),),
                             (Spec.of([None]),), (Spec.of([None]),), artifact=b"\x00artifact\xff")
    first.add_computation(client, comp)
    first.set_meta("cluster", {"islands": 2})
    first.close()

    again = Registry(open_store(path))
    loaded = again.load()
    [back] = again.clients.values()
    assert (back.id, back.name, back.weight, back.key) == ("cl-1", "alice", 2.0, b"\x01" * 32)
    assert back.buffers == {"b-00000000", "b-00000002"}
    assert back.buffer_bytes == 2 * 32
    assert again.buffers["b-00000000"] == _buffer(0, "cl-1")
    assert again.lost == {"b-00000002": "its island restarted"}
    got = again.computations["c-1"]
    assert (got.in_avals, got.out_specs, got.artifact) == (comp.in_avals, comp.out_specs, comp.artifact)
    assert back.computations == {"c-1"}
    assert back.stored_bytes == len(b"\x00artifact\xff")  # what the state dir keeps of it, counted again
    assert [s.id for s in loaded.slices] == ["s-1"] and loaded.slices[0].device_ids == (0, 1)
    assert again.meta("cluster") == {"islands": 2}


def test_registration_counts_survive_a_new_registry(tmp_path: Path) -> None:
    """How many registrations hold each record, and what they said: after a restart, one
    forget does not drop what two registered, and the same registration finds its record."""
    path = tmp_path / "state.db"
    first = Registry(open_store(path))
    client = ClientRecord("cl-1", "alice")
    first.add_client(client)
    for said, record in ((b"f", "c-1"), (b"f", "c-1"), (b"g", "c-2"), (b"p", "p-1"), (b"q", "p-2")):
        first.hold(client, said, record)
    assert first.let_go(client, ["c-2", "c-1", "p-2"]) == ["c-2", "p-2"]
    first.unregister(client, ["c-2", "p-2"])
    first.close()

    again = Registry(open_store(path))
    again.load()
    back = again.clients["cl-1"]
    assert back.holds == {"c-1": 1, "p-1": 1}
    assert back.registered == {b"f": "c-1", b"p": "p-1"}
    assert again.let_go(back, ["c-1", "p-1"]) == ["c-1", "p-1"]
    again.unregister(back, ["c-1", "p-1"])
    again.close()
    last = Registry(open_store(path))
    last.load()
    assert last.clients["cl-1"].holds == {} and last.clients["cl-1"].registered == {}


def test_removing_a_client_removes_everything_it_owned(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    reg = Registry(open_store(path))
    a, b = ClientRecord("cl-a", "a"), ClientRecord("cl-b", "b")
    reg.add_client(a)
    reg.add_client(b)
    reg.add_buffers(a, [_buffer(1, "cl-a")])
    reg.add_buffers(b, [_buffer(2, "cl-b")])
    reg.hold(a, b"f", "c-1")
    reg.remove_client(a)
    reg.close()
    again = Registry(open_store(path))
    again.load()
    assert set(again.clients) == {"cl-b"} and set(again.buffers) == {"b-00000002"}
    assert list(SqliteStore(path).load("holds")) == []


def test_the_file_is_private_and_another_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    SqliteStore(path).close()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    import sqlite3

    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version=99")
    db.close()
    with pytest.raises(InvalidArgument, match="schema version 99"):
        SqliteStore(path)


def test_in_memory_when_not_persisted() -> None:
    reg = Registry(open_store(None))
    reg.add_client(ClientRecord("cl-1", "a"))
    assert [r.id for r in reg.store.load("client")] == ["cl-1"]


def test_changes_are_queued_and_committed_together_by_flush(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "state.db"
    reg = Registry(open_store(path))
    client = ClientRecord("cl-1", "a")
    reg.add_client(client)
    reg.add_buffers(client, [_buffer(i, "cl-1") for i in range(3)])
    reader = sqlite3.connect(path)
    assert reader.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 0
    reg.flush()  # one transaction
    assert reader.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 4
    reader.close()
    reg.close()


async def test_a_turns_changes_are_committed_after_what_the_turn_scheduled(tmp_path: Path) -> None:
    import asyncio
    import sqlite3

    path = tmp_path / "state.db"
    reg = Registry(open_store(path))
    reader = sqlite3.connect(path)
    committed_when_sent: list[int] = []

    def send() -> None:  # a run message leaving at the turn's end (`executors.outbox`)
        committed_when_sent.append(reader.execute("SELECT COUNT(*) FROM records").fetchone()[0])

    reg.add_client(ClientRecord("cl-1", "a"))
    asyncio.get_running_loop().call_soon(send)
    for _ in range(3):
        await asyncio.sleep(0)
    assert committed_when_sent == [0]  # the message did not wait for the commit
    assert reader.execute("SELECT COUNT(*) FROM records").fetchone()[0] == 1  # nor anyone's flush
    reader.close()
    reg.close()


def test_a_commit_leaves_what_every_queued_write_in_order_would(tmp_path: Path) -> None:
    from server.store import Row

    store = SqliteStore(tmp_path / "state.db")
    store.put([Row("buffer", "b-0", "cl-2", {"v": 0}), Row("buffer", "b-9", "cl-1", {"v": 9})])
    store.flush()
    store.put([Row("buffer", "b-1", "cl-1", {"v": 1})])
    store.put([Row("buffer", "b-2", "cl-1", {"v": 2})])
    store.delete("buffer", ["b-1"])  # written and freed before the commit: a delete is left
    store.put([Row("buffer", "b-1", "cl-1", {"v": 3})])  # after the delete, so this one is
    store.delete("buffer", ["b-9"])
    store.delete("buffer", [])
    [latest] = store.pending()
    assert isinstance(latest, dict) and {k: (r.doc["v"] if r else None) for k, r in latest.items()} == {
        ("buffer", "b-1"): 3, ("buffer", "b-2"): 2, ("buffer", "b-9"): None}
    assert sorted((r.id, r.doc["v"]) for r in store.load("buffer")) == [("b-0", 0), ("b-1", 3), ("b-2", 2)]
    # an owner's records all go where it was said, between what came before and after
    store.put([Row("buffer", "b-3", "cl-2", {"v": 4})])
    store.delete_owner("cl-2")
    store.put([Row("buffer", "b-4", "cl-2", {"v": 5})])
    assert sorted((r.id, r.doc["v"]) for r in store.load("buffer")) == [("b-1", 3), ("b-2", 2), ("b-4", 5)]
    store.close()


def test_a_row_that_does_not_read_back_is_skipped_and_the_rest_loads(tmp_path: Path, caplog) -> None:
    """A record written by another version (a dtype this one lacks) or damaged must not keep
    the server from starting: it is logged and skipped, and stays in the store."""
    from server.store import Row

    path = tmp_path / "state.db"
    first = Registry(open_store(path))
    client = ClientRecord("cl-1", "alice", 1.0, b"\x01" * 32)
    first.add_client(client)
    first.add_buffers(client, [_buffer(0, "cl-1")])
    bad_aval = {"slice": "s-1", "hosts": ["a0"], "aval": {"shape": [2], "dtype": "int3"}, "spec": [None]}
    first.store.put([Row("buffer", "b-bad", "cl-1", bad_aval), Row("client", "cl-2", "", {"name": "x"}),
                     Row("program", "p-1", "cl-1", {"name": "p"})])
    first.close()

    again = Registry(open_store(path))
    loaded = again.load()
    assert set(again.clients) == {"cl-1"} and set(again.buffers) == {"b-00000000"}
    assert again.clients["cl-1"].buffers == {"b-00000000"} and loaded.programs == []
    for kind, row in (("buffer", "b-bad"), ("client", "cl-2"), ("program", "p-1")):
        assert f"stored {kind} {row} cannot be read, skipped" in caplog.text
    assert {r.id for r in again.store.load("buffer")} == {"b-00000000", "b-bad"}  # kept


class _FullDisk:
    """A connection whose commits fail while `full`, as SQLite's do on a full disk."""

    def __init__(self, db) -> None:
        self.db, self.full = db, False

    def execute(self, sql, *args):
        if sql == "COMMIT" and self.full:
            raise sqlite3.OperationalError("database or disk is full")
        return self.db.execute(sql, *args)

    def __getattr__(self, name):
        return getattr(self.db, name)


def test_changes_a_failed_commit_held_are_written_by_the_next(tmp_path: Path) -> None:
    """A full disk: the changes stay queued, the registry says why, and once the disk has
    room they are written, in order (a client closed meanwhile stays closed)."""
    path = tmp_path / "state.db"
    disks: list[_FullDisk] = []

    def connect(*args, **kwargs) -> _FullDisk:
        disks.append(_FullDisk(sqlite3.connect(*args, **kwargs)))
        return disks[-1]

    store = SqliteStore(path, connect=connect)
    reg = Registry(store)
    alice, bob = ClientRecord("cl-1", "alice"), ClientRecord("cl-2", "bob")
    reg.add_client(alice)
    reg.add_client(bob)
    reg.flush()
    [full] = disks
    full.full = True
    reg.add_buffers(alice, [_buffer(0, "cl-1")])
    reg.remove_client(bob)
    reg.flush()
    assert reg.unwritten is not None and "disk is full" in reg.unwritten
    assert not full.db.in_transaction
    reg.add_buffers(alice, [_buffer(1, "cl-1")])
    reg.flush()  # still full
    full.full = False
    reg.flush()
    assert reg.unwritten is None
    reg.close()
    again = Registry(open_store(path))
    again.load()
    assert set(again.clients) == {"cl-1"} and again.clients["cl-1"].buffers == {"b-00000000", "b-00000001"}
