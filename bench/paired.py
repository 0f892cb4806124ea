"""The ratio of two modes' samples, paired round by round where the modes took turns.

Modes measured in turn (round i of each taken one after the other) share the machine's
drift round by round: on a shared machine a round can be a third slower than the one before
it, for every mode alike. The ratio of their medians can then pair a fast round of one mode
with a slow round of the other; the median of the per-round ratios cannot. Modes measured
apart keep the ratio of their medians.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence


def ratio(a: Sequence[float], b: Sequence[float], in_turn: bool) -> float:
    """`a`'s samples over `b`'s: the median of the per-round ratios if they were taken in
    turn (sample i of each in round i), else the ratio of their medians."""
    if in_turn and len(a) == len(b) and len(a) > 0:
        return statistics.median(x / y for x, y in zip(a, b, strict=True))
    return statistics.median(a) / statistics.median(b)
