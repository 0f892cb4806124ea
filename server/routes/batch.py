"""A batch: the calls, runs, small uploads, releases and forgets a client queued, in one request.

The asynchronous client (`client.session`) names every output itself and sends what it
queued in order, without waiting for each answer. The contract:

- The operations are submitted one after another, in the order given: each is in the gang
  scheduler's queue (or freed) before the next one starts, so a later operation may read an
  earlier one's outputs.
- An operation the server refuses does not stop the batch: it is reported by its index with
  the status and detail it would have been answered alone, and the ids it named for its
  outputs are remembered as failed with that cause (`ClientRecord.fail`), so every later
  operation that reads one (in this batch or a later one) is refused with the same cause.
- Between every `YIELD_EVERY` operations (never inside one), other requests get the event
  loop: a batch of 10 000 uploads held every other client's requests for seconds. If this
  client was closed meanwhile, the rest are refused (401).
- `wait` names a buffer to wait for once every operation is submitted, so a client that
  blocks on a result sends what it queued and waits in one round trip; `settled` names
  buffers whose state the answer gives once the wait is over (`ready`), waiting for none.
- `known` names ids of a batch whose answer the client lost (the connection dropped, the
  server restarted): the answer says which of them the server has no buffer of (`unknown`:
  the operation naming it as an output was not taken, or its output was released since)
  and which it lost because it restarted before their computation finished (`unfinished`).
  The client sends again what was not taken (`client.sender`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii

from fastapi import APIRouter
from pydantic import ValidationError
from starlette.types import ASGIApp, Receive, Scope, Send

from ir import Aval, InvalidArgument, IsthmusError, NotFound, RemoteError, Spec
from server import errors, reads
from server.deps import ClientDep, ServiceDep
from server.errors import Unauthorized, shown, status_of
from server.guard import replay
from server.records import ClientRecord
from server.recovery import UNFINISHED
from server.routes.buffers import remembered
from server.schemas import (
    BatchCreate,
    BatchOp,
    BatchPublic,
    CallOp,
    ForgetOp,
    OpFailure,
    Outcome,
    PutOp,
    ReleaseOp,
    RunOp,
    error_responses,
)
from server.service import Service

router = APIRouter(prefix="/v1", tags=["batch"], responses=error_responses(403))


YIELD_EVERY = 256  # operations submitted before other requests get the loop


def _data(op: PutOp) -> bytes:
    try:
        return base64.b64decode(op.data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidArgument("data: not valid base64") from None


async def submit(op: BatchOp, client: ClientRecord, service: Service) -> None:
    """Submit one operation, as its own route would."""
    match op:
        case CallOp():
            with remembered(client, service, op.ids):
                service.call(client, op.computation_id, op.inputs, op.ids)
            service.release(client, op.donate)
        case RunOp():
            with remembered(client, service, op.ids):
                await service.programs.run(client, op.program_id, op.inputs, op.dispatch, op.ids, op.trace)
        case PutOp():
            with remembered(client, service, [op.id]):
                aval = Aval(tuple(op.shape), op.dtype)
                service.upload(client, op.slice_id, aval, Spec.from_json(op.spec), _data(op), op.id)
        case ReleaseOp():
            service.release(client, op.ids)
        case ForgetOp():
            service.forget_computations(client, op.computations)
            service.programs.let_go(client, op.programs)


def outcome(e: IsthmusError) -> Outcome:
    return Outcome(status=status_of(e), error=type(e).__name__, detail=shown(e))


@router.post("/batch")
async def batch(body: BatchCreate, client: ClientDep, service: ServiceDep) -> BatchPublic:
    """Submit the operations in order; answer which were refused, and why (see the module)."""
    failed: list[OpFailure] = []
    for i, op in enumerate(body.ops):
        if i and i % YIELD_EVERY == 0:
            # Other requests get the loop between operations (never inside one): a batch of
            # 10 000 uploads held everyone's for seconds. One that closed this client
            # meanwhile refuses the rest, which would leave records of a closed client.
            await asyncio.sleep(0)
            if service.clients.get(client.id) is not client:
                why = outcome(Unauthorized(f"client {client.id} was closed while its batch was submitted"))
                failed += [OpFailure(index=k, **why.model_dump()) for k in range(i, len(body.ops))]
                return BatchPublic(failed=failed)
        try:
            await submit(op, client, service)
        except IsthmusError as e:
            failed.append(OpFailure(index=i, **outcome(e).model_dump()))
    waited = None
    if body.wait is not None:
        try:
            await reads.wait(service, service.buffer(client, body.wait))
        except IsthmusError as e:
            waited = outcome(e)
    ready = await reads.ready_among(service, client, body.settled) if body.settled else []
    unknown, unfinished = fates(client, service, body.known)
    return BatchPublic(failed=failed, wait=waited, ready=ready, unknown=unknown, unfinished=unfinished)


def fates(client: ClientRecord, service: Service, buffer_ids: list[str]) -> tuple[list[str], list[str]]:
    """Those of the client's ids it has no buffer of, and those lost unfinished at a restart."""
    unknown, unfinished = [], []
    for b in dict.fromkeys(buffer_ids):
        try:
            service.buffer(client, b)
        except RemoteError:  # an output of a refused operation: the refusal is its answer
            continue
        except NotFound:
            unknown.append(b)
            continue
        if service.lost.get(b) == UNFINISHED:
            unfinished.append(b)
    return unknown, unfinished


async def direct(scope: Scope, receive: Receive, send: Send, client: ClientRecord, app: ASGIApp) -> None:
    """`POST /v1/batch` answered without FastAPI's routing and dependencies (`server.guard`
    calls it): the body read and validated here; one that is not a valid `BatchCreate`
    goes on to FastAPI, which gives its usual answer."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":  # gone before the whole body came
            return
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    raw = b"".join(chunks)
    try:
        if not _json(scope):
            raise ValueError("not JSON")
        body = BatchCreate.model_validate_json(raw)
    except (ValueError, ValidationError):
        await app(scope, replay([{"type": "http.request", "body": raw, "more_body": False}], receive), send)
        return
    del raw, chunks  # (not held through a long wait: a body may be up to max_json_mb)
    service: Service = scope["app"].state.service
    try:
        answer = await batch(body, client, service)
    except IsthmusError as e:
        await errors.response(e)(scope, receive, send)
        return
    payload = answer.model_dump_json().encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def _json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return value.split(b";")[0].strip().lower() == b"application/json"
    return False

