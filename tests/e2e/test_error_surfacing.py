"""An error in the middle of a queue of calls lands on the futures it concerns: the failing
call's own and its dependents', with the remote cause. The calls after it that do not read
it go on and compute what `jax.jit` computes here."""

import jax
import numpy as np
import pytest

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MISSING_KERNEL = "tpu_custom_call"  # a stable custom-call target with no handler on CPU hosts


def missing_kernel(a):
    """Exports (jax.export accepts the target) but compiles on no CPU host."""
    return jax.ffi.ffi_call(MISSING_KERNEL, jax.ShapeDtypeStruct(a.shape, a.dtype))(a)


def queue_around(c, s, fail):
    """100 calls issued back to back: 40 on a chain, then `fail(chain)`, then 29 calls that
    depend on it, then 30 that do not. Returns (failing, dependents, independents, x0)."""
    inc = c.jit(lambda v: v + 1, slice=s)
    x0 = np.arange(4, dtype=np.float32)
    x = c.put(x0, s)
    inc(x).result()  # registered and compiled before the queue
    y = x
    for _ in range(40):
        y = inc(y)
    failing = fail(y)
    dependents, d = [], failing
    for _ in range(29):
        d = inc(d)
        dependents.append(d)
    independents, z = [], y
    for _ in range(30):
        z = inc(z)
        independents.append(z)
    return failing, dependents, independents, x0


def test_a_call_that_fails_to_compile_fails_itself_and_its_dependents_only(c):
    s = c.slice({"x": 1})
    bad = c.jit(missing_kernel, slice=s)
    failing, dependents, independents, x0 = queue_around(c, s, bad)
    # Refused at submission if compiling had failed by then (Conflict), else failed where it
    # ran (RemoteError): either way, the remote cause.
    with pytest.raises((isthmus.Conflict, isthmus.RemoteError), match=MISSING_KERNEL):
        failing.result()
    for d in dependents:
        with pytest.raises(isthmus.RemoteError, match=MISSING_KERNEL):
            d.numpy()
    np.testing.assert_array_equal(independents[-1].numpy(), x0 + 70)
    for k, z in enumerate(independents[:-1]):
        assert z.result() is z, k
    assert c.buffers()  # nothing left over for the next blocking call to raise


def test_a_call_refused_at_submission_fails_its_future_and_dependents_with_its_cause(c):
    s, gone = c.slice({"x": 1}), c.slice({"x": 1})
    add = c.jit(lambda a, b: a + b, slice=s)
    lost = c.put(np.ones(4, np.float32), gone)
    gone.delete()  # frees `lost` on the server; the client still holds its future
    failing, dependents, independents, x0 = queue_around(c, s, lambda y: add(y, lost))
    with pytest.raises(isthmus.NotFound, match=f"{lost.id}.* was freed with its slice {gone.id}"):
        failing.result()
    for d in dependents:
        with pytest.raises(isthmus.RemoteError, match=f"never made: .*{lost.id}.* was freed with its slice"):
            d.result()
    np.testing.assert_array_equal(independents[-1].numpy(), x0 + 70)
    np.testing.assert_array_equal(independents[0].numpy(), x0 + 41)
    live = {b["id"] for b in c.buffers()}
    assert failing.id not in live and all(d.id not in live for d in dependents)
