"""Run messages coalesced per host and turn (`executors.outbox`), with a fake send: one
request per host a turn, a long burst leaving in pieces as it is made, and replies settled
from each request's answer."""

import asyncio
from concurrent.futures import Future
from typing import Any

import pytest

from executors.outbox import Outbox
from executors.runner import RunMessage

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def message(k: int) -> RunMessage:
    return RunMessage(f"r{k}", "plan", 0, 0, [], [], True, 1.0)


class Sent:
    """The fake send: records each request's sequence numbers, answers each message."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, list[int]]] = []

    def __call__(self, host: str, method: str, items: list[Any]) -> Future[Any]:
        assert method == "run_batch"
        self.requests.append((host, [seq for seq, _, _ in items]))
        answer: Future[Any] = Future()
        answer.set_result([f"ran {seq}" for seq, _, _ in items])
        return answer


def test_one_request_per_host_and_turn() -> None:
    sent = Sent()

    async def main() -> list[Any]:
        outbox = Outbox(sent, eager=100)
        replies = [outbox.add(h, k, message(k), None) for k in range(3) for h in ("h0", "h1")]
        assert sent.requests == []  # they leave at the turn's end
        await asyncio.sleep(0)
        return [r.result() for r in replies]

    assert asyncio.run(main()) == ["ran 0", "ran 0", "ran 1", "ran 1", "ran 2", "ran 2"]
    assert sent.requests == [("h0", [0, 1, 2]), ("h1", [0, 1, 2])]


def test_a_long_burst_leaves_in_pieces_while_it_is_made() -> None:
    sent = Sent()

    async def main() -> None:
        outbox = Outbox(sent, eager=4)
        for k in range(10):
            outbox.add("h0", k, message(k), None)
            if k == 3:
                assert sent.requests == [("h0", [0, 1, 2, 3])]  # before the turn ends
        await asyncio.sleep(0)

    asyncio.run(main())
    assert sent.requests == [("h0", [0, 1, 2, 3]), ("h0", [4, 5, 6, 7]), ("h0", [8, 9])]
