"""Bad input gets a 4xx whose message names the field, id or shape at fault; the server keeps
serving and loses nothing it already stored."""

import base64
import pickle

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.fixture
def http(c, server):
    headers = {"Authorization": f"Bearer {c.secret}"}
    with httpx.Client(base_url=server.address, headers=headers, timeout=60) as h:
        yield h


@pytest.fixture
def stored(c):
    """A slice, a buffer and a computation that every bad request must leave intact."""
    s = c.slice({"x": 2})
    x = c.put(np.arange(4, dtype=np.float32), s, P("x"))
    f = c.jit(lambda a: a * 2, slice=s, in_specs=P("x"), out_specs=P("x"))
    f(x).result()
    return s, x, f


def upload(http, slice_id, body, dtype="float32", shape="4", spec="[]", ctype="application/octet-stream"):
    return http.post("/v1/buffers", params={"slice_id": slice_id, "dtype": dtype, "shape": shape,
                                            "spec": spec}, content=body, headers={"Content-Type": ctype})


def check(r, status, *words):
    assert r.status_code == status, r.text
    detail = str(r.json()["detail"])
    for w in words:
        assert w in detail, detail


def test_unknown_ids(http, stored):
    _, _, f = stored
    check(http.get("/v1/slices/s-nope"), 404, "s-nope")
    check(http.get("/v1/buffers/b-nope/data"), 404, "b-nope")
    check(upload(http, "s-nope", np.zeros(4, np.float32).tobytes()), 404, "s-nope")
    check(http.post("/v1/calls", json={"computation_id": "c-nope", "inputs": []}), 404, "c-nope")
    cid = f.registrations[0]
    check(http.post("/v1/calls", json={"computation_id": cid, "inputs": ["b-nope"]}), 404, "b-nope")
    check(http.delete("/v1/slices/s-nope"), 404, "s-nope")


def test_inputs_that_do_not_match_the_artifact(c, http, stored):
    s, x, f = stored
    cid = f.registrations[0]
    wrong_shape = c.put(np.zeros(6, np.float32), s)
    wrong_dtype = c.put(np.zeros(4, np.int32), s)
    for b, words in ((wrong_shape, ("input 0", "float32[4]", "float32[6]")),
                     (wrong_dtype, ("input 0", "float32[4]", "int32[4]"))):
        check(http.post("/v1/calls", json={"computation_id": cid, "inputs": [b.id]}), 400, *words)
    check(http.post("/v1/calls", json={"computation_id": cid, "inputs": [x.id, x.id]}), 400,
          "takes 1 inputs; got 2")


def test_slices_that_cannot_be_placed(http):
    check(http.post("/v1/slices", json={"mesh": {"x": 32}}), 409, "larger than any island")
    check(http.post("/v1/slices", json={"mesh": {"x": 2}, "island": "z"}), 404, "island 'z'")
    check(http.post("/v1/slices", json={"mesh": {"x": 0}}), 400, "axis 'x' has size 0")
    check(http.post("/v1/slices", json={"mesh": {"x": 2}, "device_kind": "tpu"}), 409, "tpu")
    check(http.post("/v1/slices", json={"mesh": "x"}), 422, "mesh")


def test_corrupted_artifacts(http, stored):
    s, _, _ = stored
    body = {"slice_id": s.id, "in_specs": [[]], "out_specs": [[]]}
    check(http.post("/v1/computations", json=body | {"artifact": "%%%"}), 400, "artifact", "base64")
    junk = base64.b64encode(b"\x10\x00\x00\x00garbage" * 40).decode()
    check(http.post("/v1/computations", json=body | {"artifact": junk}), 400, "artifact",
          "not a serialized jax.export artifact")
    good = jax.export.export(jax.jit(lambda a: (a,)), platforms=["cpu"])(
        jax.ShapeDtypeStruct((4,), jnp.float32))
    one_device = base64.b64encode(good.serialize()).decode()
    check(http.post("/v1/computations", json=body | {"artifact": one_device}), 400,
          "exported for 1 devices; the slice has 2")
    check(http.post("/v1/computations", json=body), 422, "artifact")


