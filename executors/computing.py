"""A host's computations: the executables it has compiled, and a plan's `Compute` step run
with them on its devices (`executors.runner` runs the other steps).

Contract:
- An executable is waited for once per key, up to the run's timeout; one that does not
  arrive in time or did not compile fails the outputs of the step that wanted it, naming
  where in the loops it was wanted (a run checks its whole plan first: `uncompiled`).
- A computation on this host's devices alone is issued without waiting for it (its outputs
  are futures), `executors.issued` bounding those left unfinished and the temporaries they
  take. One spanning hosts (an island's JAX group) runs alone: every issued computation
  finishes first, and it finishes before the step returns.
- Arguments are laid out as the executable takes them (`executors.signatures`); a failed or
  dead argument fails the outputs with its cause, and nothing runs.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from executors.compile import on_devices
from executors.control import Frames, blocked
from executors.issued import Issued
from executors.signatures import Signature, Signatures
from executors.store import Failure
from ir import Compute, HostPlan


class Computations:
    def __init__(self, executable: Callable[[str], Future[Any]], issued: Issued) -> None:
        """`executable(key)`: the future of the host's executable of that key."""
        self._executable = executable
        self.issued = issued
        self._signatures = Signatures()  # by key: what each step needs of its executable
        self._ready: dict[str, tuple[Any, Signature]] = {}  # by key: the compiled executable

    def uncompiled(self, plan: HostPlan, timeout: float) -> Failure | None:
        """Why an executable of the plan is not there (waited for up to `timeout`), or None.
        A run fails whole when one of its computations does not compile, taken or not, as a
        `jax.jit` of the program would: whether it ran would otherwise depend on when the
        compiler's answer came (its values then fail from the start, so its peers hear why)."""
        for job in plan.compiles:
            if job.key in self._ready:
                continue
            try:
                self._wait(job.key, timeout)
            except FutureTimeout:
                return Failure(f"executable {job.key} not compiled within {timeout:g}s")
            except Failure as f:
                return Failure(f"a computation of the program ({job.key}) did not compile: {f.cause}")
        return None

    def forget(self, executables: Sequence[str]) -> None:
        """What is known of these executables (dropped from the host's cache)."""
        self._signatures.forget(executables)
        for key in executables:
            self._ready.pop(key, None)

    def compute(self, step: Compute, env: MutableMapping[str, Any], frames: Frames, run_id: str,
                timeout: float) -> None:
        """Run `step` on the values in `env`, its outputs put there (arrays, or the failure)."""
        args = [env[v] for v in step.inputs]
        failure = blocked(args)
        ready = self._ready.get(step.key)
        if failure is None and ready is None:
            try:
                ready = self._wait(step.key, timeout)
            except FutureTimeout:
                where = f" (in {frames.where()})" if len(frames) else ""
                failure = Failure(f"{step.label}{where}: executable {step.key} not compiled "
                                  f"within {timeout:g}s")
            except Failure as f:  # it failed to compile: where in the loops it was wanted, if in one
                failure = Failure(f"{step.label} (in {frames.where()}): {f.cause}") if len(frames) else f
        if failure is not None or ready is None:
            for value in step.outputs:
                env[value] = failure
            return
        exe, known = ready
        if known.spans_hosts:
            args = [on_devices(a) for a in args]
        args = [self._signatures.laid_out(a, s) for a, s in zip(args, known.in_shardings, strict=True)]
        if known.spans_hosts:
            import jax

            self.issued.drain()  # alone: nothing else of this host in flight while its collectives run
            results = jax.block_until_ready(exe(*args))
        else:
            self.issued.make_room(args, known.temp)
            results = exe(*args)
            self.issued.issue(step.label, args, results, known.temp, run_id)
        env.update(zip(step.outputs, results, strict=True))

    def _wait(self, key: str, timeout: float) -> tuple[Any, Signature]:
        exe = self._executable(key).result(timeout)
        ready = self._ready[key] = (exe, self._signatures.of(key, exe))
        return ready
