"""`isthmus serve` says in one line why it cannot start, before Ray and the executors start."""

import json
import socket
import sqlite3

import pytest

from executors.ray_daemon import hold_server_lock
from ir import InvalidArgument
from server.__main__ import preflight
from server.settings import Settings

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def settings(tmp_path, **kw) -> Settings:
    state = tmp_path / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    return Settings(**{"state_dir": state, "port": 0, **kw})


def test_a_cluster_file_that_cannot_be_read_is_named(tmp_path):
    bad = tmp_path / "cluster.json"
    bad.write_text(json.dumps({"islands": [{"name": "a", "hosts": [{"name": "a0", "devices": 1,
                                                                     "platform": "tpu"}]}]}))
    with pytest.raises(InvalidArgument, match=r"platform: expected one of \['cpu', 'gpu'\], got 'tpu'"):
        preflight(settings(tmp_path, cluster_file=bad))
    with pytest.raises(InvalidArgument, match="expected an existing file"):
        preflight(settings(tmp_path, cluster_file=tmp_path / "missing.json"))


def test_another_server_on_the_state_dir_and_a_taken_port_are_named(tmp_path):
    s = settings(tmp_path)
    preflight(s)  # free: and the lock is left free
    with hold_server_lock(s.state_dir), pytest.raises(InvalidArgument, match="another Isthmus server"):
        preflight(s)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            preflight(settings(tmp_path, port=port))


def test_a_state_database_that_cannot_be_read_is_named_and_a_torn_record_skipped(tmp_path):
    from server.store import Row, SqliteStore

    s = settings(tmp_path)
    db = s.state_dir / "state.db"
    store = SqliteStore(db)
    store.put([Row("client", "cl-1", "cl-1", {"name": "a"}), Row("client", "cl-2", "cl-2", {"name": "b"})])
    store.flush()
    other = sqlite3.connect(db)  # another writer of the file tears a row
    other.execute("UPDATE records SET doc = '{\"name\": ' WHERE id = 'cl-2'")
    other.commit()
    other.close()
    assert [r.id for r in store.load("client")] == ["cl-1"]
    store.close()
    preflight(s)  # readable
    db.write_bytes(b"\x00garbage" * 512)
    with pytest.raises(OSError, match=f"state database {db} is unreadable.*move it aside"):
        preflight(s)
