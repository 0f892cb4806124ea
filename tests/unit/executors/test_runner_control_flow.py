"""In-graph control flow on two hosts, without Ray: a program with `while` and `cond` is
lowered to Switch / Merge / Enter / Exit / NextIteration plans and run by two `Host`s that
hand each other values (and the predicate, and dead signals) directly.
"""

import asyncio
import itertools
import math
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_runner import Wired, artifact

from executors.host import Host
from executors.messages import Dead, Failed, Ready, Shards
from executors.runner import RunMessage
from executors.stats import Held
from ir import Aval, Placement, ProgramBuilder
from ir.passes import host_plans, lower
from ir.plan import Compute, Enter, Recv

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

F32, I32, BOOL = Aval((3,), "float32"), Aval((), "int32"), Aval((), "bool")
SD = {F32: jax.ShapeDtypeStruct((3,), jnp.float32), I32: jax.ShapeDtypeStruct((), jnp.int32)}
PLACES = {"sa": Placement("a", (("a0", 0),)), "sb": Placement("b", (("b0", 1),))}


@pytest.fixture
def hosts():
    a, b = Wired("a0"), Wired("b0")
    Wired.peers = {"a0": a, "b0": b}
    yield {"a0": a, "b0": b}
    a.close()
    b.close()


def compute(b, name, f, ins, args, out, slice_name):
    data = artifact(lambda *xs: (f(*xs),), *(SD[b.type_of(v).aval] for v in args))
    (value,) = b.compute(name, bytes(data), slice_name, args, [(out, ())])
    return value


def loop_program(cross: bool, parallel: int = 1, bound: int = 5):
    """x, n = while n < bound: (x * 2 [on b0 when cross], n + 1); returns (x, n); up to
    `parallel` iterations at once on each host."""
    b = ProgramBuilder()
    sa, sb = b.slice("sa", {"x": 1}, island="a"), b.slice("sb", {"x": 1}, island="b")
    x, n = b.arg(F32, (), sa), b.arg(I32, (), sa)
    cond = b.sub()
    _, cn = cond.arg(F32, (), sa), cond.arg(I32, (), sa)
    cond.result(compute(cond, f"lt{bound}", lambda k: k < bound, None, [cn], BOOL, sa))
    body = b.sub()
    bx, bn = body.arg(F32, (), sa), body.arg(I32, (), sa)
    if cross:
        moved = body.transfer(bx, (), sb)
        doubled = body.transfer(compute(body, "double", lambda v: v * 2, None, [moved], F32, sb), (), sa)
    else:
        doubled = compute(body, "double", lambda v: v * 2, None, [bx], F32, sa)
    body.result(doubled, compute(body, "inc", lambda k: k + 1, None, [bn], I32, sa))
    b.result(*b.while_([x, n], cond.graph(), body.graph(), parallel))
    return b.build()


def cond_program():
    """y = cond(x[0] > 0, x + 100 on b0, x - 100 on a0)."""
    b = ProgramBuilder()
    sa, sb = b.slice("sa", {"x": 1}, island="a"), b.slice("sb", {"x": 1}, island="b")
    x = b.arg(F32, (), sa)
    pred = compute(b, "positive", lambda v: v[0] > 0, None, [x], BOOL, sa)
    no = b.sub()
    no.result(compute(no, "minus", lambda v: v - 100, None, [no.arg(F32, (), sa)], F32, sa))
    yes = b.sub()
    on_b = yes.transfer(yes.arg(F32, (), sa), (), sb)
    yes.result(yes.transfer(compute(yes, "plus", lambda v: v + 100, None, [on_b], F32, sb), (), sa))
    b.result(*b.cond(pred, [x], [no.graph(), yes.graph()]))
    return b.build()


