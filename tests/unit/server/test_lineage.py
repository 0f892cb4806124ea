"""Lineage: which steps make a lost buffer again, what is kept for it, and when it cannot be."""

from __future__ import annotations

import pytest

from ir import Aval, DataLoss, Spec
from server.lineage import Lineage, Origin, Put, Repeat, Upload

pytestmark = pytest.mark.timeout(10)


def upload(n: int = 8) -> Upload:
    return Upload(b"\0" * n, "s-1", Aval((n,), "uint8"), Spec.of([None]))


def chain(lin: Lineage, length: int) -> list[Origin]:
    """x0 uploaded, then x{k+1} = f(x{k}), each run settled."""
    lin.uploaded("x0", upload())
    origins = []
    for k in range(length):
        o = Origin("f", "cl", (f"x{k}",), (f"x{k + 1}",))
        lin.ran(o)
        lin.settled([f"x{k + 1}"])
        origins.append(o)
    return origins


def test_a_lost_upload_is_put_again() -> None:
    lin = Lineage(1 << 20, 100)
    lin.uploaded("x", upload())
    assert lin.recipe("x", lambda b: False) == [Put("x", lin.uploads["x"])]


def test_a_lost_result_repeats_only_what_is_missing_in_order() -> None:
    lin = Lineage(1 << 20, 100)
    origins = chain(lin, 3)
    live = {"x0", "x1"}  # x2 and x3 were lost with their host
    assert lin.recipe("x3", live.__contains__) == [Repeat(origins[1]), Repeat(origins[2])]
    lost_all = lin.recipe("x3", lambda b: False)
    assert [type(s) for s in lost_all] == [Put, Repeat, Repeat, Repeat]


def test_a_run_with_two_outputs_is_repeated_once() -> None:
    lin = Lineage(1 << 20, 100)
    lin.uploaded("a", upload())
    both = Origin("g", "cl", ("a",), ("p", "q"))
    lin.ran(both)
    lin.settled(["p", "q"])
    join = Origin("h", "cl", ("p", "q"), ("r",))
    lin.ran(join)
    lin.settled(["r"])
    assert lin.recipe("r", {"a"}.__contains__) == [Repeat(both), Repeat(join)]


def test_a_run_that_never_finished_is_repeated_once_then_data_loss() -> None:
    lin = Lineage(1 << 20, 100)
    lin.uploaded("a", upload())
    f = Origin("f", "cl", ("a",), ("b",))
    lin.ran(f)  # never settled: in flight when its host died
    assert lin.recipe("b", {"a"}.__contains__) == [Repeat(f)]
    lin.repeating(f, "f/1.2")  # (as `server.remake` repeats it) and lost again before it finished
    with pytest.raises(DataLoss, match="did not finish, nor did it when repeated"):
        lin.recipe("b", {"a"}.__contains__)
    lin.settled(["b"])  # a repeat that finished: repeated again as any finished run
    assert lin.recipe("b", {"a"}.__contains__) == [Repeat(f)]


def test_a_run_stopped_on_purpose_is_not_repeated() -> None:
    lin = Lineage(1 << 20, 100)
    lin.uploaded("a", upload())
    lin.ran(f := Origin("f", "cl", ("a",), ("b", "c"), run="f/1.1"))
    lin.ran(Origin("g", "cl", ("a",), ("d",), run="g/1.2"))
    lin.stopped("f/1.1", "it held its host too long")
    for b in ("b", "c"):
        with pytest.raises(DataLoss, match="was stopped: it held its host too long"):
            lin.recipe(b, {"a"}.__contains__)
    assert f.stopped is not None and [type(s) for s in lin.recipe("d", {"a"}.__contains__)] == [Repeat]


def test_a_value_kept_off_its_host_is_put_again_whatever_its_runs_left() -> None:
    lin = Lineage(1 << 20, max_released=0)
    chain(lin, 2)
    lin.release("x0")  # past max_released: x0 goes, and x1 and x2 cannot be computed again
    with pytest.raises(DataLoss, match="x0, which x2 was computed from"):
        lin.recipe("x2", lambda b: False)
    lin.keep("x2", upload())  # read off its host before it was replaced (`server.keeping`)
    assert lin.recipe("x2", lambda b: False) == [Put("x2", lin.uploads["x2"])]
    lin.release("x2")
    assert not lin.uploads and lin.upload_bytes == 0


