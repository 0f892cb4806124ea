"""Buffers: upload raw bytes onto a slice, read state, download, free.

Array data travels as raw little-endian bytes in C order (`application/octet-stream`);
dtype, shape and partition spec travel beside it, never inside a pickle.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Query, Request, Response

from ir import Aval, InvalidArgument, IsthmusError, Spec
from server import reads
from server.deps import ClientDep, ServiceDep
from server.errors import MAX_CAUSE, UnsupportedMedia, shown
from server.records import CHOSEN_ID, BufferRecord, ClientRecord
from server.schemas import BufferIds, BufferPublic, error_responses
from server.service import Service
from server.states import ReadState

router = APIRouter(prefix="/v1/buffers", tags=["buffers"], responses=error_responses(403))
OCTETS = "application/octet-stream"
CHOSEN = ("the buffer's id, chosen by the client: its own client id, a dot, then letters, digits "
          "or '_.:-' (8 to 64 characters in all); default: the server's")
MAX_QUERY = 4096  # characters of a shape or spec parameter
DIMS = re.compile(r"[0-9]+(,[0-9]+)*")  # a shape parameter: ASCII digits and commas only
MAX_FETCH_IDS = 10_000  # buffers fetched in one request (`download_many`)
MAX_FETCH_MB = 256  # their bytes in all
LIST_YIELD_EVERY = 2000  # buffers listed before other requests get the loop


def public(rec: BufferRecord, state: ReadState | None = None) -> BufferPublic:
    return BufferPublic(id=rec.id, slice_id=rec.slice_id, shape=list(rec.aval.shape),
                        dtype=rec.aval.dtype, spec=rec.spec.to_json(),
                        state=None if state is None else state.value)


@contextmanager
def remembered(client: ClientRecord, service: Service, ids: Sequence[str] | None) -> Iterator[None]:
    """A submission naming its outputs `ids`: if it is refused, the ids are remembered as
    failed with the cause, so whatever the client queued on them fails the same way.
    An id in use (the refusal may be that), malformed or not of the client's prefix is left
    alone (another client's id then reads as one that never existed)."""
    try:
        yield
    except IsthmusError as e:
        mine = f"{client.id}."
        client.fail([b for b in ids or () if b.startswith(mine) and CHOSEN_ID.fullmatch(b)
                     and b not in service.buffers], shown(e, MAX_CAUSE))
        raise


def _shape(text: str) -> tuple[int, ...]:
    if len(text) > MAX_QUERY:
        raise InvalidArgument(f"shape: {len(text)} characters; at most {MAX_QUERY}")
    try:
        if text and not DIMS.fullmatch(text):  # (int() would take " 16 " and other scripts' digits)
            raise ValueError(text)
        dims = tuple(int(d) for d in text.split(",")) if text else ()
    except ValueError:
        raise InvalidArgument(
            f"shape: expected comma-separated ints such as '4,8', got {text[:80]!r}") from None
    if any(d < 0 for d in dims):
        raise InvalidArgument(f"shape: dimensions must be >= 0, got {text[:80]!r}")
    return dims


def _spec(text: str) -> Spec:
    if len(text) > MAX_QUERY:
        raise InvalidArgument(f"spec: {len(text)} characters; at most {MAX_QUERY}")
    try:
        value = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        raise InvalidArgument(f"spec: not JSON (or nested too deep): {text[:80]!r}; "
                              "expected e.g. [null, \"model\"]") from None
    return Spec.from_json(value)


# The body is read raw (not parsed by FastAPI), so it is documented here.
RAW_BODY = {"requestBody": {"required": True, "description": "the array: raw little-endian bytes, C order",
                            "content": {OCTETS: {"schema": {"type": "string", "format": "binary"}}}}}


@router.post("", status_code=201, responses=error_responses(404, 415, 429), openapi_extra=RAW_BODY)
async def upload(
    request: Request,
    client: ClientDep,
    service: ServiceDep,
    slice_id: Annotated[str, Query(description="the slice that will hold the buffer")],
    dtype: Annotated[str, Query(examples=["float32"])],
    shape: Annotated[str, Query(description="comma-separated dims; empty for a scalar")] = "",
    spec: Annotated[str, Query(description="JSON partition spec, e.g. [null, \"model\"]")] = "[]",
    id: Annotated[str | None, Query(max_length=128, description=CHOSEN)] = None,
) -> BufferPublic:
    with remembered(client, service, None if id is None else [id]):
        content_type = request.headers.get("content-type")
        if (content_type or "").split(";")[0].strip() != OCTETS:
            raise UnsupportedMedia(
                f"content-type: expected {OCTETS} (raw array bytes), got {content_type!r}"
            )
        aval = Aval(_shape(shape), dtype)
        data = await request.body()  # within max_upload_mb: server.guard saw to it before
        return public(service.upload(client, slice_id, aval, _spec(spec), data, id))


@router.get("", description="The client's buffers, each with the state the server knows without "
                             "asking the hosts (null: GET the buffer for it).")
async def list_buffers(client: ClientDep, service: ServiceDep) -> list[BufferPublic]:
    listed = []
    for k, b in enumerate(sorted(client.buffers)):
        if k and k % LIST_YIELD_EVERY == 0:  # other requests get the loop: up to 100 000 are listed
            await asyncio.sleep(0)
        rec = service.buffers.get(b)
        if rec is not None and rec.owner == client.id:  # (freed meanwhile: not listed)
            listed.append(public(rec, reads.known_state(service, rec)))
    return listed


@router.get("/{buffer_id}", responses=error_responses(404, 410, 424, 503))
async def get_buffer(
    buffer_id: str, client: ClientDep, service: ServiceDep,
    wait: Annotated[bool, Query(description="wait until ready; a failure answers 424")] = False,
) -> BufferPublic:
    rec = service.buffer(client, buffer_id)
    shown = public(rec, await (reads.wait(service, rec) if wait else reads.state(service, rec)))
    shown.run_id = service.made_by(rec)
    return shown


@router.get("/{buffer_id}/data", response_class=Response,
            responses={200: {"content": {OCTETS: {}}}, **error_responses(404, 410, 424, 503)})
async def download(buffer_id: str, client: ClientDep, service: ServiceDep) -> Response:
    """Wait for the buffer and return its bytes; dtype and shape are in the headers."""
    rec, data = await reads.fetch(service, client, buffer_id)
    return Response(content=data, media_type=OCTETS, headers={
        "X-Isthmus-Dtype": rec.aval.dtype,
        "X-Isthmus-Shape": ",".join(map(str, rec.aval.shape)),
    })


@router.post("/data", response_class=Response,
             responses={200: {"content": {OCTETS: {}}}, **error_responses(404, 410, 424, 503)})
async def download_many(body: BufferIds, client: ClientDep, service: ServiceDep) -> Response:
    """Wait for several buffers and return their bytes one after another, in the order of
    `ids` (each as `GET /v1/buffers/{id}/data` returns it: its size is its shape's times its
    dtype's); what one read would be refused with refuses the whole. At most `MAX_FETCH_IDS`
    buffers of at most `MAX_FETCH_MB` in all (one buffer alone may be larger)."""
    if len(body.ids) > MAX_FETCH_IDS:
        raise InvalidArgument(f"ids: {len(body.ids)} buffers; at most {MAX_FETCH_IDS} in one request")
    records = [service.buffer(client, b) for b in body.ids]
    total = sum(rec.aval.nbytes for rec in records)
    if len(records) > 1 and total > MAX_FETCH_MB << 20:
        raise InvalidArgument(f"ids: {total} bytes in all, more than {MAX_FETCH_MB} MiB in one request; "
                              "fetch fewer at once")
    parts = await asyncio.gather(*(reads.fetch(service, client, b) for b in body.ids))
    return Response(content=b"".join(data for _, data in parts), media_type=OCTETS)


@router.delete("/{buffer_id}", status_code=204, responses=error_responses(404))
async def delete_buffer(buffer_id: str, client: ClientDep, service: ServiceDep) -> Response:
    service.delete_buffers(client, [buffer_id])
    return Response(status_code=204)


@router.post("/delete", status_code=204)
async def delete_buffers(body: BufferIds, client: ClientDep, service: ServiceDep) -> Response:
    """Free many buffers at once (what a client does for the futures it dropped).

    Ids already gone (freed with their slice, say) are skipped: freeing is idempotent.
    """
    service.release(client, body.ids)
    return Response(status_code=204)
