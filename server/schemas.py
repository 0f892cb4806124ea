"""Request and response bodies of the REST API (`/v1`). JSON only; array data is raw bytes."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StrictInt, model_validator

SpecJSON = list[str | list[str] | None]
# Bounds on what one body may list: far above real use, low enough that a hostile body fails
# by name (422 naming the field) before it costs anything.
Id = Annotated[str, Field(max_length=128)]
MAX_IDS = 100_000  # buffer ids in one body
MAX_ARRAYS = 10_000  # inputs or outputs of one computation
MAX_OPS = 10_000  # operations in one batch
MAX_SETTLED = 10_000  # buffers a batch asks the state of (`BatchCreate.settled`)
MAX_BATCH_IDS = 200_000  # ids in one batch, its operations' together (each costs the server work)
MAX_INLINE = 1 << 20  # bytes of one array uploaded inside a batch (it travels base64)
ChosenIds = Annotated[list[Id] | None, Field(
    None, max_length=MAX_ARRAYS,
    description="ids the client chose for the outputs, in order (its own client id and a dot, then "
                "letters, digits or '_.:-', 8 to 64 characters in all; distinct and not in use), "
                "else the server names them",
)]


OUTPUT_IDS = "the outputs' ids, chosen by the client (its id and a dot first)"


class ErrorPublic(BaseModel):
    """Every error answer but FastAPI's own 422 (`HTTPValidationError`, naming each field)."""

    error: str = Field(description="its kind: InvalidArgument, Unauthorized, NotFound, Conflict, ...")
    detail: str = Field(description="what was expected and what was found, naming the field, id or shape")


