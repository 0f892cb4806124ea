"""A benchmark's result is refused before it is written (`bench.output`) when it lacks a key
it promises or holds a number that is not finite, each named."""

import json
import math
from pathlib import Path

import pytest

from bench.output import ResultError, check, not_finite, write_json

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]

KEYS = ("rates", "ratios", "machine")


def test_a_result_with_every_promised_key_and_finite_numbers_is_written(tmp_path: Path) -> None:
    result = {"rates": {"a": 1.5, "b": 2}, "ratios": {"a_vs_b": 0.75, "absent": None},
              "machine": {"cpus": 2}, "extra": [1.0, "x"]}
    write_json(tmp_path / "r.json", result, KEYS)
    assert json.loads((tmp_path / "r.json").read_text()) == result
    write_json(None, result, KEYS)  # checked, written nowhere


def test_a_missing_key_is_named() -> None:
    with pytest.raises(ResultError, match=r"missing \['ratios'\]"):
        check({"rates": {}, "machine": {}}, KEYS)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_number_that_is_not_finite_is_named_by_its_path(bad: float, tmp_path: Path) -> None:
    result = {"rates": {"a": 1.0}, "ratios": {"a_vs_b": bad}, "machine": {"samples": [1.0, bad]}}
    assert not_finite(result) == ["ratios.a_vs_b", "machine.samples[1]"]
    with pytest.raises(ResultError, match=r"ratios\.a_vs_b"):
        write_json(tmp_path / "r.json", result, KEYS)
    assert not (tmp_path / "r.json").exists()
