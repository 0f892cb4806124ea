"""Overlapping 4-device all-reduces in one executor process: deadlocks, results and calls/s.

    python -m bench.overlap --json /tmp/overlap.json [--runs 10] [--calls 100] [--timeout 10]
    python -m bench.overlap --smoke --json /tmp/overlap.json   # seconds, for CI

XLA's CPU client deadlocks on back-to-back asynchronous 4-device all-reduces when its thread
pool is small. An executor issues computations without waiting for each, under the setting
this chose (`CHOSEN`: a pool of 2 x devices threads, at most 8 unfinished;
docs/architecture.md). This measures what decides that deadlock and what overlapping gains
over running each computation to completion, at the JAX level (no Ray, no server).

What decides it (jaxlib 0.10.2; XLA's xla/pjrt/cpu/cpu_client.{h,cc} and
xla/pjrt/common_pjrt_client.cc): the client's PJRT thread pool, max(PJRT_NPROC, else NPROC,
else the usable cores; the device count) threads, 4 on a 2-core machine. A multi-device
Execute runs one launch task per device on it (they wait for each other at a two-phase
barrier, then each takes a slot of its device's 32-slot in-flight semaphore, blocking while
it is full), and each device's part of a program runs on it too, blocking in the all-reduce
rendezvous until all 4 parts arrive. The client starts one multi-device program at a time.
So with one issuing thread at most 4 launch tasks and 4 parts are blocked at once: a pool
of 2 x devices never deadlocks; with 4 threads, a launch task stuck on the full semaphore
(more than 32 calls in flight) takes the thread the current all-reduce's last part needs.

The computation is the executors' own: `f(v) = v/2 + psum(v)/8 + 1` (`jax.shard_map` over
`{"x": 4}`) on a float32[4 * elements] sharded P("x"), exported with `jax.export` against an
`AbstractMesh` as the client does, and compiled by `executors.compile.compile_artifact` on
4 simulated CPU devices as a host does. A *run* issues `--calls` calls of it back to back,
twice: chained (each call's output is the next call's input) and independent (`--calls`
different inputs, placed before the clock starts). A *setting* is a pool size (the worker's
environment) and an in-flight bound B: before issuing call i, block on the oldest call still
pending while B are (`run_to_completion` blocks on every call right after issuing it, as the
executors do; `unbounded` never blocks before the end). Each run also times run to
completion in the same process, before or after the setting's calls in turn.

Each setting's runs go to worker subprocesses (`bench.overlap_worker`), `--runs` runs each; a run that
prints nothing within `--timeout` seconds is a deadlock: its worker is killed (its process
group) and a fresh one takes the remaining runs. After `--max-deadlocks` deadlocks a
setting stops early (what is left is counted as not run), so a broken setting costs seconds,
not minutes. Every run's results are compared, bit for bit, with run to completion's in the
same worker (computed first), so a fast wrong setting cannot pass.

A last experiment (`failure`) runs the chosen mechanism (`CHOSEN`) with one computation that
fails on every device (a `jax.pure_callback` that raises, compiled with `jax.jit`: JAX cannot
serialize a host callback into an artifact) in the middle of a chain, then independent
calls: the failure must reach its dependents and only them, and nothing may hang.

`--smoke` runs one short run of three settings (run to completion, a bound, unbounded; all
with the pool that cannot deadlock) and the failure experiment (`SMOKE`), for CI; its
figures mean nothing. Output (`--json PATH`, the keys `JSON_KEYS`): `settings` (name ->
`env`, `in_flight`, `runs` (attempted),
`completed`, `deadlocks`, `not_run`, `mismatches`, `calls_per_s` {chained, independent}
(median over completed runs), `run_to_completion_calls_per_s_same_process`,
`ratio_vs_run_to_completion_same_process` (median of the per-run ratios of the two),
`ratio_vs_run_to_completion` (calls/s over the `run_to_completion` setting's, measured in
another process: the gain over today's executors, noisier), `pool_threads` (threads in the
worker once its client exists)), `failure`, `chosen`, `machine`, `runs`, `calls`, `elements`,
`timeout_s`, `max_deadlocks`, `wall_s`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.machine import describe
from bench.output import write_json
from bench.overlap_worker import DEVICES

RUN_TO_COMPLETION = "run_to_completion"


@dataclass(frozen=True)
class Setting:
    """An environment for the worker and an in-flight bound (0: unbounded; 1: run to completion)."""

    name: str
    in_flight: int
    env: dict[str, str] = field(default_factory=dict)

    @property
    def bound_label(self) -> str | int:
        return "unbounded" if self.in_flight == 0 else self.in_flight


# XLA's PJRT CPU pool: max(PJRT_NPROC, else NPROC, else the usable cores; the device count).
# 2 x devices: one multi-device launch (its per-device tasks) + one collective's device parts.
POOL8 = {"PJRT_NPROC": str(2 * DEVICES)}
SETTINGS: tuple[Setting, ...] = (
    Setting(RUN_TO_COMPLETION, 1),
    Setting("pool4_b2", 2),
    Setting("pool4_b4", 4),
    Setting("pool4_b8", 8),
    Setting("pool4_unbounded", 0),
    Setting("pool6_unbounded", 0, {"PJRT_NPROC": "6"}),
    Setting("pool8_run_to_completion", 1, POOL8),
    Setting("pool8_b2", 2, POOL8),
    Setting("pool8_b8", 8, POOL8),
    Setting("pool8_unbounded", 0, POOL8),
)
CHOSEN = Setting("pool8_b8", 8, POOL8)  # the mechanism the failure experiment runs under
SMOKE = {"runs": 1, "calls": 8, "settings": "pool8_b2,pool8_unbounded", "max_deadlocks": 1}
JSON_KEYS = ("settings", "failure", "chosen", "machine", "runs", "calls", "elements", "timeout_s",
             "max_deadlocks", "wall_s")


# -- the parent: one worker process at a time, each read with a timeout ------------------------


class Worker:
    """A worker subprocess in its own process group; its stdout lines read with a timeout."""

    def __init__(self, cfg: dict[str, Any], env: dict[str, str]) -> None:
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.overlap_worker", json.dumps(cfg)],
            cwd=Path(__file__).resolve().parent.parent, env=env, stdout=subprocess.PIPE,
            stderr=self._stderr, text=True, start_new_session=True)
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def next(self, timeout: float) -> dict[str, Any] | None:
        """The next record; None if the worker exited; raises queue.Empty after `timeout`."""
        while True:
            line = self._lines.get(timeout=timeout)
            if line is None:
                return None
            with contextlib.suppress(json.JSONDecodeError):
                return json.loads(line)

    def stderr_tail(self, chars: int = 2000) -> str:
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace")[-chars:]

    def stop(self) -> None:
        """Kill this worker's process group (a deadlocked worker never exits by itself)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


