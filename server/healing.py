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
- `restart` is the one path of automatic restarts: a host lost, a failed cross-host
  collective (`Service.restart_when_broken`), and a runaway (below).
  `POST /v1/islands/{name}/restart` stays for operators.
- Runaways: XLA cannot stop a computation it has started, so a host busy with one that
  never ends (a `lax.while_loop` whose test stays true) would run nothing else, any
  client's, for good. `stop(records, cause)` is told of the programs and computations of a
  client closed or of a slice deleted; a probe that finds a host still busy with a run of
  one of them (`Host.stats`: `longest_run`) `STOP_GRACE_S` after, busy with one run past
  `max_hold_s` while another client's work is queued or admitted on the host (one tenant
  holds a host it shares for at most that long), or busy with any run past `max_run_s` and
  the grace, replaces that host's executor. Such a host still answers,
  so the values it gives are kept first (`server.keeping`), as where a failed collective
  restarts a group; the rest are lost as a lost host's are (made again from their lineage
  when read, where it is kept).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ir import IsthmusError, Unavailable
from server.keeping import keep_values

if TYPE_CHECKING:
    from server.service import Service

log = logging.getLogger("isthmus.server")
STOP_GRACE_S = 10.0  # how long a run told to stop may keep its host busy before it is stopped
STOPPED_KEPT = 1 << 16  # programs and computations told to stop, remembered (newest kept)


