"""Islands that heal by themselves: a lost host gets a new executor without anyone asking.

Contract:
- `Healer.host_lost(host, why)` is how a lost host is reported: by the pool the moment the
  host's channel ends (`ExecutorPool.on_host_lost`: its executor is gone), and by the
  health probe (`probe_forever`: every `health_probe_s` each host is asked for its stats;
  one that does not answer within `health_timeout_s`, or whose channel is gone, is lost).
- The values the host held are lost at once (reading one says why, without waiting for
  the restart), and every run with loops on the host ends on its other hosts too, failed
  with the cause (`Programs.cancel_on`): a loop whose predicate another host computes would
  otherwise go on, sending each iteration to the new executor, which never took the run.
  Then the host gets a new executor (the whole island does where it is one
  JAX group, formed again), as `Service.restart_island` does it: what was queued there is
  numbered for the new one. A host whose Ray node is gone is marked down instead, and new
  slices avoid it. One restart at a time per island: a report for an island already
  restarting, or for a host marked down, changes nothing. A restart that fails is tried again
  after 1, 2, 4, ... seconds, `heal_attempts` times in all; past that the next probe that
  finds the host lost starts again. Meanwhile calls there fail typed, never hang.
- `restart_claimed` is the one way executors are replaced (the operator's
  `Service.restart_island` too): the gang paused, the loops on the hosts replaced ended,
  the pool's executors replaced, the values lost, the programs compiled again, the gang
  resumed.
- `restart` is the one path of automatic restarts: a host lost, and a failed cross-host
  collective (`Service.restart_when_broken`). `POST /v1/islands/{name}/restart` stays for
  operators.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ir import IsthmusError, Unavailable

if TYPE_CHECKING:
    from server.service import Service

log = logging.getLogger("isthmus.server")


class Healer:
    def __init__(self, service: Service) -> None:
        self.service = service

    def host_lost(self, host: str, why: str) -> None:
        s = self.service
        try:
            island = s.rm.host_island(host)
        except IsthmusError:
            return
        if island in s.restarting or s.rm.host_status(host) != "up":
            return
        cause = f"host {host} was lost: {why}"
        lost = s.lose_values([host], cause)  # readers fail now, not after the restart
        stopped = s.programs.cancel_on([host], cause)  # its loops' other hosts stop too
        log.warning("island %s: %s; %d values with it, %d looping runs stopped", island, cause, len(lost),
                    stopped)
        self.restart(island, cause, only=[host])

    def restart(self, island: str, cause: str, only: Sequence[str] | None = None) -> None:
        """Restart `only` these hosts of the island (all if None; the whole island where it
        is one JAX group) in the background, unless it is restarting already."""
        s = self.service
        if island in s.restarting:
            return
        s.restarting.add(island)
        s.spawn(self._heal(island, cause, only, time.monotonic()))

    async def restart_claimed(self, island: str, cause: str, only: Sequence[str] | None = None) -> int:
        """Restart an island the caller has put in `restarting` (this takes it out): `only`
        these hosts where the island is not one JAX group. A host whose Ray node is gone is
        dropped (marked down) instead. Returns how many buffers were lost."""
        s = self.service
        log.warning("island %s: restarting %s (%s)", island,
                    "its executors" if only is None else f"the executors of {list(only)}", cause)
        s.gangs.pause(island)  # what is submitted meanwhile runs on the new executors
        whole = only is None or island in s.pool.groups  # (a JAX group restarts whole)
        s.programs.cancel_on(s.pool.islands.get(island, ()) if whole else only,
                             f"island {island} is restarting ({cause})")
        try:
            restarted, dropped = await s.pool.restart_island(island, only, cause)
            for h in dropped:
                s.rm.mark_host(h, "down")
                log.warning("island %s: host %s is gone with its Ray node; new slices avoid it", island, h)
            if island in s.pool.groups:  # hosts that joined since are in the new group
                s.rm.join_groups(s.pool.islands[island], s.pool.span)
            lost = s.lose_values([*restarted, *dropped], f"island {island} was restarted ({cause}), "
                                 "and the values on its hosts with it")
            s.programs.compile_again(set(restarted))  # computations too: their call programs
        finally:
            s.restarting.discard(island)
            s.gangs.resume(island)
        log.warning("island %s: restarted; %d buffers lost", island, len(lost))
        return len(lost)

    async def _heal(self, island: str, cause: str, only: Sequence[str] | None, since: float) -> None:
        """Restart, retrying with a doubling pause."""
        s = self.service
        delay = 1.0
        for attempt in range(1, s.settings.heal_attempts + 1):
            try:
                await self.restart_claimed(island, cause, only)
                log.warning("island %s: healed %.1fs after %s", island, time.monotonic() - since, cause)
                return
            except Exception as e:
                log.warning("island %s: restart %d of %d failed: %s", island, attempt,
                            s.settings.heal_attempts, e)
            if attempt == s.settings.heal_attempts:
                return
            await asyncio.sleep(delay)
            delay *= 2
            if island in s.restarting:  # an operator's restart meanwhile
                return
            s.restarting.add(island)

    async def probe_forever(self) -> None:
        s = self.service
        while True:
            await asyncio.sleep(s.settings.health_probe_s)
            try:
                await self.probe()
            except Exception:  # never let one bad probe stop the watch
                log.exception("probing the hosts failed")

    async def probe(self) -> None:
        """Ask every host not restarting for its stats, within the timeout; report the silent."""
        s = self.service
        hosts = [h for h in s.rm.hosts()
                 if s.rm.host_status(h) == "up" and s.rm.host_island(h) not in s.restarting]
        answers = await asyncio.gather(
            *(s.pool.stats(h, timeout=s.settings.health_timeout_s) for h in hosts), return_exceptions=True)
        for h, answer in zip(hosts, answers, strict=True):
            if isinstance(answer, Unavailable):
                self.host_lost(h, str(answer))
