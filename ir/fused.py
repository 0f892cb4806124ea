"""The artifact of a fused computation: several artifacts called in sequence as one.

Contract: `encode_fused(parts, calls, outputs)` returns self-contained bytes (JSON, the
parts' serialized `jax.export` artifacts inside as base64, no pickle) and `decode_fused`
reads them back, or returns None for bytes that are not a fused artifact (a plain
`jax.export` artifact is a flatbuffer, never a JSON object). A call's inputs and the
outputs are references: `("in", k)` the fused computation's k-th input, `("out", j, k)`
the k-th output of call j. Calls are in an order where every reference points back.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ir.errors import InvalidArgument

FORMAT, VERSION = "isthmus.fused", 1
Ref = tuple[str, int] | tuple[str, int, int]


@dataclass(frozen=True)
class Call:
    part: int  # index into the parts
    inputs: tuple[Ref, ...]


@dataclass(frozen=True)
class Fused:
    parts: tuple[bytes, ...]
    calls: tuple[Call, ...]
    outputs: tuple[Ref, ...]


def encode_fused(parts: Sequence[bytes], calls: Sequence[Call], outputs: Sequence[Ref]) -> bytes:
    doc = {
        "format": FORMAT, "version": VERSION,
        "parts": [base64.b64encode(p).decode("ascii") for p in parts],
        "calls": [{"part": c.part, "inputs": [list(r) for r in c.inputs]} for c in calls],
        "outputs": [list(r) for r in outputs],
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def decode_fused(data: bytes) -> Fused | None:
    if not data.startswith(b"{"):
        return None
    try:
        doc = json.loads(data)
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ValueError(f"expected format {FORMAT} v{VERSION}")
        parts = tuple(base64.b64decode(p, validate=True) for p in doc["parts"])
        calls = tuple(Call(int(c["part"]), tuple(_ref(r) for r in c["inputs"])) for c in doc["calls"])
        outputs = tuple(_ref(r) for r in doc["outputs"])
    except (ValueError, KeyError, TypeError) as e:
        raise InvalidArgument(f"fused artifact: {e}") from None
    return Fused(parts, calls, outputs)


def _ref(r: Sequence[Any]) -> Ref:
    """A reference as the JSON holds it (its values unchecked until here)."""
    if len(r) == 2 and r[0] == "in":
        return ("in", int(r[1]))
    if len(r) == 3 and r[0] == "out":
        return ("out", int(r[1]), int(r[2]))
    raise ValueError(f"expected a reference ['in', k] or ['out', call, k], found {r!r}")
