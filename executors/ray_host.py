"""The executor as a Ray actor: a `Host` that Ray starts, places and names, with its channel.

Contract:
- The server's requests on every call's path reach the actor over its channel
  (`executors.channel`, methods `DIRECT`); the rest are actor calls.
- A value one host sends another inside a program (`Runner`'s `Send`) goes executor to
  executor without the server: over a link to the peer's listener, which the dispatch
  thread writes itself and a thread of the peer's reads (`channel.Link`, `PeerListener`;
  opened on first use with the secret the server uses; the pool hands every executor its
  peers' addresses, `set_peer_addresses`). A payload over
  `PEER_FRAME_BYTES`, or one for a peer whose channel is unknown or lost, goes as an actor
  call through Ray's object store instead. A frame costs tens of microseconds where an actor
  call from an executor costs milliseconds on a small machine (docs/benchmarks.md). Either
  way a send is fire-and-forget: a peer that is gone is a host failure the server handles,
  and the receiving host times its wait out.
- Each actor is pinned to its node where the cluster names one (hard node affinity).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from executors.channel import Link, PeerListener, serve
from executors.host import Host
from executors.memory import MACHINE, Budget
from executors.messages import Payload, Shards, Whole
from executors.stats import HostStats, PeerSends
from ir import Unavailable
from resource_manager import HostSpec

log = logging.getLogger("isthmus.executors")

# A host's requests in progress at once. Requests that wait (reads for their value, runs
# reporting that they have run) hold a place while they wait, and Ray starts an actor's
# calls in no particular order: if waiting requests could take every place, the request
# they wait for would never start. So the pool keeps at most READS_PER_HOST reads waiting on
# a host, the gang window bounds the runs reporting back, and a host serves far more.
HOST_CONCURRENCY = 10_000
# The requests on every call's path go over each executor's channel (`executors.channel`);
# the rest, and uploads too large for a frame or bound for several hosts, through Ray.
DIRECT = frozenset({"run", "run_batch", "wait", "fetch", "fetch_shards", "put", "delete", "forget", "skip",
                    "states", "stats", "expect", "peers_lost", "cancel", "peer_missed", "trace", "clock"})
# Nobody reads their answer:
TOLD = frozenset({"put", "delete", "forget", "skip", "expect", "peers_lost", "cancel", "peer_missed"})
DIRECT_PUT_BYTES = 8 << 20
SERVED = DIRECT  # what an executor's channel answers: the server's requests
PEER_SERVED = frozenset({"deliver"})  # what the peers' listener calls: their sends
PEER_FRAME_BYTES = 8 << 20  # a larger send goes through Ray's object store
CONNECT_TIMEOUT_S = 10.0


ACTOR_PREFIX = "isthmus-host-"


def actor_name(host: str, generation: int = 0) -> str:
    """`isthmus-host-<host>`, then `.<generation>` for a replaced one (host names have no dot)."""
    return ACTOR_PREFIX + host + (f".{generation}" if generation else "")


def parse_actor_name(name: str) -> tuple[str, int] | None:
    """(host, generation) of an executor's actor name; None for any other name."""
    if not name.startswith(ACTOR_PREFIX):
        return None
    host, dot, generation = name[len(ACTOR_PREFIX):].partition(".")
    if not host or (dot and not generation.isdigit()):
        return None
    return host, int(generation or 0)


def new_actor(host: HostSpec, namespace: str, wait_timeout_s: int, in_flight: int, generation: int,
              detached: bool = False, budget: Budget = MACHINE) -> Any:
    """An executor for `host`; `detached`, it outlives the server that started it (a new
    server adopts it, `executors.islands`)."""
    options = _actor_options(host, wait_timeout_s, generation)
    if detached:
        options["lifetime"] = "detached"
    return ray.remote(RayHost).options(**options).remote(host.name, namespace, wait_timeout_s, in_flight,
                                                         budget)


def _actor_options(host: HostSpec, wait_timeout_s: int, generation: int) -> dict[str, Any]:
    # 64-bit types as the artifacts and uploads declare them: a client with jax_enable_x64
    # sends float64 / int64 values; a 32-bit client's are 32-bit already (it canonicalizes).
    env = {"PYTHONUNBUFFERED": "1", "JAX_ENABLE_X64": "true"}
    if host.platform == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        env["XLA_FLAGS"] = (f"--xla_force_host_platform_device_count={host.num_devices} "
                            f"--xla_cpu_collective_timeout_seconds={wait_timeout_s}")
        # XLA's CPU thread pool: 2 threads per device, whatever the core count, so that
        # overlapped multi-device collectives cannot deadlock (docs/architecture.md).
        env["PJRT_NPROC"] = str(2 * host.num_devices)
        # A one-device computation runs in the dispatch thread itself, not handed to XLA's
        # pool and waited for: the hand-off costs more than the overlap gains on CPU
        # (docs/architecture.md). Computations over several devices stay asynchronous.
        env["JAX_CPU_ENABLE_ASYNC_DISPATCH"] = "false"
        gpus = 0
    else:
        gpus = host.num_devices
        env["JAX_PLATFORMS"] = ""  # JAX's own choice (its GPU), not the server's cpu
    # num_cpus=0: executors are long-lived and must never wait for a CPU slot.
    options: dict[str, Any] = {
        "num_cpus": 0,
        "num_gpus": gpus,
        "name": actor_name(host.name, generation),
        "runtime_env": {"env_vars": env},
        "max_concurrency": HOST_CONCURRENCY,
    }
    if host.node is not None:  # a host discovered from a node's labels runs on that node only
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(host.node, soft=False)
    return options


