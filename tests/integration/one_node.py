"""What the server sends a pool for a call: a one-node program's run message to each host of
its slice (the executors' one execution path), without the server."""

import itertools
from collections.abc import Sequence
from typing import Any

from executors import ExecutorPool, RunMessage
from ir.plan import Compute, HostPlan

_runs = itertools.count()


def call(pool: ExecutorPool, hosts: Sequence[str], key: str, inputs: Sequence[str], outputs: Sequence[str],
         label: str = "call", notify: bool = False, timeout: float = 30.0) -> list[Any]:
    ins, outs = [f"%{k}" for k in range(len(inputs))], [f"%o{k}" for k in range(len(outputs))]
    run_id = f"{label}/{next(_runs)}"
    messages = []
    for host in hosts:
        plan = HostPlan(host, tuple(enumerate(ins)), (Compute(key, tuple(ins), tuple(outs), label),), (0,),
                        tuple(enumerate(outs)), ())
        message = RunMessage(run_id, plan.key, 0, 1, list(zip(ins, inputs, strict=True)),
                             list(zip(outs, outputs, strict=True)), True, timeout)
        messages.append((host, message, plan))
    return pool.run(messages, notify)