def test_an_artifact_corrupted_inside_fails_cleanly(http, stored):
    """Bytes flipped inside a real artifact: refused at once, or its compiling fails with a
    message; either way the executor survives."""
    s, x, f = stored
    rep = jax.NamedSharding(s.abstract_mesh, P())
    good = jax.export.export(jax.jit(lambda a: (a * 2,), in_shardings=(rep,), out_shardings=(rep,)),
                             platforms=["cpu"])(jax.ShapeDtypeStruct((4,), jnp.float32)).serialize()
    for cut in (len(good) // 3, len(good) // 2, 2 * len(good) // 3):
        raw = bytearray(good)
        raw[cut:cut + 64] = bytes(64)
        body = {"slice_id": s.id, "artifact": base64.b64encode(bytes(raw)).decode(),
                "in_specs": [[]], "out_specs": [[]]}
        r = http.post("/v1/computations", json=body)
        if r.status_code == 400:
            continue
        assert r.status_code == 201, r.text
        status = http.get(f"/v1/computations/{r.json()['id']}")
        out = http.post("/v1/calls", json={"computation_id": r.json()["id"], "inputs": [x.id]})
        if out.status_code == 201:
            data = http.get(f"/v1/buffers/{out.json()['outputs'][0]['id']}/data")
            assert data.status_code in (200, 424), data.text
        assert status.status_code == 200
    np.testing.assert_array_equal(f(x).numpy(), np.arange(4) * 2)


def test_uploads_that_are_not_raw_array_bytes(http, stored):
    s, _, _ = stored
    array = np.arange(4, dtype=np.float32)
    check(upload(http, s.id, pickle.dumps(array)), 400, "bytes", "float32[4] needs exactly 16")
    check(upload(http, s.id, pickle.dumps(array), ctype="application/python-pickle"), 415,
          "content-type", "application/octet-stream")
    rng = np.random.default_rng(0)
    check(upload(http, s.id, rng.bytes(1001)), 400, "1001 bytes")
    check(upload(http, s.id, array.tobytes()[:12]), 400, "12 bytes", "needs exactly 16")
    check(upload(http, s.id, array.tobytes(), shape="4,x"), 400, "shape")
    check(upload(http, s.id, array.tobytes(), dtype="float8"), 400, "dtype", "float8")
    check(upload(http, s.id, array.tobytes(), spec='["y"]'), 400, "spec", "'y'")
    check(upload(http, s.id, array.tobytes(), spec="{"), 400, "spec", "not JSON")
    for shape in (" 4 ", "\u0664", "-4", "4,"):  # what int() takes, or the sign, is not a shape
        check(upload(http, s.id, array.tobytes(), shape=shape), 400, "shape")


def test_numbers_and_ids_are_taken_as_written(c, http, stored):
    """A string or a bool where an int goes is refused (not read as 4, or 1), and an id a
    client chooses has something after its prefix."""
    s, _, _ = stored
    for mesh in ({"x": "2"}, {"x": True}):
        r = http.post("/v1/slices", json={"mesh": mesh})
        assert r.status_code == 422 and "mesh" in r.text, r.text
    put = {"op": "put", "slice_id": s.id, "dtype": "float32", "shape": [True], "spec": [],
           "data": base64.b64encode(np.zeros(1, np.float32).tobytes()).decode()}
    r = http.post("/v1/batch", json={"ops": [{**put, "id": f"{c.id}.shape"}]})
    assert r.status_code == 422 and "shape" in r.text, r.text
    r = http.post("/v1/batch", json={"ops": [{**put, "shape": [1], "id": f"{c.id}."}]})
    assert r.status_code == 200 and r.json()["failed"][0]["status"] == 400, r.text
    assert "at least one character" in r.json()["failed"][0]["detail"]


def test_the_server_keeps_serving_and_loses_nothing(c, http, stored):
    s, x, f = stored
    for _ in range(3):
        upload(http, s.id, b"\x80\x04garbage")
        http.post("/v1/computations", json={"slice_id": s.id, "artifact": "AAAA",
                                            "in_specs": [], "out_specs": []})
    assert http.get("/healthz").json()["status"] == "ok"
    np.testing.assert_array_equal(x.numpy(), np.arange(4))
    np.testing.assert_array_equal(f(x).numpy(), np.arange(4) * 2)
    assert http.get(f"/v1/slices/{s.id}").status_code == 200


def test_a_release_naming_a_buffer_twice_frees_it_once(c, http, stored):
    s, x, _ = stored
    kept = [c.put(np.arange(4, dtype=np.float32), s).result() for _ in range(2)]  # (held: not released)
    ids = [b.id for b in kept]
    assert http.post("/v1/buffers/delete", json={"ids": [ids[0], ids[0]]}).status_code == 204
    put = {"op": "put", "id": f"{c.id}.after", "slice_id": s.id, "dtype": "float32", "shape": [1],
           "data": base64.b64encode(np.float32(5).tobytes()).decode()}
    r = http.post("/v1/batch", json={"ops": [{"op": "release", "ids": [ids[1], ids[1]]}, put]})
    assert r.status_code == 200, r.text
    assert http.get(f"/v1/buffers/{c.id}.after/data").content == np.float32(5).tobytes()
    for b in ids[:2]:
        check(http.get(f"/v1/buffers/{b}"), 404, b)
    np.testing.assert_array_equal(x.numpy(), np.arange(4))  # what was stored is intact


def test_a_batch_naming_too_many_ids_in_all_is_refused_before_any_op_runs(c, http, stored):
    """Each op's lists are bounded, and so is the batch's sum of them: 60 forgets of 200 000
    ids each once kept the server from every other client for 20 s."""
    s, x, _ = stored
    put = {"op": "put", "id": f"{c.id}.notmade", "slice_id": s.id, "dtype": "float32", "shape": [1],
           "data": base64.b64encode(np.float32(5).tobytes()).decode()}
    forget = {"op": "forget", "computations": ["x"] * 100_000, "programs": ["x"] * 100_000}
    r = http.post("/v1/batch", json={"ops": [put, forget, forget, forget]})
    check(r, 422, "ops: 600001 ids in all their lists, more than 200000 in one batch")
    check(http.get(f"/v1/buffers/{c.id}.notmade"), 404)
    np.testing.assert_array_equal(x.numpy(), np.arange(4))
