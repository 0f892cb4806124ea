"""What made each buffer, kept so that a lost buffer can be made again (lineage recovery).

Contract:
- An upload's bytes are kept, up to `max_bytes` in all. Past it, the client keeping the most
  loses its oldest first: one tenant's uploads never push out another's that keeps less
  (a flood of them only pushes out the flooder's own). A computed value read off a host
  about to be replaced (`keep`) is kept as an upload's bytes are. A run's
  outputs remember their `Origin`: the program run, its inputs and all its outputs. An
  origin can be repeated once its run has settled with every output computed (`done`), or
  once it is known never to have started (`unstarted`). One that did not finish (in flight
  when its host died, or failed) is repeated once (`UNFINISHED_REPEATS`; `repeating`
  counts them): what killed the host may have been the run itself, so a second loss of it
  is DataLoss. (A failed run, repeated, fails again with its cause.) A run stopped on
  purpose (`stopped`: it held its host too long, or its loops were ended) is not repeated.
- The lineage of a live buffer outlives the client's release of its inputs: a released
  buffer that some kept origin reads stays (without its value) as long as that origin
  does, up to `max_released` such buffers: past it, the oldest of the client keeping the
  most is dropped first, as for uploads. A buffer whose
  lineage has a gap is not recoverable any more, and `recipe` says so by name.
- Ids are the clients' choice, and a released id may be taken again (by its client or
  another). A new buffer under an id that a kept origin read makes that origin's lineage
  end there: the recipe is `DataLoss`, never the new buffer's value in the old one's place.
- `recipe(b, available)` is how to make `b` again from buffers that are `available`: the
  uploads to put again and the runs to repeat, in order, each reading only available
  buffers or ones made earlier in the recipe. Or `DataLoss`, naming the buffer that
  cannot be made and why. Pure: it runs nothing.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ir import Aval, DataLoss, Spec
from server.program_record import ProgramRecord

MAX_STEPS = 10_000  # a recipe longer than this is refused (a chain that long is not repeated)
UNFINISHED_REPEATS = 1  # times a run that did not finish is repeated


@dataclass(eq=False)
class Origin:
    program: ProgramRecord  # the record run: a user's program, or a computation's call program
    owner: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    done: bool = False
    kept: int = 0  # outputs whose lineage it still is: once none, what it read is needed less
    input_gens: tuple[int, ...] = ()  # each input id's generation when it ran (`Lineage._gen`)
    unfinished_repeats: int = 0  # times it was repeated before it had finished (`Lineage.repeating`)
    run: str = ""  # the id of its run (its newest repeat's, once repeated)
    stopped: str | None = None  # why its run was stopped on purpose (`Lineage.stopped`): not repeated


@dataclass(frozen=True)
class Upload:
    """An upload's bytes, kept to put them again."""

    data: bytes
    slice_id: str
    aval: Aval
    spec: Spec


@dataclass(frozen=True)
class Put:
    buffer_id: str
    upload: Upload


@dataclass(frozen=True)
class Repeat:
    origin: Origin


Step = Put | Repeat


