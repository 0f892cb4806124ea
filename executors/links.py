"""How the server reaches each executor: its Ray actor, and its channel for the requests on
every call's path (`executors.channel`).

Contract:
- `call(host, method, *args)` sends one request: over the host's channel where it has one
  and the method is served there (`ray_host.DIRECT`), else as an actor call. A request
  nobody reads the answer of (`ray_host.TOLD`) goes over the channel as a one-way frame and
  returns None; any other returns its answer's future or ObjectRef.
- `answer(ref, host, timeout, what)` awaits one: a host that is gone, or silent past
  `timeout`, raises `Unavailable`; one whose request failed raises `RemoteError`. Never a hang.
- `connect(handles)` opens new executors' channels (each asks first for the secret the
  links hand it through Ray) and learns where each takes its peers' sends; `tell_peers` and
  `tell_addresses` hand every executor its peers' actors and those addresses, so that a
  value inside a program goes executor to executor. A host that does not take them is
  logged (it sends through Ray meanwhile), never fatal.
- `on_lost(host, why)` is told on the event loop when a host's channel ends other than by
  the server closing it (`retire`, `close`): the executor is gone, or unreachable.
- `form_group(handles, hosts)`: the hosts join one JAX distributed group, all at once.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import ray

from executors.channel import SECRET_BYTES, Channel
from executors.memory import Budget
from executors.options import RayOptions
from executors.ray_host import DIRECT, TOLD, new_actor
from executors.replies import actor_gone
from ir import RemoteError, Unavailable
from resource_manager import HostSpec

log = logging.getLogger("isthmus.executors")


def new_executor(host: HostSpec, hosts: Iterable[HostSpec], options: RayOptions, generation: int) -> Any:
    """An executor for `host`, its memory budgets shared with the cluster's other hosts
    on its machine: those pinned to its node, or, unpinned, every other unpinned host (all
    on one machine in the embedded default; fewer share a machine wherever Ray spreads them,
    so the share is never too large)."""
    sharing = sum(1 for h in hosts if h.node == host.node)
    return new_actor(host, options.namespace, options.wait_timeout_s, options.in_flight, generation,
                     options.detached, Budget(options.temp_mb, options.buffer_mb, max(1, sharing),
                                                       options.stack_mb, options.swap_mb))


async def _answer(ref: Any) -> Any:
    while isinstance(ref, Future | ray.ObjectRef):
        ref = await asyncio.wrap_future(ref if isinstance(ref, Future) else ref.future())
    return ref


class Links:
    def __init__(self, handles: Mapping[str, Any], options: RayOptions) -> None:
        self.handles = dict(handles)  # host -> its executor's actor
        self.channels: dict[str, Channel] = {}
        self.addresses: dict[str, tuple[str, int]] = {}  # host -> where its executor takes peers' sends
        self.options = options
        self._secret = secrets.token_bytes(SECRET_BYTES)  # what an executor's channel asks first
        # Told (host, why) on the event loop when a host's executor is lost (its channel ended).
        self.on_lost: Callable[[str, str], None] | None = None

    def call(self, host: str, method: str, *args: Any, direct: bool = True) -> Any:
        """Send one request to a host (see the module); `direct` False: as an actor call."""
        channel = self.channels.get(host)
        if channel is None or not direct or method not in DIRECT:
            return getattr(self.handles[host], method).remote(*args)
        if method in TOLD:
            channel.tell(method, *args)
            return None
        return channel.call(method, *args)

    async def answer(self, ref: Any, host: str, timeout: float | None, what: str) -> Any:
        """The answer to `ref`: a Ray ObjectRef, or a future of one or of the answer itself
        (a coalesced message's, or one sent later with the gang order off)."""
        try:
            return await asyncio.wait_for(_answer(ref), timeout)
        except TimeoutError:
            raise Unavailable(f"host {host} did not answer {what} within {timeout:g}s") from None
        except ray.exceptions.RayActorError as e:
            raise Unavailable(actor_gone(host, e)) from None
        except ray.exceptions.RayTaskError as e:
            raise RemoteError(f"{what} on host {host} failed: {e}") from None

    async def form_group(self, handles: Mapping[str, Any], hosts: Sequence[str]) -> None:
        timeout = self.options.group_timeout_s
        address = await self.answer(handles[hosts[0]].coordinator_address.remote(), hosts[0], timeout,
                                    "coordinator")
        await asyncio.gather(*(
            self.answer(handles[h].join_group.remote(address, len(hosts), k, timeout), h, timeout + 10,
                        "join the island's JAX group")
            for k, h in enumerate(hosts)
        ))

    async def connect(self, handles: Mapping[str, Any]) -> dict[str, Channel]:
        """Open these executors' channels (all, or none: those opened are closed if one fails)."""
        timeout = self.options.group_timeout_s

        async def one(host: str, handle: Any) -> Channel:
            address, port, peer_port = await self.answer(handle.open_channel.remote(self._secret), host,
                                                         timeout, "open its channel")
            channel = await Channel.connect(host, address, port, self._secret, timeout)
            channel.on_lost = lambda why: self._lost(host, channel, why)
            self.addresses[host] = (address, peer_port)
            return channel

        opened = await asyncio.gather(*(one(h, a) for h, a in handles.items()), return_exceptions=True)
        channels = {h: c for h, c in zip(handles, opened, strict=True) if isinstance(c, Channel)}
        failed = next((c for c in opened if isinstance(c, BaseException)), None)
        if failed is not None:
            for c in channels.values():
                c.close()
            raise failed
        return channels

    def _lost(self, host: str, channel: Channel, why: str) -> None:
        """A host's channel ended other than by the server closing it: tell `on_lost`, if it
        is still that host's channel."""
        if self.channels.get(host) is channel and self.on_lost is not None:
            self.on_lost(host, why)

    async def tell_peers(self, handles: Mapping[str, Any]) -> None:
        """Tell these executors their peers' actors (executors taken over from a previous
        server know older ones), then where the peers' channels are."""
        told = await asyncio.gather(*(self.answer(a.set_peers.remote(handles), h, 30, "take its peers")
                                      for h, a in handles.items()), return_exceptions=True)
        for h, outcome in zip(handles, told, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("host %s did not take its peers: %s", h, outcome)
        await self.tell_addresses(handles)

    async def tell_addresses(self, handles: Mapping[str, Any]) -> None:
        """Tell these executors where each host's channel is (`RayHost.set_peer_addresses`)."""
        if not self.options.peer_links:
            return
        addresses = dict(self.addresses)
        told = await asyncio.gather(
            *(self.answer(a.set_peer_addresses.remote(addresses), h, 30, "take its peers' addresses")
              for h, a in handles.items()), return_exceptions=True)
        for h, outcome in zip(handles, told, strict=True):
            if isinstance(outcome, BaseException):
                log.warning("host %s did not take its peers' channel addresses: %s", h, outcome)

    def retire(self, host: str) -> None:
        """Kill a host's executor and close its channel (quietly: it may be gone already)."""
        try:
            ray.kill(self.handles[host])
        except Exception as e:  # an actor already dead, or its node
            log.info("host %s: its executor could not be killed: %s", host, e)
        if (channel := self.channels.pop(host, None)) is not None:
            channel.close()

    def close(self, keep_executors: bool = False) -> None:
        """Close every channel, and kill every executor unless `keep_executors`."""
        for channel in self.channels.values():
            try:
                channel.close()
            except RuntimeError as e:  # its event loop has ended: nothing is left to close
                log.debug("channel: %s", e)
        self.channels.clear()
        for h in [] if keep_executors else self.handles.values():
            try:
                ray.kill(h)
            except Exception as e:  # a host already gone is what shutdown wants
                log.debug("kill: %s", e)
        self.handles.clear()
