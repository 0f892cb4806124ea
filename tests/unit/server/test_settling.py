"""What the server knows of results from the hosts' answers (no Ray): a wait finds a run
settling and learns from its answers whether the result is known ready."""

import asyncio

import pytest

from server.settling import Settling

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def test_a_wait_that_comes_first_waits_for_the_answers():
    async def scenario():
        s = Settling()
        done = s.start(["y", "z"])
        waiting = asyncio.ensure_future(s.ready("y", timeout=5))
        await asyncio.sleep(0)
        assert not waiting.done()
        s.finish(done, ["y", "z"], ready={"y"})
        assert await waiting is True
        assert await s.ready("z", timeout=5) is False  # not named by every host: ask them
        assert s.known("y") and not s.known("z")

    asyncio.run(scenario())


def test_a_run_whose_answers_do_not_come_leaves_the_wait_to_ask_the_hosts():
    async def scenario():
        s = Settling()
        s.start(["y"])
        assert await s.ready("y", timeout=0.01) is False

    asyncio.run(scenario())


def test_a_later_run_writing_the_same_id_is_the_one_waited_for():
    async def scenario():
        s = Settling()
        first = s.start(["y"])
        second = s.start(["y"])
        s.finish(first, ["y"], ready={"y"})  # the first run's answer says nothing of the second's
        assert not s.known("y")
        s.finish(second, ["y"], ready=set())
        assert await s.ready("y", timeout=5) is False

    asyncio.run(scenario())


def test_forgotten_buffers_are_no_longer_known():
    async def scenario():
        s = Settling()
        done = s.start(["y"])
        s.finish(done, ["y"], ready={"y"})
        s.forget(["y"])
        assert not s.known("y") and len(s) == 0
        assert await s.ready("unknown", timeout=5) is False  # never settling: ask the hosts

    asyncio.run(scenario())
