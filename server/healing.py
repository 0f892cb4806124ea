"""Islands that heal by themselves: a lost host gets a new executor without anyone asking.

Contract:
- `Healer.host_lost(host, why)` is how a lost host is reported: by the pool the moment the
  host's channel ends (`ExecutorPool.on_host_lost`: its executor is gone), and by the
  health probe (`probe_forever`: every `health_probe_s` each host is asked for its stats;
  one that does not answer within `health_timeout_s`, or whose channel is gone, is lost).
- The values the host held are lost at once (reading one says why, without waiting for
  the restart), and every run with loops on the host ends on its other hosts too, failed
  with the cause (`Loops.cancel_on`): a loop whose predicate another host computes would
  otherwise go on, sending each iteration to the new executor, which never took the run.
  Then the host gets a new executor (the whole island does where it is one
  JAX group, formed again), as `restart_island` does it: what was queued there is
  numbered for the new one. A host whose Ray node is gone is marked down instead, and new
  slices avoid it. One restart at a time per island: a report for an island already
  restarting, or for a host marked down, changes nothing. A restart that fails is tried again
  after 1, 2, 4, ... seconds, `heal_attempts` times in all; past that the next probe that
  finds the host lost starts again. Meanwhile calls there fail typed, never hang.
- `restart_claimed` is the one way executors are replaced (the operator's
  `restart_island` too): the gang paused, the loops on the hosts replaced ended,
  the pool's executors replaced, the values lost, the programs compiled again, the gang
  resumed.
- `restart` is the one path of automatic restarts: a host lost, a failed cross-host
  collective (`broken`), and a runaway (below).
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
- `lost` and `healed` count, per island, the hosts found lost and replaced, and the
  restarts begun by the healer itself that ended well (`server.cluster_metrics`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Sequence

from executors import ExecutorPool, HostStats
from ir import Conflict, IsthmusError, NotFound, Unavailable
from resource_manager import ResourceManager
from server.buffers import Buffers
from server.gang import Gangs
from server.keeping import keep_values
from server.lineage import Lineage
from server.loops import Loops
from server.lowerings import Lowerings
from server.restarts import Restarts
from server.settings import Settings
from server.tasks import Tasks

log = logging.getLogger("isthmus.server")
STOP_GRACE_S = 10.0  # how long a run told to stop may keep its host busy before it is stopped
STOPPED_KEPT = 1 << 16  # programs and computations told to stop, remembered (newest kept)


class Healer:
    def __init__(self, settings: Settings, rm: ResourceManager, pool: ExecutorPool, gangs: Gangs,
                 restarting: Restarts, buffers: Buffers, lineage: Lineage, loops: Loops, lowerings: Lowerings,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._settings = settings
        self._rm = rm
        self._pool = pool
        self._gangs = gangs
        self._restarting = restarting
        self._buffers = buffers
        self._lineage = lineage
        self._loops = loops
        self._lowerings = lowerings
        self._clock = clock
        self._tasks = Tasks()
        # program or computation id -> why its runs must stop, and since when (`clock`)
        self._stopped: OrderedDict[str, tuple[str, float]] = OrderedDict()
        # a looping run told to end for holding a shared host -> since when (`clock`)
        self._held: OrderedDict[str, float] = OrderedDict()
        self.lost: Counter[str] = Counter()  # island -> its hosts found lost (and replaced)
        self.healed: Counter[str] = Counter()  # island -> its automatic restarts that ended well

    def spawn_probe(self) -> None:
        """Probe the hosts every `health_probe_s`, for as long as the server runs."""
        self._tasks.spawn(self.probe_forever())

    def close(self) -> None:
        self._tasks.cancel()

    def stop(self, records: Iterable[str], cause: str) -> None:
        """These programs' and computations' runs must stop (their client closed, their slice
        deleted): a host still busy with one after the grace gets a new executor."""
        now = self._clock()
        for r in records:
            self._stopped[r] = (cause, now)
            self._stopped.move_to_end(r)
        while len(self._stopped) > STOPPED_KEPT:
            self._stopped.popitem(last=False)

    def runaway(self, run: str | None, busy_s: float | None, host: str = "") -> str | None:
        """Why `host` must be stopped, if it must, busy `busy_s` with `run` (the run it has been
        busy with the longest: `HostStats.longest_run`): busy with a run told to stop past the
        grace, with one past `max_hold_s` while another client's work waits for the host, or with
        any run past its limit."""
        if run is None or busy_s is None or busy_s <= STOP_GRACE_S:
            return None
        hold = self._settings.max_hold_s
        if busy_s > hold and host and self._gangs.others_wait(self._rm.host_island(host), host, run):
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
        limit = self._settings.max_run_s
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
            if not self._loops.cancel_run(run, why):
                return False  # one computation, not loops: only its executor stops it
            self._held[run] = since = now
            while len(self._held) > STOPPED_KEPT:
                self._held.popitem(last=False)
        return now - since <= STOP_GRACE_S

    def host_lost(self, host: str, why: str) -> None:
        self.replace(host, f"host {host} was lost: {why}")

    def broken(self, host: str, cause: str) -> None:
        """A host reported a failed collective: its island's group cannot run collectives
        again, so restart it (once; reports during the restart are ignored)."""
        island = self._rm.host_island(host)
        if island in self._pool.groups:
            self.restart(island, f"a collective failed: {cause}", keep=True)

    def replace(self, host: str, cause: str, keep: bool = False) -> None:
        """A new executor for the host (its island's, where that is one JAX group), in the
        background. Its values are lost; those it still gives are kept first where `keep`
        (the host answers: `server.keeping`)."""
        try:
            island = self._rm.host_island(host)
        except IsthmusError:
            return
        if island in self._restarting or self._rm.host_status(host) != "up":
            return
        if not keep:  # else lost once kept, by the restart
            self.lost[island] += 1
            lost = self._buffers.lose_values([host], cause)  # readers fail now, not after the restart
            stopped = self._loops.cancel_on([host], cause)  # its loops' other hosts stop too
            log.warning("island %s: %s; %d values with it, %d looping runs stopped", island, cause,
                        len(lost), stopped)
        self.restart(island, cause, only=[host], keep=keep)

    def restart(self, island: str, cause: str, only: Sequence[str] | None = None, keep: bool = False) -> None:
        """Restart `only` these hosts of the island (all if None; the whole island where it
        is one JAX group) in the background, unless it is restarting already; where `keep`,
        the values the hosts still give are kept first."""
        if island in self._restarting:
            return
        self._restarting.add(island)
        self._tasks.spawn(self._heal(island, cause, only, time.monotonic(), keep))

    async def restart_island(self, island: str, cause: str) -> int:
        """Replace the island's executors (an operator's restart); return how many buffers
        were lost with the old ones. Their records stay (reading them says why they are
        gone); computations and programs on the island compile again."""
        if island not in self._rm.islands():
            raise NotFound(f"island {island!r} does not exist (islands: {', '.join(self._rm.islands())})")
        if island in self._restarting:
            raise Conflict(f"island {island!r} is already restarting")
        self._restarting.add(island)
        return await self.restart_claimed(island, cause)

    async def restart_claimed(self, island: str, cause: str, only: Sequence[str] | None = None,
                              keep: bool = False) -> int:
        """Restart an island the caller has put in `restarting` (this takes it out): `only`
        these hosts where the island is not one JAX group. A host whose Ray node is gone is
        dropped (marked down) instead. Where `keep`, the values the hosts still give are kept
        in lineage first (`server.keeping`). Returns how many buffers were lost."""
        rm, pool = self._rm, self._pool
        log.warning("island %s: restarting %s (%s)", island,
                    "its executors" if only is None else f"the executors of {list(only)}", cause)
        self._gangs.pause(island)  # what is submitted meanwhile runs on the new executors
        hosts = pool.islands.get(island, ()) if only is None or island in pool.groups else only
        try:  # (a JAX group restarts whole)
            if keep:
                await self._keep(island, hosts)
            self._loops.cancel_on(hosts, f"island {island} is restarting ({cause})")
            restarted, dropped = await pool.restart_island(island, only, cause)
            for h in dropped:
                rm.mark_host(h, "down")
                log.warning("island %s: host %s is gone with its Ray node; new slices avoid it", island, h)
            if island in pool.groups:  # hosts that joined since are in the new group
                rm.join_groups(pool.islands[island], pool.span)
            lost = self._buffers.lose_values([*restarted, *dropped], f"island {island} was restarted "
                                             f"({cause}), and the values on its hosts with it")
            self._lowerings.compile_again(set(restarted))  # computations too: their call programs
        finally:
            self._restarting.discard(island)
            self._gangs.resume(island)
        log.warning("island %s: restarted; %d buffers lost", island, len(lost))
        return len(lost)

    async def _keep(self, island: str, hosts: Sequence[str]) -> None:
        """Keep what the hosts still give; a failure to keep loses the values, as before."""
        try:
            kept, asked = await keep_values(self._buffers, self._lineage, self._pool,
                                            self._settings.health_timeout_s, hosts)
        except Exception:
            log.exception("island %s: keeping the values of %s before the restart failed", island,
                          list(hosts))
            return
        log.warning("island %s: %d of %d values read off %s before their executors are replaced", island,
                    kept, asked, list(hosts))

    async def _heal(self, island: str, cause: str, only: Sequence[str] | None, since: float,
                    keep: bool = False) -> None:
        """Restart, retrying with a doubling pause."""
        attempts = self._settings.heal_attempts
        delay = 1.0
        for attempt in range(1, attempts + 1):
            try:
                await self.restart_claimed(island, cause, only, keep=keep and attempt == 1)
                self.healed[island] += 1
                log.warning("island %s: healed %.1fs after %s", island, time.monotonic() - since, cause)
                return
            except Exception as e:
                log.warning("island %s: restart %d of %d failed: %s", island, attempt, attempts, e)
            if attempt == attempts:
                return
            await asyncio.sleep(delay)
            delay *= 2
            if island in self._restarting:  # an operator's restart meanwhile
                return
            self._restarting.add(island)

    async def probe_forever(self) -> None:
        while True:
            await asyncio.sleep(self._settings.health_probe_s)
            try:
                await self.probe()
            except Exception:  # never let one bad probe stop the watch
                log.exception("probing the hosts failed")

    async def probe(self) -> None:
        """Ask every host not restarting for its stats, within the timeout; report the silent."""
        rm = self._rm
        hosts = [h for h in rm.hosts()
                 if rm.host_status(h) == "up" and rm.host_island(h) not in self._restarting]
        answers = await asyncio.gather(
            *(self._pool.stats(h, timeout=self._settings.health_timeout_s) for h in hosts),
            return_exceptions=True)
        for h, answer in zip(hosts, answers, strict=True):
            if isinstance(answer, Unavailable):
                self.host_lost(h, str(answer))
            elif isinstance(answer, HostStats):  # (one that answered with an error is not lost)
                run = answer.longest_run
                if run is not None and (why := self.runaway(run, answer.longest_run_s, h)) is not None:
                    self._lineage.stopped(run, why)  # not repeated when its outputs are read
                    self.replace(h, f"host {h} was stopped: {why}", keep=True)