def test_released_inputs_are_kept_for_the_lineage_of_live_buffers_and_dropped_after() -> None:
    lin = Lineage(1 << 20, 100)
    chain(lin, 2)
    lin.release("x0")
    lin.release("x1")  # both still read by x2's lineage
    assert [type(s) for s in lin.recipe("x2", lambda b: False)] == [Put, Repeat, Repeat]
    lin.release("x2")  # nothing needs any of it now
    assert not lin.origins and not lin.uploads and lin.upload_bytes == 0


def test_past_its_bounds_lineage_is_dropped_and_says_so() -> None:
    lin = Lineage(1 << 20, max_released=1)
    chain(lin, 3)
    lin.release("x0")
    lin.release("x1")  # x0 goes: only one released buffer is kept
    with pytest.raises(DataLoss, match=r"x0.*is gone"):
        lin.recipe("x3", lambda b: False)
    small = Lineage(max_bytes=10, max_released=100)
    small.uploaded("a", upload(8))
    small.uploaded("b", upload(8))  # the oldest upload goes
    assert list(small.uploads) == ["b"] and small.upload_bytes == 8
    with pytest.raises(DataLoss, match="ISTHMUS_LINEAGE_MB"):
        small.recipe("a", lambda b: False)


def test_a_closed_client_leaves_no_lineage() -> None:
    lin = Lineage(1 << 20, 100)
    chain(lin, 3)
    lin.drop_owner("cl")
    lin.release("x0")
    assert not lin.origins and not lin.uploads


def test_a_released_id_taken_again_ends_the_lineage_that_read_it() -> None:
    """x1 = f(x0); x0 is released and its id taken by a new upload (by anyone): making x1
    again must not read the new x0. It is data loss, named."""
    lin = Lineage(1 << 20, 100)
    chain(lin, 1)
    lin.release("x0")  # kept: x1's lineage reads it
    lin.uploaded("x0", upload(4))  # another buffer, the same id
    assert lin.upload_bytes == 4  # the old upload's bytes are not counted twice
    with pytest.raises(DataLoss, match="x0, which x1 was computed from, was released and its id taken"):
        lin.recipe("x1", {"x0"}.__contains__)
    assert lin.recipe("x0", lambda b: False) == [Put("x0", lin.uploads["x0"])]  # the new one's own lineage


def test_a_run_with_many_outputs_is_let_go_once_all_are_released() -> None:
    lin = Lineage(1 << 20, 100)
    lin.uploaded("a", upload())
    outs = tuple(f"o{k}" for k in range(5000))
    lin.ran(Origin("g", "cl", ("a",), outs))
    lin.settled(outs)
    lin.release("a")  # kept while any output's lineage reads it
    for b in outs[:-1]:
        lin.release(b)
    assert "a" in lin.uploads
    lin.release(outs[-1])
    assert not lin.origins and not lin.uploads and lin.upload_bytes == 0


def test_a_chain_lost_link_by_link_names_only_its_first_cause():
    """Each run whose input was lost before it ran says which, and the first cause: the
    message does not nest once per link of the chain (it grew with every one)."""
    from server.buffers import first_cause

    why = "island b was restarted (host b0 was lost (its executor's channel was lost)), and the values"
    for i in range(50):
        why = f"its input x{i} was lost before it ran ({first_cause(why)})"
    assert why == ("its input x49 was lost before it ran (island b was restarted (host b0 was lost (its "
                   "executor's channel was lost)), and the values)")


def test_past_the_bounds_the_client_keeping_the_most_loses_its_oldest_first() -> None:
    """One tenant's flood of uploads (or of released buffers kept for lineage) never pushes
    out another's that keeps less: the flooder's own go."""
    lin = Lineage(max_bytes=64, max_released=2)
    lin.uploaded("v0", upload(8), "victim")
    lin.uploaded("v1", upload(8), "victim")
    for k in range(20):
        lin.uploaded(f"a{k}", upload(8), "attacker")
    assert {"v0", "v1"} <= set(lin.uploads) and lin.upload_bytes <= 64
    assert [b for b in lin.uploads if b.startswith("a")] == [f"a{k}" for k in range(14, 20)]
    assert [type(s) for s in lin.recipe("v0", lambda b: False)] == [Put]
    lin.ran(Origin("g", "victim", ("v0",), ("y",)))
    lin.settled(["y"])
    lin.release("v0", "victim")  # kept: y's lineage reads it
    for k in range(14, 20):
        lin.ran(Origin("g", "attacker", (f"a{k}",), (f"z{k}",)))
        lin.settled([f"z{k}"])
        lin.release(f"a{k}", "attacker")
    assert [type(s) for s in lin.recipe("y", lambda b: False)] == [Put, Repeat]
