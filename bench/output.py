"""Writing a benchmark's result (`--json PATH`): the keys it promises, checked before it is written.

Each benchmark names the top-level keys of its JSON in one constant, `JSON_KEYS`, and
writes its result with `write_json(path, result, JSON_KEYS)`: a result missing one of them,
or holding a number that is not finite (NaN, an infinity), is refused with the key's name,
so that a broken measurement fails the run instead of writing a JSON that reads as a figure.
`tests/e2e/test_bench_smoke.py` runs every benchmark's `--smoke` and reads these keys back.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


class ResultError(ValueError):
    """A benchmark's result lacks a key it promises, or holds a number that is not finite."""


def not_finite(value: Any, where: str = "") -> list[str]:
    """The paths (`a.b[2]`) of every float in `value` that is NaN or infinite."""
    if isinstance(value, float):
        return [] if math.isfinite(value) else [where or "."]
    if isinstance(value, Mapping):
        return [p for k, v in value.items() for p in not_finite(v, f"{where}.{k}" if where else str(k))]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in not_finite(v, f"{where}[{i}]")]
    return []


def check(result: Mapping[str, Any], keys: Sequence[str]) -> None:
    """Raise `ResultError` unless `result` has every one of `keys` and only finite numbers."""
    missing = [k for k in keys if k not in result]
    if missing:
        raise ResultError(f"expected the result to have the keys {list(keys)}; missing {missing}")
    if bad := not_finite(result):
        raise ResultError(f"expected finite numbers in the result; not finite at {bad}")


def write_json(path: Path | None, result: Mapping[str, Any], keys: Sequence[str]) -> None:
    """Check `result` (`check`), then write it to `path` as indented JSON (nothing if None)."""
    check(result, keys)
    if path is not None:
        path.write_text(json.dumps(result, indent=2, allow_nan=False) + "\n")
