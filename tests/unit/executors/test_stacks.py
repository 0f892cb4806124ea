"""executors.stacks: a run's loop stacks. Values pushed in a forward loop's iterations come
back last first in a backward loop's, whatever order the iterations pushed them in; nested
loops per outer iteration; a loop around both keeps its iterations' stacks apart; dead values
are not pushed, failed ones are; an empty stack is a failure naming it, never a wait."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from executors.control import DEAD, Frames
from executors.stacks import StackMemory, Stacks, Swapped
from executors.store import Failure

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def at(*frames: tuple[str, int]) -> Frames:
    return Frames([list(f) for f in frames])


def test_a_loop_s_values_come_back_last_first_whatever_order_they_were_pushed_in():
    s = Stacks()
    for k in (0, 2, 1, 3):  # iterations that ran at once pushed out of order
        assert s.push("s0", 1, at(("w1", k)), np.full(4, k, np.float32)) is None
    assert s.held() == (4, 4 * 16, 0)
    popped = [int(s.pop("s0", 1, at(("w9", j)))[0]) for j in range(4)]  # the backward loop's frames
    assert popped == [3, 2, 1, 0] and s.held() == (0, 0, 0)
    failure = s.pop("s0", 1, at(("w9", 4)))
    assert isinstance(failure, Failure) and "stack s0 has no value left to pop (in iteration 4 of loop w9)" \
        in failure.cause


def test_a_nested_loop_s_values_come_back_per_outer_iteration():
    s = Stacks()
    for i in range(2):
        for j in range(i + 1):
            s.push("s1", 2, at(("w1", i), ("w1.b.w2", j)), np.float32(10 * i + j))
    got = []
    for i in range(2):  # the backward outer loop, and in it the inner one for outer 1, then 0
        for j in range(2 - i):
            got.append(float(s.pop("s1", 2, at(("w8", i), ("w8.b.w9", j)))))
    assert got == [11.0, 10.0, 0.0]


def test_a_loop_around_both_keeps_its_iterations_stacks_apart():
    s = Stacks()
    for u in (0, 1):  # a user's loop running two iterations at once: both push before either pops
        for k in range(3):
            s.push("s0", 1, at(("w0", u), ("w0.b.w1", k)), np.float32(100 * u + k))
    assert [float(s.pop("s0", 1, at(("w0", 0), ("w0.b.w5", j)))) for j in range(3)] == [2.0, 1.0, 0.0]
    assert [float(s.pop("s0", 1, at(("w0", 1), ("w0.b.w5", j)))) for j in range(3)] == [102.0, 101.0, 100.0]


def test_dead_values_are_not_pushed_and_failed_ones_are():
    s = Stacks()
    s.push("s0", 1, at(("w1", 0)), Failure("iteration 0 failed"))
    s.push("s0", 1, at(("w1", 1)), DEAD)
    assert s.held() == (1, 0, 0)
    popped = s.pop("s0", 1, at(("w2", 0)))
    assert isinstance(popped, Failure) and popped.cause == "iteration 0 failed"
    outside = s.push("s0", 1, Frames(), np.float32(1))
    assert isinstance(outside, Failure) and "expected 1 open loop frames, found 0" in outside.cause


def test_past_the_device_budget_the_oldest_values_are_swapped_and_come_back_equal():
    memory = StackMemory(resident=32, swapped=64)  # two float32[4] on the devices, four more swapped
    s, other = Stacks(memory), Stacks(memory)
    values = [jax.device_put(np.arange(4, dtype=np.float32) + k) for k in range(6)]
    for k, v in enumerate(values):
        assert s.push("s0", 1, at(("w1", k)), v) is None
    assert s.held() == (6, 32, 64) and (memory.resident_bytes, memory.swapped_bytes) == (32, 64)
    assert [type(v) for _, v in s._entries["s0", ""]][:4] == [Swapped] * 4  # the oldest: popped last
    full = other.push("s0", 1, at(("w1", 0)), values[0])  # another run's, on the same host
    assert isinstance(full, Failure)
    assert "does not fit the host's loop stacks" in full.cause and "executor_stack_swap_mb" in full.cause
    for j in range(6):
        np.testing.assert_array_equal(np.asarray(s.pop("s0", 1, at(("w9", j)))), np.asarray(values[5 - j]))
    assert s.held() == (0, 0, 0) and (memory.resident_bytes, memory.swapped_bytes) == (0, 0)


def test_without_swapping_a_push_past_the_device_budget_fails_and_a_dropped_run_frees_its_share():
    memory = StackMemory(resident=32, swapped=0)
    s = Stacks(memory)
    for k in range(2):
        assert s.push("s0", 1, at(("w1", k)), jax.device_put(np.zeros(4, np.float32))) is None
    full = s.push("s0", 1, at(("w1", 2)), jax.device_put(np.zeros(4, np.float32)))
    assert isinstance(full, Failure) and "(in iteration 2 of loop w1)" in full.cause
    s.drop()
    assert s.held() == (0, 0, 0) and memory.resident_bytes == 0


def test_a_loop_that_does_not_swap_keeps_its_values_on_the_devices_and_fails_past_the_budget():
    s = Stacks(StackMemory(resident=32, swapped=64))
    for k in range(2):
        assert s.push("s0", 1, at(("w1", k)), jax.device_put(np.zeros(4, np.float32)), swap=False) is None
    full = s.push("s0", 1, at(("w1", 2)), jax.device_put(np.zeros(4, np.float32)), swap=False)
    assert isinstance(full, Failure) and "its loop does not swap (swap=False)" in full.cause
    assert s.held() == (2, 32, 0)
    assert s.push("s1", 1, at(("w1", 0)), jax.device_put(np.ones(4, np.float32))) is None
    assert s.held() == (3, 32, 16)  # another loop's, swapped: s0's stay
