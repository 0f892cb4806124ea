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


def test_a_read_cut_off_by_a_restart_over_before_it_hears_reads_again():
    """The read's executor is replaced while it waits; the restart is over, and the value
    made again by another read, by the time its `Unavailable` comes: it reads again. A
    read failing with no restart since it began fails."""
    from types import SimpleNamespace

    from ir import Unavailable
    from server.reads import _despite_restart

    async def scenario():
        service = SimpleNamespace(restarting=Restarts(), lost=set(),
                                  rm=SimpleNamespace(host_island=lambda h: "a"),
                                  settings=SimpleNamespace(fetch_timeout_s=5.0))
        rec = SimpleNamespace(id="b1", hosts=("a0",))
        tries = []

        async def read(service, rec):
            tries.append(len(tries))
            if len(tries) == 1:
                service.restarting.add("a")  # begun and over while the read waited
                service.restarting.discard("a")
                raise Unavailable("host a0: the executor's channel was closed by the server")
            return b"value"

        assert await _despite_restart(service, rec, read) == b"value" and tries == [0, 1]

        async def fails(service, rec):
            raise Unavailable("host a0 is down")

        with pytest.raises(Unavailable, match="a0 is down"):
            await _despite_restart(service, rec, fails)

    asyncio.run(scenario())
