"""Answers settled once their computations finish (`executors.settler`), with stand-in
arrays the test computes by hand."""

import gc
import threading
import weakref
from concurrent.futures import Future

import pytest

from executors.settler import Settler

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Array:
    def __init__(self, error: str | None = None) -> None:
        self.computed = threading.Event()
        self.error = error

    def block_until_ready(self) -> "Array":
        self.computed.wait()
        if self.error is not None:
            raise RuntimeError(self.error)
        return self


@pytest.fixture
def settler():
    s = Settler("settle-test")
    yield s
    s.close()


def test_an_answer_settles_once_all_its_arrays_are_computed(settler):
    a, b = Array(), Array()
    answer: Future[None] = Future()
    settler.add(answer, [[a], [b]])
    a.computed.set()
    assert not answer.done() and len(settler) == 1
    b.computed.set()
    assert answer.result(timeout=10) is None


def test_answers_settle_in_the_order_they_came(settler):
    first, second = Array(), Array()
    answers: list[Future[None]] = [Future(), Future()]
    settled: list[int] = []
    for i, (answer, array) in enumerate(zip(answers, (first, second), strict=True)):
        answer.add_done_callback(lambda _, i=i: settled.append(i))
        settler.add(answer, [array])
    second.computed.set()
    first.computed.set()
    answers[1].result(timeout=10)
    assert settled == [0, 1]


def test_a_failed_computation_counts_as_finished(settler):
    bad = Array(error="computation failed")
    answer: Future[None] = Future()
    settler.add(answer, [bad])
    bad.computed.set()
    assert answer.result(timeout=10) is None


def test_close_settles_what_still_waits():
    s = Settler("settle-test")
    never = Array()
    answers = [Future(), Future()]
    for answer in answers:
        s.add(answer, [never])
    s.close()
    assert all(a.done() for a in answers)
    never.computed.set()  # the thread, still waiting on it, then ends without settling twice


def test_a_settled_answer_leaves_its_arrays_to_whoever_else_holds_them(settler):
    array = Array()
    held = weakref.ref(array)
    answer: Future[None] = Future()
    settler.add(answer, [[array]])
    array.computed.set()
    answer.result(timeout=10)
    del array
    gc.collect()
    assert held() is None  # the idle thread keeps nothing alive (device memory, on a host)
