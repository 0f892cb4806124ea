"""`Buffer` against a session that answers from memory: what a fetched value, a deleted
slice and another session's buffer do (pure client logic; no server)."""

from __future__ import annotations

import numpy as np
import pytest

from client.buffer import Buffer
from ir import Aval, InvalidArgument, NotFound, Spec

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Held:
    """A session holding one value: what a buffer asks of its session, and no more."""

    def __init__(self, value: np.ndarray, client_id: str = "cl-1") -> None:
        self.value = value
        self.client_id = client_id
        self.deleted_slices: dict[str, None] = {}
        self.fetches = 0

    def release(self, buffer_id: str) -> None:
        pass

    def fetch(self, buffer: Buffer) -> bytes:
        self.fetches += 1
        return self.value.tobytes()

    def check_open(self) -> None:
        pass


def buffer(session: Held, slice_id: str = "s-0") -> Buffer:
    v = session.value
    return Buffer(session, f"{session.client_id}.b", slice_id, Aval(v.shape, str(v.dtype)), Spec(()))


def test_a_value_fetched_before_its_slice_was_deleted_is_not_read_again():
    session = Held(np.arange(2, dtype=np.float32))
    b = buffer(session)
    assert b.numpy().tolist() == [0.0, 1.0] and not b.is_deleted()
    session.deleted_slices["s-0"] = None  # Slice.delete(): its buffers go with it
    assert b.is_deleted()
    with pytest.raises(NotFound, match=r"freed with its slice s-0"):
        b.numpy()
    assert session.fetches == 1


def test_a_complex_scalar_converts_as_a_jax_array_does():
    b = buffer(Held(np.array(1 + 2j, np.complex64)))
    assert complex(b) == 1 + 2j


def test_another_session_s_buffer_is_refused_by_whose_it_is():
    mine = Held(np.zeros(2, np.float32))
    b = buffer(mine)
    assert b.live(mine) is b
    with pytest.raises(InvalidArgument, match=r"another session's of the same client"):
        b.live(Held(np.zeros(2, np.float32)))  # connect(secret=...) again: the same client id
    with pytest.raises(InvalidArgument, match=r"is another client's"):
        b.live(Held(np.zeros(2, np.float32), client_id="cl-2"))


def test_format_is_a_jax_array_s():
    import jax.numpy as jnp

    for value in (np.array(1.23456, np.float32), np.arange(3, dtype=np.float32), np.array(7, np.int32)):
        b = buffer(Held(value))
        assert f"{b}" == f"{jnp.asarray(value)}"
    assert f"{buffer(Held(np.array(2.5, np.float32))):.3f}" == "2.500"