class Healer:
    def __init__(self, service: Service, clock: Callable[[], float] = time.monotonic) -> None:
        self.service = service
        self._clock = clock
        # program or computation id -> why its runs must stop, and since when (`clock`)
        self._stopped: OrderedDict[str, tuple[str, float]] = OrderedDict()
        # a looping run told to end for holding a shared host -> since when (`clock`)
        self._held: OrderedDict[str, float] = OrderedDict()

    def stop(self, records: Iterable[str], cause: str) -> None:
        """These programs' and computations' runs must stop (their client closed, their slice
        deleted): a host still busy with one after the grace gets a new executor."""
        now = self._clock()
        for r in records:
            self._stopped[r] = (cause, now)
            self._stopped.move_to_end(r)
        while len(self._stopped) > STOPPED_KEPT:
            self._stopped.popitem(last=False)

    def runaway(self, stats: Mapping[str, Any], host: str = "") -> str | None:
        """Why the host of these stats must be stopped, if it must: busy with a run told to
        stop past the grace, with one past `max_hold_s` while another client's work waits
        for the host, or with any run past its limit."""
        run, busy_s = stats.get("longest_run"), stats.get("longest_run_s")
        if not isinstance(run, str) or not isinstance(busy_s, int | float) or busy_s <= STOP_GRACE_S:
            return None
        s, hold = self.service, self.service.settings.max_hold_s
        if busy_s > hold and host and s.gangs.others_wait(s.rm.host_island(host), host, run):
            why = (f"one run kept it busy {busy_s:.0f}s, past max_hold_s ({hold:g}s), while another "
                   "client's work waited for it")
            if self._ends_its_loops(run, why):
                return None
            log.warning("host %s busy with run %s for %.0fs while another client's work waits: its "
                        "executor is replaced", host, run, busy_s)
            return f"{why}: a computation XLA has started stops only with its executor"
        stopped = self._stopped.get(run.partition("/")[0])  # a run's id begins with its record's
        if stopped is not None and self._clock() - stopped[1] > STOP_GRACE_S:
            # Said to every client with values on the host: neither the run nor its client
            # is named (the log names them).
            log.warning("host busy with run %s after %s (%.0fs on it): its executor is replaced",
                        run, stopped[0], busy_s)
            return (f"a run was still running {STOP_GRACE_S:g}s after it was told to stop (its client "
                    f"closed, or its slice deleted; {busy_s:.0f}s on it): a computation XLA has started "
                    "stops only with its executor")
        limit = self.service.settings.max_run_s
        if busy_s > limit + STOP_GRACE_S:
            return (f"run {run} kept its host busy {busy_s:.0f}s, past max_run_s ({limit:g}s): a "
                    "computation XLA has started stops only with its executor")
        return None

    def _ends_its_loops(self, run: str, why: str) -> bool:
        """Whether a run with in-graph loops was told to end them (each ends at its next
        test, failed with `why`) within the grace, so that its host's executor is left be;
        told now if it was not yet."""
        now = self._clock()
        since = self._held.get(run)
        if since is None:
            if not self.service.programs.cancel_run(run, why):
                return False  # one computation, not loops: only its executor stops it
            self._held[run] = since = now
            while len(self._held) > STOPPED_KEPT:
                self._held.popitem(last=False)
        return now - since <= STOP_GRACE_S

    def host_lost(self, host: str, why: str) -> None:
        self.replace(host, f"host {host} was lost: {why}")

    def replace(self, host: str, cause: str, keep: bool = False) -> None:
        """A new executor for the host (its island's, where that is one JAX group), in the
        background. Its values are lost; those it still gives are kept first where `keep`
        (the host answers: `server.keeping`)."""
        s = self.service
        try:
            island = s.rm.host_island(host)
        except IsthmusError:
            return
        if island in s.restarting or s.rm.host_status(host) != "up":
            return
        if not keep:  # else lost once kept, by the restart
            lost = s.lose_values([host], cause)  # readers fail now, not after the restart
            stopped = s.programs.cancel_on([host], cause)  # its loops' other hosts stop too
            log.warning("island %s: %s; %d values with it, %d looping runs stopped", island, cause,
                        len(lost), stopped)
        self.restart(island, cause, only=[host], keep=keep)

    def restart(self, island: str, cause: str, only: Sequence[str] | None = None, keep: bool = False) -> None:
        """Restart `only` these hosts of the island (all if None; the whole island where it
        is one JAX group) in the background, unless it is restarting already; where `keep`,
        the values the hosts still give are kept first."""
        s = self.service
        if island in s.restarting:
            return
        s.restarting.add(island)
        s.spawn(self._heal(island, cause, only, time.monotonic(), keep))

    async def restart_claimed(self, island: str, cause: str, only: Sequence[str] | None = None,
                              keep: bool = False) -> int:
        """Restart an island the caller has put in `restarting` (this takes it out): `only`
        these hosts where the island is not one JAX group. A host whose Ray node is gone is
        dropped (marked down) instead. Where `keep`, the values the hosts still give are kept
        in lineage first (`server.keeping`). Returns how many buffers were lost."""
        s = self.service
        log.warning("island %s: restarting %s (%s)", island,
                    "its executors" if only is None else f"the executors of {list(only)}", cause)
        s.gangs.pause(island)  # what is submitted meanwhile runs on the new executors
        whole = only is None or island in s.pool.groups  # (a JAX group restarts whole)
        hosts = s.pool.islands.get(island, ()) if whole else only
        try:
            if keep:
                await self._keep(island, hosts)
            s.programs.cancel_on(hosts, f"island {island} is restarting ({cause})")
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

    async def _keep(self, island: str, hosts: Sequence[str]) -> None:
        """Keep what the hosts still give; a failure to keep loses the values, as before."""
        try:
            kept, asked = await keep_values(self.service, hosts)
        except Exception:
            log.exception("island %s: keeping the values of %s before the restart failed", island,
                          list(hosts))
            return
        log.warning("island %s: %d of %d values read off %s before their executors are replaced", island,
                    kept, asked, list(hosts))

    async def _heal(self, island: str, cause: str, only: Sequence[str] | None, since: float,
                    keep: bool = False) -> None:
        """Restart, retrying with a doubling pause."""
        s = self.service
        delay = 1.0
        for attempt in range(1, s.settings.heal_attempts + 1):
            try:
                await self.restart_claimed(island, cause, only, keep=keep and attempt == 1)
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
            elif isinstance(answer, dict) and (why := self.runaway(answer, h)) is not None:
                s.lineage.stopped(answer["longest_run"], why)  # not repeated when its outputs are read
                self.replace(h, f"host {h} was stopped: {why}", keep=True)
