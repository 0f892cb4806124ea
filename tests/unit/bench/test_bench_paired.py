"""Ratios of benchmark samples (`bench.paired`): paired round by round where the modes took
turns, the ratio of medians where they did not."""

import pytest

from bench.paired import ratio

pytestmark = [pytest.mark.unit, pytest.mark.timeout(10)]


def test_modes_in_turn_are_compared_round_by_round() -> None:
    # The machine slowed down by a third after two rounds, for both modes alike: each round
    # A was 0.8 of B. The medians pair a fast round of A with a slow one of B.
    a = [800.0, 800.0, 600.0, 600.0, 600.0]
    b = [1000.0, 1000.0, 1000.0, 750.0, 750.0]
    assert ratio(a, b, in_turn=True) == pytest.approx(0.8)
    assert ratio(a, b, in_turn=False) == pytest.approx(0.6)


def test_modes_measured_apart_or_unevenly_keep_the_ratio_of_medians() -> None:
    assert ratio([3.0, 1.0, 2.0], [4.0, 4.0], in_turn=True) == pytest.approx(0.5)
    assert ratio([2.0], [4.0], in_turn=False) == pytest.approx(0.5)