def worker_env(extra: dict[str, str]) -> dict[str, str]:
    """This environment, minus any pool size of ours, with 4 CPU devices and `extra`."""
    env = {k: v for k, v in os.environ.items() if k not in ("NPROC", "PJRT_NPROC", "XLA_FLAGS")}
    env |= {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES}",
            "PYTHONUNBUFFERED": "1"}
    return env | extra


class WorkerError(RuntimeError):
    """A worker failed in a way that is not a deadlock (it crashed, or could not start)."""


def run_setting(s: Setting, runs: int, calls: int, elements: int, timeout: float,
                max_deadlocks: int, startup_timeout: float = 120.0) -> dict[str, Any]:
    """Every run of a setting, in as many workers as its deadlocks take."""
    records: list[dict[str, Any]] = []
    deadlocks, attempted, threads = 0, 0, None
    while attempted < runs and deadlocks < max_deadlocks:
        cfg = {"runs": runs - attempted, "calls": calls, "elements": elements, "in_flight": s.in_flight}
        w = Worker(cfg, worker_env(s.env))
        try:
            ready = w.next(startup_timeout)
            if ready is None or not ready.get("ready"):
                raise WorkerError(f"{s.name}: the worker did not start:\n{w.stderr_tail()}")
            threads = ready["pool_threads"]
            while attempted < runs:
                try:
                    rec = w.next(timeout)
                except queue.Empty:
                    attempted += 1
                    deadlocks += 1
                    break
                if rec is None:
                    raise WorkerError(f"{s.name}: the worker exited mid-run:\n{w.stderr_tail()}")
                attempted += 1
                records.append(rec)
        except queue.Empty:
            raise WorkerError(f"{s.name}: the worker did not start within {startup_timeout:g}s") from None
        finally:
            w.stop()
    patterns = ("chained", "independent")
    rates = {p: calls / statistics.median(r[f"{p}_s"] for r in records) if records else None
             for p in patterns}
    same_process = {p: statistics.median(r[f"rtc_{p}_s"] / r[f"{p}_s"] for r in records) if records else None
                    for p in patterns}
    result = {
        "env": s.env, "in_flight": s.bound_label, "runs": attempted, "completed": len(records),
        "deadlocks": deadlocks, "not_run": runs - attempted,
        "mismatches": sum(not r["equal"] for r in records), "calls_per_s": rates,
        "ratio_vs_run_to_completion_same_process": same_process,
        "run_to_completion_calls_per_s_same_process": {
            p: calls / statistics.median(r[f"rtc_{p}_s"] for r in records) if records else None
            for p in patterns},
        "pool_threads": threads,
    }
    print(f"  {s.name:<24} B={s.bound_label!s:<9} deadlocks {deadlocks}/{attempted}"
          f"{f' (stopped, {runs - attempted} not run)' if attempted < runs else ''}, "
          f"mismatches {result['mismatches']}, calls/s chained {_fmt(rates['chained'])} "
          f"(x{_ratio(same_process['chained'])} same process) independent {_fmt(rates['independent'])} "
          f"(x{_ratio(same_process['independent'])})", file=sys.stderr)
    return result


