"""Overlapped 4-device all-reduces never deadlock under the executors' mechanism.

The mechanism (`executors.ray_host`, `executors.issued`): the process's PJRT CPU thread pool
sized to 2 x its devices (`PJRT_NPROC=8` for 4 devices; XLA sizes the pool max(PJRT_NPROC,
else NPROC, else the usable cores; the device count), which is 4 on a 2-core machine), one
thread issuing computations, and at most `IN_FLIGHT` (8) of them issued and not yet finished.

Why it is deadlock-free (jaxlib 0.10.2; XLA's xla/pjrt/cpu/cpu_client.{h,cc},
xla/pjrt/common_pjrt_client.cc): a multi-device Execute puts one launch task per device on
that pool and waits for them; a launch task can block twice, at the two-phase launch barrier
(until the program's other launch tasks have prepared) and on the device's max-in-flight
semaphore (32 per device, `max_inflight_computations_per_device`, not settable from JAX)
until an earlier execution on that device ends. The programs' device parts run on the same
pool, and a part blocks in the all-reduce rendezvous until all 4 parts arrive. The client
launches one multi-device program at a time (its collective launch event), and one issuing
thread has one Execute in flight, so at most 4 launch tasks and 4 device parts are ever
blocked at once: with 8 threads, whatever wakes a blocked task always has a thread. With 4
threads a launch task waiting on the semaphore takes the thread the current all-reduce's
last part needs, and the process hangs for good (the control below).

Each worker is a subprocess (`python -m bench.overlap_worker`: its own JAX client, the
executors' compiled artifact) doing runs of back-to-back calls, chained and on independent
inputs; a run that reports nothing within its timeout is a deadlock, and every result must
equal, bit for bit, what run to completion computed in the same process. A worker's start
(importing JAX, compiling) costs many times a run, and adds no chance of a deadlock a run
does not have (a deadlock is a state of the running client's pool), so the tests take many
runs in few workers. The full sweep of pool sizes and bounds is `bench/overlap.py`.
"""

from __future__ import annotations

import queue
from typing import Any

import pytest

from bench.overlap import CHOSEN, Setting, Worker, worker_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TIMEOUT_S = 15.0  # a run takes well under a second here; no progress for this long is a deadlock
UNBOUNDED = Setting("pool8_unbounded", 0, CHOSEN.env)
CONTROL = Setting("pool4_unbounded", 0)  # XLA's default pool here: 4 threads
CONTROL_ATTEMPTS = 3
CONTROL_TIMEOUT_S = 8.0


def start(setting: Setting, runs: int, calls: int) -> Worker:
    return Worker({"runs": runs, "calls": calls, "elements": 1, "in_flight": setting.in_flight},
                  worker_env(setting.env))


def ready(w: Worker, setting: Setting) -> dict[str, Any]:
    """The worker's first record, once its client is up; fails the test if it is not."""
    try:
        record = w.next(120.0)
    except queue.Empty:
        record = None
    if record is None or not record.get("ready"):
        err = w.stderr_tail()
        w.stop()
        pytest.fail(f"the {setting.name} worker did not start:\n{err}")
    return record


def runs_of(setting: Setting, process: int, runs: int, calls: int) -> list[dict[str, Any]]:
    """One worker's runs; fails the test on a deadlock or a crash."""
    w = start(setting, runs, calls)
    ready(w, setting)
    try:
        records = []
        for run in range(runs):
            try:
                rec = w.next(TIMEOUT_S)
            except queue.Empty:
                pytest.fail(f"{setting.name}, process {process}, run {run}: no progress within "
                            f"{TIMEOUT_S:g}s (deadlock)\n{w.stderr_tail()}")
            assert rec is not None, f"process {process} exited during run {run}:\n{w.stderr_tail()}"
            records.append(rec)
        return records
    finally:
        w.stop()


def test_chosen_mechanism_never_deadlocks_and_matches_run_to_completion():
    """60 runs, each 100 chained and 100 independent back-to-back all-reduces, in 3
    processes, every result bit-equal to run to completion's. Enough: with neither the pool
    nor the bound, every run of 100 calls deadlocks (the control below; `bench/overlap.py`:
    23 of 23), and with no bound, pools of 5 to 7 threads deadlock in 72% to 14% of runs, so
    a regression to any of those passes 60 runs about once in 10^4."""
    assert CHOSEN.env == {"PJRT_NPROC": "8"} and CHOSEN.in_flight == 8
    records = [r for p in range(3) for r in runs_of(CHOSEN, p, 20, 100)]
    assert len(records) == 60
    assert all(r["equal"] for r in records), [r for r in records if not r["equal"]]


def test_pool_of_twice_the_devices_needs_no_bound():
    """4 runs of 300 calls with nothing bounding those in flight, so the 32-per-device
    semaphore blocks launch tasks, and the 8-thread pool still finishes every one (the
    thread argument does not depend on the bound); the control deadlocks on its first such
    run. One process: what is stressed is the pool within a run."""
    records = runs_of(UNBOUNDED, 0, 4, 300)
    assert len(records) == 4 and all(r["equal"] for r in records)


def test_control_default_pool_deadlocks_without_a_bound():
    """The default pool with nothing bounding the work in flight hangs (bench/overlap.py: 23
    of 23 runs of 100 calls), so the stress tests above can see a deadlock; and `PJRT_NPROC`
    is what changes the pool (4 more PJRT threads, and as many more Eigen intra-op threads).
    The chosen worker starts while the control's run is waited out."""
    chosen = start(CHOSEN, runs=1, calls=1)
    try:
        threads = None
        for _ in range(CONTROL_ATTEMPTS):
            w = start(CONTROL, runs=1, calls=300)
            threads = ready(w, CONTROL)["pool_threads"]
            try:
                w.next(CONTROL_TIMEOUT_S)
            except queue.Empty:
                break  # deadlocked, as expected
            finally:
                w.stop()
        else:
            pytest.fail(f"{CONTROL_ATTEMPTS} unbounded runs on the default pool finished: the deadlock "
                        "this mechanism prevents is gone (a new jaxlib?); revisit the mechanism")
        chosen_threads = ready(chosen, CHOSEN)["pool_threads"]
    finally:
        chosen.stop()
    assert chosen_threads - threads >= 4, (chosen_threads, threads)
