"""Executors a previous server left running, found and taken over by a new one.

Contract:
- Executors are detached named actors (`executors.ray_host.actor_name`): they outlive the
  server that started them, in the server's Ray namespace.
- `found(namespace)` names, per host, the newest executor alive there (and every executor
  actor, to kill what is not taken over: an old generation, a host no longer in the cluster).
- `take_over` asks each candidate to `adopt` (`Host.adopt`) within a deadline; one that does
  not answer is not taken over. Islands that are one JAX group are taken over whole or not
  at all (a group cannot take a new member).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from typing import Any

import ray

from executors.messages import Adopted
from executors.ray_host import parse_actor_name

log = logging.getLogger("isthmus.executors")


def found(namespace: str) -> tuple[dict[str, tuple[int, str]], list[str]]:
    """(host -> (generation, actor name) of its newest executor, every executor's name)."""
    newest: dict[str, tuple[int, str]] = {}
    names = []
    for actor in ray.util.list_named_actors(all_namespaces=True):
        parsed = parse_actor_name(actor["name"])
        if actor["namespace"] != namespace or parsed is None:
            continue
        names.append(actor["name"])
        host, generation = parsed
        if host not in newest or newest[host][0] < generation:
            newest[host] = (generation, actor["name"])
    return newest, names


async def take_over(candidates: Mapping[str, str], namespace: str, groups: Mapping[str, Iterable[str]],
                    cause: str, timeout: float) -> dict[str, tuple[Any, Adopted]]:
    """Adopt these executors (host -> actor name): those that answer, where every host of
    their JAX group does too. Returns host -> (actor handle, what it holds)."""
    async def one(host: str, name: str) -> tuple[Any, Adopted] | None:
        try:
            handle = ray.get_actor(name, namespace=namespace)
            ref: ray.ObjectRef[Adopted] = handle.adopt.remote(cause)
            adopted: Adopted = await asyncio.wait_for(asyncio.wrap_future(ref.future()), timeout)
            return handle, adopted
        except (TimeoutError, ValueError, ray.exceptions.RayError) as e:
            log.warning("host %s: its executor %s was not taken over: %s", host, name, e)
            return None

    answers = await asyncio.gather(*(one(h, n) for h, n in candidates.items()))
    taken = {h: a for h, a in zip(candidates, answers, strict=True) if a is not None}
    for island, hosts in groups.items():
        hosts = list(hosts)
        if any(h in taken for h in hosts) and not all(h in taken for h in hosts):
            log.warning("island %s: not every host's executor could be taken over; its JAX group "
                        "forms afresh (the values on it are lost)", island)
            for h in hosts:
                taken.pop(h, None)
    return taken


def kill(names: Iterable[str], namespace: str) -> None:
    """Kill these executors (quietly: one may be gone already)."""
    for name in names:
        try:
            ray.kill(ray.get_actor(name, namespace=namespace))
        except (ValueError, ray.exceptions.RayError) as e:
            log.info("executor %s: not killed: %s", name, e)