def run_failure(s: Setting, calls: int, elements: int, timeout: float) -> dict[str, Any]:
    """The failure experiment under setting `s`: which calls failed, and did anything hang."""
    fail_at = calls // 2
    cfg = {"failure": True, "calls": calls, "elements": elements, "in_flight": s.in_flight,
           "fail_at": fail_at}
    w = Worker(cfg, worker_env(s.env))
    try:
        ready = w.next(120.0)
        if ready is None:
            raise WorkerError(f"failure experiment: the worker did not start:\n{w.stderr_tail()}")
        try:
            rec = w.next(timeout)
        except queue.Empty:
            rec = None
        if rec is None:
            out = {"hung_or_crashed": True, "stderr_tail": w.stderr_tail()}
        else:
            out = {"hung_or_crashed": False, "failed_calls": rec["failed"],
                   "expected_failed_calls": rec["expected_failed"],
                   "only_dependents_failed": rec["failed"] == rec["expected_failed"],
                   "others_equal_run_to_completion": rec["good_equal"]}
    finally:
        w.stop()
    out |= {"setting": s.name, "env": s.env, "in_flight": s.bound_label, "calls": 2 * calls,
            "fail_at": fail_at}
    print(f"  failure at call {fail_at} of a {calls}-call chain, then {calls} independent calls: "
          f"hung or crashed {out['hung_or_crashed']}, only its dependents failed "
          f"{out.get('only_dependents_failed')}, the others equal "
          f"{out.get('others_equal_run_to_completion')}", file=sys.stderr)
    return out


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def machine() -> dict[str, Any]:
    return describe(devices=f"{DEVICES} simulated CPU devices per worker "
                            "(--xla_force_host_platform_device_count)")


def report(results: dict[str, dict[str, Any]]) -> None:
    """Add each setting's calls/s ratio against run to completion's (default pool)."""
    base = results.get(RUN_TO_COMPLETION, {}).get("calls_per_s", {})
    for r in results.values():
        r["ratio_vs_run_to_completion"] = {
            p: (r["calls_per_s"][p] / base[p]) if r["calls_per_s"].get(p) and base.get(p) else None
            for p in ("chained", "independent")
        }


