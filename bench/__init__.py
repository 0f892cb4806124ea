"""Benchmarks, run from the command line; each reports ratios against baselines run beside it.

    python -m bench.call_latency --json /tmp/call_latency.json

Every figure in `docs/benchmarks.md` names the command that produced it and the machine.
Benchmarks are not tests: no timing here decides a pass or a fail, but every mode checks its
final value, so a broken mode cannot report a fast time.
"""

__all__: list[str] = []