class Lineage:
    def __init__(self, max_bytes: int, max_released: int) -> None:
        self.max_bytes = max_bytes
        self.max_released = max_released
        self.origins: dict[str, Origin] = {}  # buffer id -> the run that made it
        self._runs: dict[str, Origin] = {}  # run id -> its kept origin (`stopped`)
        self.uploads: dict[str, Upload] = {}
        self.upload_bytes = 0
        self._uploads = _Shares()  # the uploads kept, by client: bytes each
        self._refs: Counter[str] = Counter()  # buffer id -> kept origins that read it
        self._released = _Shares()  # released buffers kept only for lineage, by client: 1 each
        # id -> how many times a new buffer took it while kept origins read it (absent: 0)
        self._gen: dict[str, int] = {}

    # -- what happens ------------------------------------------------------------------------

    def uploaded(self, buffer_id: str, upload: Upload, owner: str = "") -> None:
        self._created(buffer_id)
        self.keep(buffer_id, upload, owner)

    def keep(self, buffer_id: str, upload: Upload, owner: str = "") -> None:
        """A live buffer's value, kept as an upload's bytes are (`server.keeping`: its host is
        about to be replaced): it is put again rather than its runs repeated. What else its
        lineage holds stays."""
        if len(upload.data) > self.max_bytes or buffer_id in self.uploads:
            return
        self.uploads[buffer_id] = upload
        self.upload_bytes += len(upload.data)
        self._uploads.add(owner, buffer_id, len(upload.data))
        while self.upload_bytes > self.max_bytes:
            self._forget_upload(self._uploads.oldest_of_largest())

    def _forget_upload(self, buffer_id: str) -> None:
        upload = self.uploads.pop(buffer_id, None)
        if upload is not None:
            self.upload_bytes -= len(upload.data)
            self._uploads.remove(buffer_id)

    def ran(self, origin: Origin) -> None:
        for b in origin.outputs:
            self._created(b)
            self.origins[b] = origin
        origin.kept = len(origin.outputs)
        origin.input_gens = tuple(self._gen.get(i, 0) for i in origin.inputs)
        self._refs.update(origin.inputs)
        if origin.run:
            self._runs[origin.run] = origin

    def repeating(self, origin: Origin, run_id: str) -> None:
        """The origin's run is repeated as `run_id` (`server.remake`): a repeat of one that
        had not finished counts against `UNFINISHED_REPEATS`."""
        if not origin.done:
            origin.unfinished_repeats += 1
        self._runs.pop(origin.run, None)
        origin.run = run_id
        self._runs[run_id] = origin

    def settled(self, ready: Iterable[str]) -> None:
        """These buffers are computed on every host holding them (or released: nobody reads
        them): their runs are done once all of a run's outputs are."""
        ready = set(ready)
        for b in ready:
            origin = self.origins.get(b)
            if origin is not None and not origin.done and ready.issuperset(origin.outputs):
                origin.done = True

    def unstarted(self, outputs: Iterable[str]) -> None:
        """These buffers' run was never sent to its hosts (an input of it was lost first):
        it computed nothing, so it may be repeated as a finished one is."""
        for b in outputs:
            origin = self.origins.get(b)
            if origin is not None:
                origin.done = True

    def stopped(self, run_id: str, why: str) -> None:
        """That run was stopped on purpose before it finished (its host's executor replaced
        under it, `server.healing`, or its loops ended, `Programs._cancel`): it is not
        repeated, since it would hold its host again or run where it was told to stop."""
        origin = self._runs.get(run_id)
        if origin is not None and not origin.done:
            origin.stopped = why

    def release(self, buffer_id: str, owner: str = "") -> None:
        """The client freed the buffer: keep what a kept origin still reads, else drop it."""
        if self._refs[buffer_id] > 0:
            self._released.add(owner, buffer_id, 1)
            while len(self._released) > self.max_released:
                self._drop(self._released.oldest_of_largest())
        else:
            self._drop(buffer_id)

    def drop_owner(self, owner: str) -> None:
        for b in [b for b, o in self.origins.items() if o.owner == owner]:
            self._drop(b)

    def _created(self, b: str) -> None:
        """A new buffer takes the id `b`: what an earlier one of that id left is dropped, and
        origins that read that one see a new generation of the id."""
        if b in self._refs:
            self._gen[b] = self._gen.get(b, 0) + 1
        self._drop(b)

    def _drop(self, first: str) -> None:
        todo = [first]
        while todo:
            b = todo.pop()
            self._released.remove(b)
            self._forget_upload(b)
            origin = self.origins.pop(b, None)
            if origin is None:
                continue
            origin.kept -= 1
            if origin.kept > 0:
                continue
            self._runs.pop(origin.run, None)
            for i in origin.inputs:  # the origin is gone: what it read is needed less
                self._refs[i] -= 1
                if self._refs[i] <= 0:
                    del self._refs[i]
                    self._gen.pop(i, None)
                    if i in self._released:
                        todo.append(i)

    # -- making a buffer again ---------------------------------------------------------------

    def recipe(self, target: str, available: Callable[[str], bool]) -> list[Step]:
        """The steps that make `target` again (see the module docstring)."""
        steps: list[Step] = []
        made: set[str] = set()
        stack: list[tuple[str, bool]] = [(target, False)]
        while stack:
            b, inputs_ready = stack.pop()
            if b in made or (b != target and available(b)):
                continue
            if len(steps) >= MAX_STEPS:
                raise DataLoss(f"buffer {target}: making it again takes more than {MAX_STEPS} steps")
            upload = self.uploads.get(b)
            if upload is not None:
                steps.append(Put(b, upload))
                made.add(b)
                continue
            origin = self.origins.get(b)
            if origin is None:
                raise DataLoss(f"buffer {b}: no record of what made it is kept (lineage lives in the "
                               "server's memory, not past a restart; uploads past ISTHMUS_LINEAGE_MB and "
                               "released buffers past ISTHMUS_LINEAGE_RELEASED are dropped)"
                               if b == target else
                               f"buffer {b}, which {target} was computed from, is gone and nothing "
                               "kept can make it again")
            if origin.stopped is not None and not origin.done:
                raise DataLoss(f"buffer {b}: the run that was computing it was stopped: {origin.stopped}")
            if not origin.done and origin.unfinished_repeats >= UNFINISHED_REPEATS:
                raise DataLoss(f"buffer {b}: the run that was computing it did not finish, nor did "
                               "it when repeated")
            if inputs_ready:
                steps.append(Repeat(origin))
                made.update(origin.outputs)
                continue
            for i, gen in zip(origin.inputs, origin.input_gens, strict=True):
                if self._gen.get(i, 0) != gen:
                    raise DataLoss(f"buffer {i}, which {target} was computed from, was released and its "
                                   "id taken by a new buffer: what it held is not kept")
            stack.append((b, True))
            stack.extend((i, False) for i in reversed(origin.inputs) if i not in made)
        return steps


class _Shares:
    """Kept entries by client, each with its size, oldest first within a client: what goes
    first past a bound is the oldest of the client keeping the most."""

    def __init__(self) -> None:
        self._by_owner: dict[str, OrderedDict[str, int]] = {}
        self._owner: dict[str, str] = {}  # entry -> its client
        self._sizes: Counter[str] = Counter()  # client -> the sizes of its entries, summed

    def add(self, owner: str, key: str, size: int) -> None:
        self.remove(key)
        self._by_owner.setdefault(owner, OrderedDict())[key] = size
        self._owner[key] = owner
        self._sizes[owner] += size

    def remove(self, key: str) -> None:
        owner = self._owner.pop(key, None)
        if owner is None:
            return
        entries = self._by_owner[owner]
        self._sizes[owner] -= entries.pop(key)
        if not entries:
            del self._by_owner[owner], self._sizes[owner]

    def oldest_of_largest(self) -> str:
        largest = max(self._sizes, key=self._sizes.__getitem__)
        return next(iter(self._by_owner[largest]))

    def __contains__(self, key: str) -> bool:
        return key in self._owner

    def __len__(self) -> int:
        return len(self._owner)