def table(result: dict[str, Any]) -> str:
    rows = [f"{'setting':<24} {'B':>9} {'env':<12} {'deadlocks':>9} {'mism.':>5} | {'chained/s':>9} "
            f"{'x same':>6} {'x rtc':>6} | {'indep./s':>9} {'x same':>6} {'x rtc':>6}"]
    for name, r in result["settings"].items():
        env = ",".join(f"{k}={v}" for k, v in r["env"].items()) or "default"
        same, base = r["ratio_vs_run_to_completion_same_process"], r["ratio_vs_run_to_completion"]
        dl = f"{r['deadlocks']}/{r['runs']}" + ("+" if r["not_run"] else "")
        cells = [f"{_fmt(r['calls_per_s'][p]):>9} {_ratio(same[p]):>6} {_ratio(base[p]):>6}"
                 for p in ("chained", "independent")]
        rows.append(f"{name:<24} {r['in_flight']!s:>9} {env:<12} {dl:>9} {r['mismatches']:>5} | "
                    + " | ".join(cells))
    rows += ["deadlocks: runs without progress within the timeout / runs attempted ('+': the setting "
             "stopped early);",
             "x same: calls/s over run to completion's in the same process (median of per-run ratios);",
             "x rtc: calls/s over the run_to_completion setting's (another process, earlier: noisier)"]
    return "\n".join(rows)


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.overlap", description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--runs", type=int, default=10, help="runs per setting (default 10)")
    p.add_argument("--calls", type=int, default=100,
                   help="back-to-back calls per run and pattern (default 100)")
    p.add_argument("--elements", type=int, default=1, help="float32 elements per device (default 1)")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds without progress that count as a deadlock (default 10)")
    p.add_argument("--max-deadlocks", type=int, default=3,
                   help="deadlocks after which a setting stops (default 3)")
    p.add_argument("--settings", default=None,
                   help="comma-separated setting names (default: all; run_to_completion always runs)")
    p.add_argument("--smoke", action="store_true", help=f"{SMOKE}: seconds, for CI")
    args = p.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    if min(args.runs, args.calls, args.elements, args.max_deadlocks) < 1 or args.timeout <= 0:
        p.error("--runs, --calls, --elements and --max-deadlocks must be at least 1, --timeout positive")
    by_name = {s.name: s for s in SETTINGS}
    names = list(by_name) if args.settings is None else [RUN_TO_COMPLETION] + [
        n for n in args.settings.split(",") if n and n != RUN_TO_COMPLETION]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        p.error(f"unknown settings {unknown}; known: {', '.join(by_name)}")
    print(f"{args.runs} runs x {args.calls} back-to-back calls per setting and pattern, "
          f"timeout {args.timeout:g}s", file=sys.stderr)
    started = time.monotonic()
    results = {n: run_setting(by_name[n], args.runs, args.calls, args.elements, args.timeout,
                              args.max_deadlocks) for n in names}
    report(results)
    failure = run_failure(CHOSEN, args.calls, args.elements, args.timeout)
    result = {"settings": results, "failure": failure, "machine": machine(), "runs": args.runs,
              "calls": args.calls, "elements": args.elements, "timeout_s": args.timeout,
              "max_deadlocks": args.max_deadlocks, "chosen": CHOSEN.name,
              "wall_s": time.monotonic() - started}
    m = result["machine"]
    print(f"overlap: {args.runs} runs x {args.calls} calls; {m['cpus_usable']} CPUs, jax {m['jax']}")
    print(table(result))
    brief = {k: v for k, v in failure.items() if k not in ("failed_calls", "expected_failed_calls")}
    print(f"failure under {CHOSEN.name}: {json.dumps(brief)}")
    write_json(args.json, result, JSON_KEYS)
    return 0


if __name__ == "__main__":
    sys.exit(main())
