"""A value in pieces: the distinct shards one process holds, and the whole array from them.

Pure numpy (no JAX, no Ray): a shard is `(index, data)` where `index` gives (start, stop)
per dimension and `data` is the shard's array or its raw bytes. The server assembles a
fetched value from its hosts' shards; a host assembles a value moved to it from a slice
spanning hosts.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Index = Sequence[Sequence[int]]  # (start, stop) per dimension
Shard = tuple[Index, Any]  # data: np.ndarray, or its raw bytes


def distinct_shards(array: Any, read: Callable[[Any], np.ndarray]
                    ) -> list[tuple[list[tuple[int, int]], np.ndarray]]:
    """This process's shards of a (possibly global) jax.Array, one per distinct index, each
    read into host memory by `read` (C-contiguous)."""
    out: dict[tuple[tuple[int, int], ...], np.ndarray] = {}
    for shard in array.addressable_shards:
        index = tuple(sl.indices(n)[:2] for sl, n in zip(shard.index, array.shape, strict=True))
        if index not in out:  # (np.ascontiguousarray would make a scalar 1-d)
            out[index] = read(shard.data)
    return [(list(k), v) for k, v in out.items()]


def assemble(shape: Sequence[int], dtype: Any, shards: Sequence[Shard]) -> np.ndarray:
    """The whole array from shards that cover it (overlaps must agree, as replicas do)."""
    out = np.empty(tuple(shape), dtype=dtype)
    for index, data in shards:
        region = tuple(slice(start, stop) for start, stop in index)
        piece = out[region]
        out[region] = (np.frombuffer(data, dtype=out.dtype) if isinstance(data, bytes | bytearray)
                       else np.asarray(data)).reshape(piece.shape)
    return out


def whole(shards: Sequence[tuple[Index, np.ndarray]]) -> np.ndarray:
    """The whole array from array shards alone: its shape is where the shards end."""
    if not shards:
        raise ValueError("no shards to assemble")
    first = np.asarray(shards[0][1])
    shape = [max(index[d][1] for index, _ in shards) for d in range(first.ndim)]
    return assemble(shape, first.dtype, shards)