def _nbytes(payload: Payload) -> int:
    if isinstance(payload, Whole):
        return int(payload.array.nbytes)
    if isinstance(payload, Shards):
        return sum(int(a.nbytes) for _, a in payload.shards)
    return 0


class RayHost(Host):
    """A `Host` whose sends go straight to the peer host: over its channel, else its actor."""

    def __init__(self, host: str, namespace: str, wait_timeout_s: float, in_flight: int,
                 budget: Budget) -> None:
        super().__init__(host, wait_timeout_s, in_flight, budget)
        self._namespace = namespace
        self._peers: dict[str, Any] = {}  # host -> its actor
        self._addresses: dict[str, tuple[str, int]] = {}  # host -> its peers' listener
        self._peer_listener: PeerListener | None = None
        self._links: dict[str, Link] = {}  # host -> the open link to its channel
        self._links_lock = threading.Lock()
        self._secret = b""
        self._node = ray.get_runtime_context().get_node_id()  # where it runs, for `stats`
        self._address = ray.util.get_node_ip_address()
        self._sent = {"link": 0, "ray": 0}  # sends to peers, by the way they went
        self._sent_bytes: dict[str, int] = {}  # peer host -> bytes of values sent to it
        self._sent_lock = threading.Lock()  # (runs send from several threads)

    def coordinator_address(self) -> str:
        """An address on this host's node where the island's JAX coordinator can listen."""
        with socket.socket() as sock:
            sock.bind(("", 0))
            port = sock.getsockname()[1]
        return f"{self._address}:{port}"

    async def open_channel(self, secret: bytes) -> tuple[str, int, int]:
        """Listen for the server's direct requests, and for peers' sends (`executors.channel`;
        the peers' listener once per executor, taking the latest server's secret); the
        address, the server's port and the peers' port."""
        self._secret = secret
        if self._peer_listener is None:
            self._peer_listener = PeerListener(self, lambda: self._secret, self._address, PEER_SERVED)
        address, port = await serve(self, secret, self._address, SERVED)
        return address, port, self._peer_listener.port

    def set_peers(self, peers: Mapping[str, Any]) -> None:
        """Use these actors for these hosts from now on (after an island's hosts restarted)."""
        self._peers.update(peers)

    def set_peer_addresses(self, addresses: Mapping[str, tuple[str, int]]) -> None:
        """Send to these hosts over their channels at these addresses from now on; a channel
        open to an old address (an executor since replaced) is closed."""
        with self._links_lock:
            for h, address in addresses.items():
                if self._addresses.get(h) != tuple(address) and (old := self._links.pop(h, None)):
                    old.close()
                self._addresses[h] = (address[0], int(address[1]))

    def _deliver(self, to: str, run_id: str, tag: str, payload: Payload) -> None:
        nbytes = _nbytes(payload)
        with self._sent_lock:
            self._sent_bytes[to] = self._sent_bytes.get(to, 0) + nbytes
        link = self._link(to) if nbytes <= PEER_FRAME_BYTES else None
        if link is not None:
            try:
                link.tell("deliver", run_id, tag, payload)
                self._sent["link"] += 1
                return
            except Unavailable as e:  # the peer's executor is gone (its actor says so), or replaced
                log.warning("host %s: %s; sending through Ray", self.host, e)
                with self._links_lock:
                    if self._links.get(to) is link:
                        del self._links[to]
        peer = self._peers.get(to)
        if peer is None:
            peer = self._peers[to] = ray.get_actor(actor_name(to), namespace=self._namespace)
        peer.deliver.remote(run_id, tag, payload)
        self._sent["ray"] += 1

    def stats(self) -> HostStats:
        """`Host.stats`; the Ray node this executor runs on and its address; how many sends
        to peers went over their channels and how many through Ray; the bytes sent to each."""
        with self._sent_lock:
            sent_bytes = tuple(self._sent_bytes.items())
        return replace(super().stats(), node=self._node, address=self._address,
                       peer_sends=PeerSends(self._sent["link"], self._sent["ray"]), peer_bytes=sent_bytes)

    def _link(self, to: str) -> Link | None:
        """The open link to a peer, connecting on first use; None where there is none to be
        had (its address unknown, or unreachable: then it is not tried again until the pool
        gives a new address)."""
        with self._links_lock:
            link = self._links.get(to)
            address = self._addresses.get(to)
        if link is not None or address is None:
            return link
        try:
            link = Link.connect(to, address[0], address[1], self._secret, CONNECT_TIMEOUT_S)
        except Unavailable as e:
            log.warning("host %s: %s; sending through Ray", self.host, e)
            with self._links_lock:
                if self._addresses.get(to) == address:
                    del self._addresses[to]
            return None
        with self._links_lock:
            if self._addresses.get(to) != address:  # replaced meanwhile: not this one
                link.close()
                return None
            kept = self._links.setdefault(to, link)
        if kept is not link:
            link.close()
        return kept
