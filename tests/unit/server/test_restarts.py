"""The islands being restarted (no Ray): a wait for a restart's end returns when it ends."""

import asyncio

import pytest

from server.restarts import Restarts

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def test_a_wait_returns_once_the_restart_is_over():
    async def scenario():
        r = Restarts()
        await r.over("a")  # not restarting: at once
        r.add("a")
        r.add("a")  # (claimed twice: still one restart)
        assert "a" in r and "b" not in r
        waiting = asyncio.ensure_future(r.over("a"))
        await asyncio.sleep(0)
        assert not waiting.done()
        r.discard("a")
        await asyncio.wait_for(waiting, 5)
        assert "a" not in r
        r.discard("a")  # idempotent

    asyncio.run(scenario())