async def run(hosts: dict[str, Host], program, inputs: list[np.ndarray], run_id: str = "r0",
              limit: float = math.inf, broken: str = ""):
    """Run `program` on the hosts; the computation labelled `broken` fails to compile."""
    lowered = lower(program, PLACES, check=True)
    plans = host_plans(lowered)
    table = lowered.artifact_table
    seq = {h: itertools.count() for h in hosts}
    for h, plan in plans.items():
        bad = {s.key for s in plan.steps if isinstance(s, Compute) and s.label == broken}
        for job in plan.compiles:
            declared = len(job.in_specs) + (job.key in bad)  # one input too many: refused
            error = await hosts[h].compile(job.key, table[job.artifact].data, job.mesh,
                                           [[]] * declared, [[]] * len(job.out_specs))
            assert (error is None) != (job.key in bad), error
    for h, plan in plans.items():
        mesh = plan.compiles[0].mesh if plan.compiles else None
        args = []
        for k, value in plan.args:
            hosts[h].put(next(seq[h]), f"{run_id}.in{k}", inputs[k].tobytes(), str(inputs[k].dtype),
                         inputs[k].shape, mesh, [])
            args.append((value, f"{run_id}.in{k}"))
        results = [(value, f"{run_id}.out{k}") for k, value in plan.results]
        message = RunMessage(run_id, plan.key, 0, len(plan.steps), args, results, True, 30.0, limit)
        await hosts[h].run(next(seq[h]), message, plan)
    outs = []
    for k in range(len(program.results)):
        reply = await hosts["a0"].fetch(next(seq["a0"]), f"{run_id}.out{k}")
        outs.append(reply)
    for h, host in hosts.items():  # a request in turn after the run: the host has finished it
        await host.fetch(next(seq[h]), f"{run_id}.none")
    return outs, plans


def value(reply, dtype, shape):
    assert isinstance(reply, Ready), reply
    return np.frombuffer(reply.value, dtype).reshape(shape)


@pytest.mark.parametrize("parallel", [1, 4])
@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("start", [0, 3, 9])
async def test_a_while_loop_across_two_hosts_equals_the_python_loop(hosts, cross, start, parallel):
    x0 = np.arange(3, dtype=np.float32)
    (x, n), plans = await run(hosts, loop_program(cross, parallel), [x0, np.int32(start)])
    trips = max(0, 5 - start)
    np.testing.assert_array_equal(value(x, np.float32, (3,)), x0 * 2**trips)
    assert value(n, np.int32, ()) == max(start, 5)
    assert set(plans) == ({"a0", "b0"} if cross else {"a0"})
    for host in hosts.values():  # no run, frame or mailbox left on either host
        assert host.runner.held() == Held(), host.runner.held()  # nothing left of the run


@pytest.mark.parametrize("sign", [1.0, -1.0])
async def test_a_cond_whose_branches_run_on_different_hosts(hosts, sign):
    x0 = np.arange(1, 4, dtype=np.float32) * sign
    (y,), plans = await run(hosts, cond_program(), [x0])
    np.testing.assert_array_equal(value(y, np.float32, (3,)), x0 + 100 if sign > 0 else x0 - 100)
    assert "b0" in plans and any("recv" in line for line in plans["b0"].text())
    for host in hosts.values():
        assert host.runner.held() == Held(), host.runner.held()  # nothing left of the run



@pytest.mark.parametrize("parallel", [1, 4])
async def test_a_host_that_loses_the_predicate_tells_its_peers_and_none_waits(hosts, parallel):
    """b0 cannot read iteration 0's predicate: it leaves the loop and aborts the frame at a0,
    whose receives from b0 then fail at once with the cause instead of waiting their timeout."""
    program = loop_program(cross=True, parallel=parallel)
    plans = host_plans(lower(program, PLACES, check=True))
    (pred,) = [s for s in plans["b0"].steps if isinstance(s, Recv) and s.tag.startswith("p.")]
    (frame,) = [s.frame for s in plans["b0"].steps if isinstance(s, Enter)]
    broken = Shards([([(0, 1)], np.zeros(3, np.bool_))])  # does not assemble
    hosts["b0"].deliver("r0", f"{pred.tag}@a0/{frame}:0", broken)
    (x, n), _ = await run(hosts, program, [np.arange(3, dtype=np.float32), np.int32(0)])
    assert isinstance(x, Failed) and "left loop iteration 0 of loop" in x.cause, x
    assert value(n, np.int32, ()) == 5  # the counter never needed b0
    for host in hosts.values():
        assert host.runner.held() == Held(), host.runner.held()  # nothing left of the run


async def test_a_computation_that_failed_to_compile_fails_saying_where_in_the_loop(hosts):
    (x, n), _ = await run(hosts, loop_program(cross=True), [np.ones(3, np.float32), np.int32(0)],
                          broken="double")
    assert isinstance(x, Failed), x
    assert "double (in iteration 0 of loop" in x.cause and "declared 2 inputs" in x.cause, x.cause
    assert value(n, np.int32, ()) == 5
    for host in hosts.values():
        assert host.runner.held() == Held(), host.runner.held()  # nothing left of the run


