"""A loop that would never end does not hold its host: past `max_run_s` it ends failed, naming
the limit, and closing its client or deleting its slice ends it at once
(executors/runner.py); one computation that never ends stops with its host's executor past
the limit (server/healing.py).

The limits are tried on a shared server with `max_run_s` of 8 s and a health probe every
second (`servers.LIMITED`); the loops count to 2**30, far past it. A loop's gradient whose
stacks pass that server's 1 MiB on a host's devices swaps them to host memory, and past 4
MiB more fails, naming the budgets, while the host serves on. Closing and deleting are tried
on the session's server, whose limit (3600 s) is far past the test's timeout: a loop that
ends there was ended by the close or the delete.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from polling import admin_hosts, until
from servers import LIMITED, shared_server

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
XDIST_GROUP = "healing"  # its server's tests together under pytest-xdist (tests/conftest.py)
XDIST_EARLY = True  # a long module: handed out first under pytest-xdist (tests/conftest.py)

LIMIT_S = int(LIMITED["ISTHMUS_MAX_RUN_S"])


limited = shared_server(LIMITED)


@pytest.fixture(scope="module")
def unlimited(server) -> tuple[str, str]:
    """The session's server (`max_run_s` 3600 s): (address, admin token)."""
    return server.address, (Path(server.state_dir) / "token").read_text().strip()


def runaway(c: isthmus.Client, s: isthmus.Slice):
    lt = c.jit(lambda i, n: i < n, slice=s)
    inc = c.jit(lambda i: i + 1, slice=s)

    @c.program
    def count(i, n):
        return isthmus.while_loop(lambda j: lt(j, n), inc, i)

    return count


def test_a_loop_past_the_run_limit_ends_failed_and_names_it(limited):
    address, token = limited
    with isthmus.connect(address, token=token, name="runaway-limit") as c:
        s = c.slice({"x": 1}, island="a")
        count = runaway(c, s)
        assert int(count(np.int32(0), np.int32(10)).numpy()) == 10  # jax.lax.while_loop's answer
        with pytest.raises(isthmus.RemoteError, match=f"looped past its limit of {LIMIT_S}s"):
            count(np.int32(0), np.int32(2**30)).numpy()
        assert int(count(np.int32(5), np.int32(7)).numpy()) == 7  # the host serves on


def test_a_loop_s_stacks_swap_past_the_device_budget_and_past_the_swap_budget_fail_typed(limited):
    address, token = limited
    with isthmus.connect(address, token=token, name="runaway-stacks") as c:
        s = c.slice({"x": 1}, island="a")
        step = c.jit(lambda w, h: jnp.tanh(h * w), slice=s, name="step")
        total = c.jit(jnp.sum, slice=s, name="total")

        def loss(w, h, n, swap=True):  # each iteration saves 128 KiB or more for the backward
            return total(isthmus.fori_loop(0, n, lambda i, h: step(w, h), h, swap=swap))

        grad = c.program(isthmus.grad(loss))
        grad_on_devices = c.program(isthmus.grad(lambda w, h, n: loss(w, h, n, swap=False)))
        w, h = np.float32(0.5), np.ones(32 << 10, np.float32)

        def want(n):
            return float(jax.grad(lambda w: jnp.sum(functools.reduce(lambda v, _: jnp.tanh(v * w),
                                                                     range(n), h)))(w))

        np.testing.assert_allclose(float(grad(w, h, np.int32(2)).numpy()), want(2), rtol=1e-5)  # on devices
        with pytest.raises(isthmus.RemoteError, match=r"1 MiB on the devices .* its loop does not swap"):
            grad_on_devices(w, h, np.int32(12)).numpy()  # a length that does not fit without swapping
        np.testing.assert_allclose(float(grad(w, h, np.int32(12)).numpy()), want(12), rtol=1e-5)  # swapped
        over = r"does not fit the host's loop stacks: 1 MiB on the devices \(executor_stack_mb.*4 MiB swapped"
        with pytest.raises(isthmus.RemoteError, match=over):
            grad(w, h, np.int32(1000)).numpy()
        np.testing.assert_allclose(float(grad(w, h, np.int32(2)).numpy()), want(2), rtol=1e-5)  # it serves on
    for name, row in admin_hosts(address, token).items():  # nothing left on any host
        assert (row["stacked"], row["stack_bytes"], row["stack_swapped_bytes"]) == (0, 0, 0), (name, row)


def test_closing_a_client_ends_its_loops_and_frees_the_host_for_others(unlimited):
    address, token = unlimited
    looping = isthmus.connect(address, token=token, name="runaway-closed")
    s = looping.slice({"x": 1}, island="b")
    host = s.hosts[0]
    out = runaway(looping, s)(np.int32(0), np.int32(2**30))
    until(lambda: admin_hosts(address, token)[host]["running"], 60, f"the loop running on {host}")
    looping.close()
    del out
    with isthmus.connect(address, token=token, name="runaway-neighbour") as c:
        other = next(t for t in (c.slice({"x": 1}, island="b") for _ in range(2)) if host in t.hosts)
        x0 = np.arange(4, dtype=np.float32)
        np.testing.assert_array_equal(c.jit(lambda v: v * 2.0, slice=other)(c.put(x0, other)).numpy(), x0 * 2)


def test_deleting_a_slice_ends_the_loops_that_use_it(unlimited):
    address, token = unlimited
    with isthmus.connect(address, token=token, name="runaway-slice") as c:
        s, kept = c.slice({"x": 1}, island="a"), c.slice({"x": 1}, island="a")
        out = runaway(c, s)(np.int32(0), np.int32(2**30))
        until(lambda: "run p-" in str(admin_hosts(address, token)[s.hosts[0]]["running"]), 60,
              "the loop running")
        s.delete()
        with pytest.raises(isthmus.NotFound, match="freed with its slice"):
            out.numpy()
        until(lambda: not admin_hosts(address, token)[s.hosts[0]]["running"], 60,
              "the loop ended with its slice")
        assert int(runaway(c, kept)(np.int32(5), np.int32(7)).numpy()) == 7


def test_one_computation_past_the_run_limit_stops_with_its_executor_and_its_result_says_why(limited):
    address, token = limited
    with isthmus.connect(address, token=token, name="runaway-computation") as c:
        s = c.slice({"x": 1}, island="b")
        spin = c.jit(lambda v: jax.lax.while_loop(lambda u: u >= 0, lambda u: u + 1.0, v), slice=s)
        with pytest.raises(isthmus.IsthmusError, match=rf"past max_run_s \({LIMIT_S}s\)"):
            spin(np.float32(0)).numpy()  # a float32 count stops growing at 2**24: it never ends
        x0 = np.arange(4, dtype=np.float32)
        double = c.jit(lambda v: v * 2.0, slice=s)

        def served() -> list[np.ndarray] | None:
            try:
                return [double(c.put(x0, s)).numpy()]
            except isthmus.IsthmusError:  # (lost with the executor replaced under it)
                return None

        np.testing.assert_array_equal(until(served, 120, "the host serving again")[0], x0 * 2.0)