ERRORS = {
    400: "bad input (the detail names the field, id or shape)",
    401: "no credential, or one the server does not know",
    403: "a known credential without the scope the route needs (client secret or admin token)",
    404: "no such id, or another client's",
    409: "cannot be placed, is already in progress, or failed to compile",
    413: "the body is larger than the route's limit",
    415: "the body is not of the route's content type",
    410: "the value is gone and cannot be made again (the detail names what was lost and why)",
    424: "the computation that makes the value failed (the detail carries the remote cause)",
    429: "over the client's quota: free something (or wait for queued work) and retry after Retry-After",
    503: "a host is down, or did not answer in time",
}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` for these error statuses, each answered as an `ErrorPublic`."""
    return {code: {"model": ErrorPublic, "description": ERRORS[code]} for code in codes}


class ClientCreate(BaseModel):
    name: str = Field("", max_length=200)
    weight: float = Field(1.0, gt=0, le=1e6, description="share of an island under the 'share' policy")


class ClientPublic(BaseModel):
    id: str
    name: str
    weight: float = 1.0
    lease_s: float = Field(description="it is closed after this long without a request")


class ClientCreated(ClientPublic):
    secret: str = Field(description="the client's credential (Authorization: Bearer <secret>); "
                                    "shown only here")


class ClientStatus(ClientPublic):
    slices: int
    buffers: int
    buffer_bytes: int
    computations: int
    programs: int
    stored_bytes: int = Field(description="what the state dir keeps of its artifacts and programs")
    queued: int = Field(description="calls and runs waiting for admission")
    idle_s: float = Field(description="seconds since its last request ended (0 while one runs)")


class DevicePublic(BaseModel):
    id: int
    island: str
    host: str
    index: int
    platform: str
    kind: str
    memory_bytes: int | None
    status: Literal["up", "down"]
    load: int = Field(description="virtual devices (slice members) mapped onto this device")


class HostPublic(BaseModel):
    name: str
    island: str
    status: Literal["up", "down"]
    node: str | None = Field(None, description="the Ray node its executor runs on (admin only)")
    address: str | None = Field(None, description="that node's address (admin only)")
    pid: int | None = Field(None, description="its executor's process id on that node (admin only)")
    solo: bool = Field(False, description="joined after its island's JAX group formed: slices on "
                                          "it hold it alone until the island restarts")
    devices: list[int]
    queued: int
    completed: int
    running: str | None
    running_s: float | None = Field(None, description="how long the running request has run")
    waiting_for: int | None = Field(
        None, description="a sequence number later requests wait behind (not arrived yet)")
    collective_error: str | None = Field(
        None, description="the first failed cross-host collective (the island's group is broken)")
    requests: int = Field(0, description="sequenced requests the host has received")
    buffers: int = Field(0, description="buffers (every client's) held on the host")
    buffer_bytes: int = Field(0, description="bytes the server counts for the buffers (every client's) "
                                             "on the host: a device's shard times its devices there")
    buffer_budget_bytes: int | None = Field(
        None, description="the bytes its executor offers buffers (its devices' memory_bytes); the CPU "
                          "hosts of one machine pool what they offer (buffer_pool)")
    buffer_pool: str | None = Field(None, description="the hosts whose buffers share one budget: the host "
                                                      "itself, or the CPU hosts of its machine")
    buffer_pool_free_bytes: int | None = Field(
        None, description="the bytes of buffers its pool can still take (null: not bounded)")
    arrays: int = Field(0, description="arrays alive in the executor's JAX (device memory held)")
    executables: int = Field(0, description="compiled executables cached on the host")
    plans: int = Field(0, description="program plans cached on the host")
    runs: int = Field(0, description="program runs open on the host (started, not finished)")
    frames: int = Field(0, description="loop frames open on the host (in-graph while loops running)")
    mailboxes: int = Field(0, description="mailboxes for values from peer hosts, open on the host")
    stacked: int = Field(0, description="values saved on runs' stacks on the host (the forward values a "
                                        "loop's gradient reads back), freed as each run ends")
    stack_bytes: int = Field(0, description="the bytes of those values on the host's devices")
    stack_swapped_bytes: int = Field(0, description="the bytes of those values swapped to host memory "
                                                    "(executor_stack_swap_mb)")
    dispatch_messages: int = Field(0, description="program run messages the server has sent it")


class IslandPublic(BaseModel):
    name: str
    devices: int
    slices: int
    load: float
    queued: int = Field(0, description="calls and program runs waiting for the gang scheduler")
    in_flight: int = Field(0, description="calls and program runs admitted and not yet finished")
    admitted: dict[str, float] = Field(
        default_factory=dict, description="cost admitted so far per client id (computations)"
    )
    hosts: list[HostPublic]


class IslandRestarted(BaseModel):
    island: str
    lost_buffers: int = Field(description="buffers whose values were on the island's hosts")


class SliceCreate(BaseModel):
    mesh: dict[str, StrictInt] = Field(description='named mesh axes in order, e.g. {"data": 2, "model": 2}',
                                 max_length=16)
    island: str | None = Field(None, max_length=128)
    device_kind: str | None = Field(None, max_length=128)


class SlicePublic(BaseModel):
    id: str
    mesh: dict[str, int]
    island: str
    hosts: list[str]
    device_ids: list[int]
    platform: str
    owner: str = Field(description="the id of the client that holds it")
    owner_name: str = Field(description="that client's name")


class BufferPublic(BaseModel):
    id: str
    slice_id: str
    shape: list[int]
    dtype: str
    spec: SpecJSON
    state: Literal["pending", "ready", "failed", "missing"] | None = None
    run_id: str | None = Field(
        default=None, description="the run that computes it (GET /v1/buffers/{id} only; none for an upload)")


class BufferIds(BaseModel):
    ids: list[Id] = Field(max_length=MAX_IDS)


class ComputationCreate(BaseModel):
    slice_id: Id
    artifact: str = Field(description="the serialized jax.export artifact, base64")
    in_specs: list[SpecJSON] = Field(max_length=MAX_ARRAYS)
    out_specs: list[SpecJSON] = Field(max_length=MAX_ARRAYS)
    name: str = Field("", max_length=200)


class ComputationPublic(BaseModel):
    id: str
    slice_id: str
    name: str
    status: Literal["pending", "ready", "failed"]
    message: str | None
    in_avals: list[dict[str, Any]]
    out_avals: list[dict[str, Any]]
    in_specs: list[SpecJSON]
    out_specs: list[SpecJSON]


class CallCreate(BaseModel):
    computation_id: Id
    inputs: list[Id] = Field(max_length=MAX_ARRAYS)
    release: list[Id] = Field(
        default_factory=list, max_length=MAX_IDS,
        description="buffers the client dropped: freed after this call",
    )
    ids: ChosenIds


class CallPublic(BaseModel):
    outputs: list[BufferPublic]


class Health(BaseModel):
    status: Literal["ok"]
    hosts: int
    version: str
    unwritten: str | None = Field(None, description="why the server cannot write its state dir, if "
                                  "it cannot (a full disk): its changes are kept and written once it can")


class ProgramCreate(BaseModel):
    program: dict[str, Any] = Field(description="the IR program in its JSON wire form (format isthmus.ir)")
    name: str = Field("", max_length=200)
    fuse: bool | None = Field(
        None, description="fuse adjacent computations on one slice into one executable (default: server's)"
    )


class ProgramPublic(BaseModel):
    id: str
    name: str
    status: Literal["pending", "ready", "failed"]
    message: str | None
    args: list[dict[str, Any]]
    results: list[dict[str, Any]]
    nodes: int
    edges: int
    runs: int
    fuse: bool


class ProgramText(BaseModel):
    text: str = Field(description="the program's text form (artifacts named by hash)")
    lowered: str = Field(description="the program lowered for its slices' current placement")
    plans: list[dict[str, Any]] = Field(description="each host's plan: its steps in order")


class RunCreate(BaseModel):
    program_id: Id
    inputs: list[Id] = Field(max_length=MAX_ARRAYS)
    release: list[Id] = Field(
        default_factory=list, max_length=MAX_IDS,
        description="buffers the client dropped: freed after this run",
    )
    dispatch: Literal["parallel", "sequential"] | None = Field(
        None, description="parallel: one message per host; sequential: one per node (default: server's)"
    )
    trace: bool = Field(False, description="record the run for GET /v1/runs/{id}/trace (its computations "
                                           "then run one at a time on each host)")
    ids: ChosenIds


class RunPublic(BaseModel):
    outputs: list[BufferPublic]


class RunStatus(BaseModel):
    """A call or program run that ended (`GET /v1/runs`)."""

    id: str
    program_id: str = Field(description="the program's id, or for a call its computation's")
    name: str = Field(description="the program's or computation's name")
    what: Literal["call", "program"]
    client_id: str
    client_name: str
    island: str = Field(description="the island whose queue admitted it (its first slice's)")
    hosts: list[str]
    status: Literal["done", "failed"] = Field(
        description="failed: its hosts did not all report its results computed (reading one says why)")
    submitted_at: float = Field(description="when the server took it (Unix seconds)")
    waited_s: float = Field(description="from its submission to its admission on its island")
    ran_s: float = Field(description="from its admission until every host of it had run its part")
    traced: bool = Field(False, description="its trace is at GET /v1/runs/{id}/trace (the last 64 kept)")


# -- a batch: what a client queued, submitted in order in one request ------------------------

class CallOp(BaseModel):
    op: Literal["call"]
    computation_id: Id
    inputs: list[Id] = Field(max_length=MAX_ARRAYS)
    ids: list[Id] = Field(max_length=MAX_ARRAYS, description=OUTPUT_IDS)
    donate: list[Id] = Field([], max_length=MAX_ARRAYS, description=(
        "buffers the call takes over (jax.jit's donate_argnums): freed after it if it is accepted; "
        "a refused call leaves them"))


class RunOp(BaseModel):
    op: Literal["run"]
    program_id: Id
    inputs: list[Id] = Field(max_length=MAX_ARRAYS)
    ids: list[Id] = Field(max_length=MAX_ARRAYS, description=OUTPUT_IDS)
    dispatch: Literal["parallel", "sequential"] | None = None
    trace: bool = Field(False, description="record the run for GET /v1/runs/{id}/trace")


class PutOp(BaseModel):
    op: Literal["put"]
    id: Id = Field(description="the new buffer's id, chosen by the client (its id and a dot first)")
    slice_id: Id
    dtype: str = Field(max_length=32, examples=["float32"])
    shape: list[StrictInt] = Field(max_length=64)
    spec: SpecJSON = Field(default_factory=list, max_length=64)
    data: str = Field(max_length=(MAX_INLINE + 2) // 3 * 4,
                      description="the array: raw little-endian bytes in C order, base64")


class ReleaseOp(BaseModel):
    op: Literal["release"]
    ids: list[Id] = Field(max_length=MAX_IDS, description="buffers the client dropped")


class ForgetOp(BaseModel):
    op: Literal["forget"]
    # an id once for each registration of it let go (the server counts them)
    computations: list[Id] = Field([], max_length=MAX_IDS, description="computations the client let go of")
    programs: list[Id] = Field([], max_length=MAX_IDS, description="programs the client let go of")


BatchOp = Annotated[CallOp | RunOp | PutOp | ReleaseOp | ForgetOp, Field(discriminator="op")]


class BatchCreate(BaseModel):
    ops: list[BatchOp] = Field(max_length=MAX_OPS, description=(
        f"submitted one after another, in order; at most {MAX_BATCH_IDS} ids in all their lists"))
    wait: Id | None = Field(None, description="a buffer to wait for once the ops are submitted")
    settled: list[Id] = Field(default_factory=list, max_length=MAX_SETTLED, description=(
        "buffers to look at once the wait is over (without waiting for them): the answer's "
        "`ready` lists those of them that are ready then"))
    known: list[Id] = Field(default_factory=list, max_length=MAX_BATCH_IDS, description=(
        "ids named by operations whose answer the client lost (the connection dropped): the "
        "answer's `unknown` and `unfinished` say what the server has of them"))

    @model_validator(mode="after")
    def _ids_in_all(self) -> BatchCreate:
        n = sum(_ids(op) for op in self.ops) + len(self.settled) + len(self.known)
        if n > MAX_BATCH_IDS:
            raise ValueError(f"ops: {n} ids in all their lists, more than {MAX_BATCH_IDS} in one batch")
        return self


def _ids(op: CallOp | RunOp | PutOp | ReleaseOp | ForgetOp) -> int:
    match op:
        case CallOp():
            return len(op.inputs) + len(op.ids) + len(op.donate)
        case RunOp():
            return len(op.inputs) + len(op.ids)
        case ReleaseOp():
            return len(op.ids)
        case ForgetOp():
            return len(op.computations) + len(op.programs)
    return 1


class Outcome(BaseModel):
    status: int = Field(description="the HTTP status the operation alone would have been answered")
    error: str
    detail: str


class OpFailure(Outcome):
    index: int = Field(description="the failed operation's place in `ops`")


class BatchPublic(BaseModel):
    failed: list[OpFailure] = Field(description="the operations refused, in order; every other was submitted")
    wait: Outcome | None = Field(default=None, description="why the buffer waited for failed, if it did")
    ready: list[str] = Field(default_factory=list, description="those of the `settled` buffers ready")
    unknown: list[str] = Field(default_factory=list, description=(
        "those of the `known` ids the server has no buffer of (never made, or released)"))
    unfinished: list[str] = Field(default_factory=list, description=(
        "those of the `known` ids whose value was lost because the server restarted before the "
        "computation making it had finished"))
