"""The pool's numbering, the one source of the global order: whatever threads submit, every
host's sequence is gap-free and a restriction of one order, so two submissions sharing
hosts are in the same relative order on each (what keeps collectives from waiting on each
other in a cycle). Fake actor handles record what they are sent; no Ray runs."""

import random
import threading
from concurrent.futures import Future

import pytest

from executors.pool import ExecutorPool
from executors.runner import RunMessage
from ir.plan import HostPlan

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]

HOSTS = ("a0", "a1", "b0", "b1")


class Ref:
    def __init__(self, value: object) -> None:
        self._value = value

    def future(self) -> Future:
        f: Future = Future()
        f.set_result(self._value)
        return f


class Handle:
    """Records (sequence number, run id) for every run message, however it travels."""

    def __init__(self, log: list[tuple[int, str]], lock: threading.Lock) -> None:
        self.log, self.lock = log, lock
        self.run, self.run_batch = self._Method(self._one), self._Method(self._batch)
        self.skip = self._Method(None)

    class _Method:
        def __init__(self, fn: object) -> None:
            self.fn = fn

        def remote(self, *args: object) -> Ref:
            return Ref(self.fn(*args) if self.fn else None)

    def _one(self, seq: int, message: RunMessage, plan: object) -> None:
        with self.lock:
            self.log.append((seq, message.run_id))

    def _batch(self, items: list[tuple[int, RunMessage, object]]) -> list[None]:
        for seq, message, plan in items:
            self._one(seq, message, plan)
        return [None] * len(items)


@pytest.mark.parametrize("notify", [False, True])
def test_every_host_sees_one_order_whatever_threads_submit(notify):
    logs = {h: [] for h in HOSTS}
    lock = threading.Lock()
    pool = ExecutorPool({h: Handle(logs[h], lock) for h in HOSTS}, connection=None)
    plan = {h: HostPlan(h, (), (), (), (), ()) for h in HOSTS}

    def submit(worker: int) -> None:
        rng = random.Random(worker)
        for k in range(200):
            hosts = rng.sample(HOSTS, rng.randint(1, len(HOSTS)))
            run_id = f"w{worker}/{k}"
            pool.run([(h, RunMessage(run_id, plan[h].key, 0, 0, [], [], True, 1.0), plan[h]) for h in hosts],
                     notify=notify)

    threads = [threading.Thread(target=submit, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pool.outbox.flush()
    orders = {}
    for h, log in logs.items():
        seqs = sorted(seq for seq, _ in log)
        assert seqs == list(range(len(log))), f"host {h}: sequence numbers with gaps or repeats"
        orders[h] = [run for _, run in sorted(log)]
    position = {h: {run: i for i, run in enumerate(order)} for h, order in orders.items()}
    for h1 in HOSTS:
        for h2 in HOSTS:
            on_h2 = [position[h2][run] for run in orders[h1] if run in position[h2]]  # in h1's order
            assert on_h2 == sorted(on_h2), (h1, h2)
