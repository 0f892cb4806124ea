"""Reading a host's buffers: which are computed without error, and their bytes.

Contract:
- A buffer read as `sound` holds a computed array that carries no error (reading it would
  not raise). A buffer deleted while it is read (the dispatch thread may release it between
  two reads of the store) is left out, never an error.
- `raw` is an array's bytes on this process (the whole array); `raw_shards` this process's
  distinct shards of a global array, each with its index, as raw bytes.
- `quick` says an array is computed and small enough (`QUICK_BYTES`) to read on the event
  loop: the hop to a thread would cost more.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from executors.compile import host_copy
from executors.issued import computed
from executors.messages import State
from executors.shards import Index, distinct_shards
from executors.store import BufferStore, Failure

QUICK_BYTES = 1 << 16  # a computed buffer this small is read on the event loop


def sound_among(store: BufferStore, buffer_ids: Sequence[str]) -> tuple[str, ...]:
    """Those of the buffers the store holds computed without error, in the order given."""
    ready = []
    for b in buffer_ids:
        try:
            if store.state(b) is State.READY and sound(store.value(b)):
                ready.append(b)
        except Failure:  # released by the dispatch thread between the two reads
            continue
    return tuple(ready)


RawShards = list[tuple[Index, bytes]]  # (index, raw bytes), one per distinct index


def kept(store: BufferStore, buffer_ids: Sequence[str], max_bytes: int) -> dict[str, RawShards]:
    """Of these buffers, those the store holds computed without error, each as its distinct
    shards' raw bytes, in the order given, up to `max_bytes` in all (one past it is left out)."""
    out: dict[str, RawShards] = {}
    total = 0
    for b in buffer_ids:
        try:
            if store.state(b) is not State.READY:
                continue
            value = store.value(b)
            if total + value.nbytes > max_bytes or not sound(value):
                continue  # (a host's shards are at most the whole value)
            out[b] = raw_shards(value)
        except Failure:  # deleted meanwhile
            continue
        total += sum(len(data) for _, data in out[b])
    return out


def sound(array: Any) -> bool:
    """A computed array holds no error (reading it would not raise)."""
    try:
        finished(array)
    except Exception:
        return False
    return True


def quick(array: Any) -> bool:
    return getattr(array, "nbytes", QUICK_BYTES) < QUICK_BYTES and computed(array)


def finished(array: Any) -> None:
    """Block until the array is computed; raise the error XLA reports for it, if any."""
    import jax

    jax.block_until_ready(array)


def raw(array: Any) -> bytes:
    return host_copy(array).tobytes()


def raw_shards(array: Any) -> RawShards:
    """This process's distinct shards of a global array, each as raw bytes."""
    return [(index, data.tobytes()) for index, data in distinct_shards(array, host_copy)]