async def test_a_run_fails_when_a_computation_of_a_branch_not_taken_did_not_compile(hosts):
    """As a jax.jit of the program would: whether it fails does not hang on the branch taken,
    nor on when the compiler answered."""
    (y,), _ = await run(hosts, cond_program(), [np.arange(1, 4, dtype=np.float32)], broken="minus")
    assert isinstance(y, Failed), y  # x > 0: "plus" is taken, on the other host
    assert "of the program" in y.cause and "did not compile" in y.cause and "declared 2 inputs" in y.cause
    for host in hosts.values():
        assert host.runner.held() == Held(), host.runner.held()  # nothing left of the run


@pytest.mark.parametrize("parallel", [1, 4])
async def test_a_loop_past_its_limit_ends_failed_on_every_host(hosts, parallel):
    program = loop_program(cross=True, parallel=parallel, bound=2**30)  # a billion iterations
    inputs = [np.ones(3, np.float32), np.int32(0)]
    (x, n), _ = await asyncio.wait_for(run(hosts, program, inputs, limit=0.5), 60)
    for reply in (x, n):
        assert isinstance(reply, Failed) and "looped past its limit of 0.5s" in reply.cause, reply
    for host in hosts.values():
        assert host.runner.held() == Held(), host.runner.held()  # nothing left of the run


@pytest.mark.parametrize("parallel", [1, 4])
async def test_a_cancelled_run_ends_its_loop_on_every_host(hosts, parallel):
    program = loop_program(cross=True, parallel=parallel, bound=2**30)
    running = asyncio.create_task(run(hosts, program, [np.ones(3, np.float32), np.int32(0)]))

    async def inside() -> None:  # both hosts in the loop
        while not all(h.runner.held().frames for h in hosts.values()):
            assert not running.done()
            await asyncio.sleep(0.01)

    await asyncio.wait_for(inside(), 30)
    for host in hosts.values():
        assert await host.cancel(["r0", "never-taken"], "client c was closed") == 1
    (x, n), _ = await asyncio.wait_for(running, 60)
    for reply in (x, n):
        assert isinstance(reply, Failed) and "client c was closed" in reply.cause, reply
    for host in hosts.values():
        assert host.runner.held() == Held(), host.runner.held()  # nothing left of the run


class Gated(Wired):
    """As b0: holds its value of iteration k for a0 until a0's predicate of iteration k + 1
    has come, which a host running one iteration at a time never sends first."""

    def __init__(self, name):
        super().__init__(name)
        self.lock = threading.Lock()
        self.predicates: set[int] = set()
        self.held: dict[int, tuple] = {}

    def deliver(self, run_id, tag, payload):
        super().deliver(run_id, tag, payload)
        if tag.startswith("p."):
            k = int(tag.rsplit(":", 1)[1])
            with self.lock:
                self.predicates.add(k)
                held = self.held.pop(k - 1, None)
            if held is not None:
                self.peers["a0"].deliver(*held)

    def _deliver(self, to, run_id, tag, payload):
        if not tag.startswith("t") or isinstance(payload, Dead):  # an abort, the last iteration's: at once
            self.peers[to].deliver(run_id, tag, payload)
            return
        k = int(tag.rsplit(":", 1)[1])
        with self.lock:
            if k + 1 not in self.predicates:
                self.held[k] = (run_id, tag, payload)
                return
        self.peers[to].deliver(run_id, tag, payload)


async def test_with_parallel_iterations_a_host_runs_the_next_iteration_while_it_waits():
    """a0 gets x back from b0 for iteration k only after it has sent b0 the predicate of
    iteration k + 1: with two iterations at once it does, and the loop ends right."""
    hosts = {"a0": Wired("a0"), "b0": Gated("b0")}
    Wired.peers = hosts
    try:
        x0 = np.arange(3, dtype=np.float32)
        (x, n), plans = await run(hosts, loop_program(cross=True, parallel=2), [x0, np.int32(0)])
        np.testing.assert_array_equal(value(x, np.float32, (3,)), x0 * 2**5)
        assert value(n, np.int32, ()) == 5
        assert hosts["b0"].predicates == set(range(6)) and not hosts["b0"].held  # none timed out
        assert [s.parallel for s in plans["a0"].steps if isinstance(s, Enter)] == [2]
        assert any("parallel_iterations 2" in line for line in plans["a0"].text())
        for host in hosts.values():
            assert host.runner.held() == Held(), host.runner.held()
    finally:
        for host in hosts.values():
            host.close()
