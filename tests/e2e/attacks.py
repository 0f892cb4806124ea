"""The attack corpus of tests/e2e/test_attack_corpus.py: hostile requests, each registered
with `case(status, *words)` (the status it must get and the words its detail must hold),
and the artifacts an attacker makes (a real one with its module edited)."""

from __future__ import annotations

import base64
import copy
import dataclasses
import json
import os
import pickle
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jax
import jax.extend.lowering
import jax.extend.mlir
import jax.numpy as jnp
import numpy as np
from jax.experimental import io_callback
from jax.export import DisabledSafetyCheck
from jax.sharding import AbstractMesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir as mlir
from jaxlib.mlir.dialects import chlo, sdy
from jaxlib.mlir.dialects import stablehlo as hlo

LIMIT_MB = 1
OCTETS = {"Content-Type": "application/octet-stream"}
F32 = jax.ShapeDtypeStruct((4,), jnp.float32)
CALLBACK = "xla_ffi_python_cpu_callback"  # the custom call of jax's host callbacks on CPU


@dataclass
class Attack:
    http: httpx.Client  # eve's credential
    slice_id: str  # eve's slice of one device
    program: dict[str, Any]  # the wire form of a program eve registered
    bob: list[str]  # ids of bob's buffers
    marker: Path  # what an unpickled payload would create
    legit: dict[str, Any]  # what eve holds before the attacks


class Evil:
    """A pickle that runs a command when it is loaded."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return os.system, (f"touch {self.marker}",)


# -- artifacts an attacker makes: a real one with its module edited --------------------------

def _export(fn: Callable[..., Any], *args: Any, **kw: Any) -> jax.export.Exported:
    return jax.export.export(jax.jit(fn), platforms=["cpu"], **kw)(*args)


def _portable(text: str) -> bytes:
    """A module's text as jax.export stores it: a StableHLO portable artifact."""
    context = mlir.Context()
    context.append_dialect_registry(jax.extend.lowering.upstream_dialects)
    context.load_all_available_dialects()
    for dialect in (hlo, sdy, chlo):
        dialect.register_dialect(context)
    with context, mlir.Location.unknown(context):
        module = mlir.Module.parse(text)
        target = hlo.get_version_from_compatibility_requirement(hlo.StablehloCompatibilityRequirement.WEEK_4)
        return jax.extend.mlir.serialize_portable_artifact(module, target, True)


def _edited(exported: jax.export.Exported, text: str, **fields: Any) -> bytes:
    """`exported` with its module replaced by `text` (and `fields` changed): an artifact
    jax.export never checked, which it deserializes without complaint."""
    data = bytes(dataclasses.replace(exported, mlir_module_serialized=_portable(text), **fields).serialize())
    jax.export.deserialize(bytearray(data))
    return data


def _callback(kind: str) -> bytes:
    """An artifact whose module calls back into Python on the executor. jax.export refuses to
    write one (waiver or not), so the lowered module is put into a plain artifact."""
    fn = {"pure": lambda x: jax.pure_callback(np.sin, F32, x),
          "io": lambda x: io_callback(np.sin, F32, x)}[kind]
    lowered = jax.jit(fn).lower(F32).as_text()
    assert f"@{CALLBACK}" in lowered, lowered
    return _edited(_export(jnp.sin, F32), lowered)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _plain() -> bytes:
    return bytes(_export(lambda a: a * 2, F32).serialize())


# -- the corpus ------------------------------------------------------------------------------

CASES: dict[str, tuple[Callable[[Attack], httpx.Response], int, tuple[str, ...]]] = {}


def case(status: int, *words: str) -> Callable[[Callable[[Attack], httpx.Response]], Any]:
    """Register a hostile request, the status it must get and words its detail must hold."""
    def register(fn: Callable[[Attack], httpx.Response]) -> Callable[[Attack], httpx.Response]:
        CASES[fn.__name__] = (fn, status, words)
        return fn
    return register


def computation(a: Attack, artifact: bytes | str, **fields: Any) -> httpx.Response:
    body = {"slice_id": a.slice_id, "in_specs": [[]], "out_specs": [[]],
            "artifact": artifact if isinstance(artifact, str) else _b64(artifact)}
    return a.http.post("/v1/computations", json=body | fields)


def upload(a: Attack, content: Any, shape: str = "4", spec: str = "[]", headers: dict[str, str] = OCTETS,
           ) -> httpx.Response:
    params = {"slice_id": a.slice_id, "dtype": "float32", "shape": shape, "spec": spec}
    return a.http.post("/v1/buffers", params=params, content=content, headers=headers)


def chunks(total: int, size: int = 64 << 10) -> Iterator[bytes]:
    """A body httpx sends chunked (no Content-Length)."""
    for start in range(0, total, size):
        yield b"\0" * min(size, total - start)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@case(400, "artifact", "not a serialized jax.export artifact")
def pickled_array_as_artifact(a):
    return computation(a, pickle.dumps(np.arange(4, dtype=np.float32)))


@case(400, "artifact", "not a serialized jax.export artifact")
def pickle_that_runs_a_command_as_artifact(a):
    return computation(a, pickle.dumps(Evil(a.marker)))


@case(400, "artifact")
def empty_artifact(a):
    return computation(a, b"")


@case(400, "artifact", "not a serialized jax.export artifact")
def random_bytes_as_artifact(a):
    return computation(a, np.random.default_rng(1).bytes(1000))


@case(400, "artifact")
def random_megabyte_within_the_limit_as_artifact(a):
    return computation(a, np.random.default_rng(2).bytes(700_000))


@case(400, "artifact")
def artifact_truncated_to_its_first_byte(a):
    return computation(a, _plain()[:1])


@case(400, "artifact")
def artifact_truncated_to_a_quarter(a):
    data = _plain()
    return computation(a, data[:len(data) // 4])


@case(400, "artifact")
def artifact_truncated_to_half(a):
    data = _plain()
    return computation(a, data[:len(data) // 2])


@case(400, "artifact")
def artifact_truncated_to_three_quarters(a):
    data = _plain()
    return computation(a, data[:3 * len(data) // 4])


@case(400, "artifact", "disabled_safety_checks", f"custom_call:{CALLBACK}", "must be empty")
def pure_callback_with_its_check_waived(a):
    lowered = jax.jit(lambda x: jax.pure_callback(np.sin, F32, x)).lower(F32).as_text()
    return computation(a, _edited(_export(jnp.sin, F32), lowered,
                                  disabled_safety_checks=(DisabledSafetyCheck.custom_call(CALLBACK),)))


@case(400, "artifact", f"custom call to '{CALLBACK}'", "host callbacks run Python")
def pure_callback_smuggled_without_a_waiver(a):
    return computation(a, _callback("pure"))


@case(400, "artifact", f"custom call to '{CALLBACK}'", "host callbacks run Python")
def io_callback_smuggled_without_a_waiver(a):
    return computation(a, _callback("io"))


@case(400, "artifact", "custom call to 'my_kernel'", "not among jax.export's stable custom-call targets")
def custom_call_to_a_kernel_of_the_attackers(a):
    square = jax.ShapeDtypeStruct((4, 4), jnp.float32)
    exported = _export(jnp.linalg.cholesky, square)
    text = exported.mlir_module()
    assert "@lapack_spotrf_ffi" in text
    return computation(a, _edited(exported, text.replace("@lapack_spotrf_ffi", "@my_kernel")),
                       in_specs=[[]], out_specs=[[]])


@case(400, "artifact", "disabled_safety_checks", "must be empty")
def artifact_waiving_the_platform_check(a):
    exported = _export(jnp.sin, F32, disabled_checks=[DisabledSafetyCheck.platform()])
    return computation(a, bytes(exported.serialize()))


@case(400, "artifact", "exported for 4 devices; the slice has 1")
def artifact_for_four_devices_on_a_slice_of_one(a):
    rep = NamedSharding(AbstractMesh((4,), ("x",)), P())
    exported = jax.export.export(jax.jit(lambda v: v * 2, in_shardings=rep, out_shardings=rep),
                                 platforms=["cpu"])(F32)
    return computation(a, bytes(exported.serialize()))


@case(400, "artifact", "fused")
def fused_artifact_sent_by_a_client(a):
    return computation(a, b'{"parts": []}')


@case(413, f"larger than the {LIMIT_MB} MiB limit")
def json_body_over_the_limit_with_its_length(a):
    return computation(a, "A" * ((LIMIT_MB << 20) + 4))


@case(413, f"larger than the {LIMIT_MB} MiB limit")
def json_body_over_the_limit_chunked(a):
    body = json.dumps({"slice_id": a.slice_id, "in_specs": [[]], "out_specs": [[]],
                       "artifact": "A" * ((LIMIT_MB << 20) + 4)}).encode()
    parts = iter([body[i:i + 65536] for i in range(0, len(body), 65536)])
    return a.http.post("/v1/computations", content=parts, headers={"Content-Type": "application/json"})


@case(415, "content-type", "application/octet-stream")
def pickle_uploaded_as_a_pickle(a):
    return upload(a, pickle.dumps(Evil(a.marker)), headers={"Content-Type": "application/python-pickle"})


@case(400, "body has", "needs exactly 16")
def pickle_uploaded_as_raw_bytes(a):
    return upload(a, pickle.dumps(Evil(a.marker)))


@case(413, f"larger than the {LIMIT_MB} MiB limit")
def upload_over_the_limit_with_its_length(a):
    return upload(a, b"\0" * ((LIMIT_MB << 20) + 4), shape=str(((LIMIT_MB << 20) + 4) // 4))


@case(413, f"larger than the {LIMIT_MB} MiB limit")
def upload_over_the_limit_chunked(a):
    return upload(a, chunks(8 * (LIMIT_MB << 20)), shape=str(2 * (LIMIT_MB << 20)))


@case(400, "shape")
def shape_past_int64(a):
    return upload(a, b"\0" * 16, shape=str(2**63))


@case(400, "its dimensions span more than 2**62 bytes")
def shape_whose_size_overflows_int64(a):
    return upload(a, b"\0" * 16, shape=f"{2**32},{2**32},{2**32}")


@case(400, "its dimensions span more than 2**62 bytes")
def empty_shape_whose_dims_overflow(a):
    return upload(a, b"", shape=f"{2**62},0")


@case(400, "shape", "rank")
def shape_of_rank_1000(a):
    return upload(a, b"\0" * 4, shape=",".join(["1"] * 1000))


@case(400, "shape", "characters")
def shape_of_10000_dimensions(a):
    return upload(a, b"\0" * 4, shape=",".join(["1"] * 10_000))


@case(400, "spec")
def spec_nested_10000_deep(a):
    return upload(a, b"\0" * 16, spec=nested(10_000))


@case(400, "spec", "nested too deep")
def spec_nested_2000_deep_within_the_length_bound(a):
    return upload(a, b"\0" * 16, spec=nested(2000))


@case(400, "nested too deep")
def json_body_nested_100000_deep(a):
    return a.http.post("/v1/slices", content=nested(100_000), headers={"Content-Type": "application/json"})


@case(400, "nested too deep")
def program_nested_100000_deep(a):
    body = '{"program": ' + '{"a": ' * 100_000 + "null" + "}" * 100_000 + "}"
    return a.http.post("/v1/programs", content=body, headers={"Content-Type": "application/json"})


@case(422, "mesh")
def mesh_of_10000_axes(a):
    return a.http.post("/v1/slices", json={"mesh": {f"a{i}": 1 for i in range(10_000)}})


@case(409, "larger than the cluster")
def mesh_of_2_to_the_62_devices(a):
    return a.http.post("/v1/slices", json={"mesh": {"x": 2**31, "y": 2**31}})


@case(409, "larger than the cluster")
def mesh_axis_past_int64(a):
    return a.http.post("/v1/slices", json={"mesh": {"x": 10**40}})


@case(400, "body", "not JSON")
def pickle_as_a_json_body(a):
    return a.http.post("/v1/slices", content=pickle.dumps(Evil(a.marker)),
                       headers={"Content-Type": "application/json"})


@case(400, "slices", "mesh")
def program_whose_slice_has_10000_axes(a):
    doc = copy.deepcopy(a.program)
    doc["slices"][0]["mesh"] = [[f"a{i}", 1] for i in range(10_000)]
    return a.http.post("/v1/programs", json={"program": doc})


@case(400, "shape")
def program_with_a_shape_past_int64(a):
    doc = copy.deepcopy(a.program)
    arg = next(n for n in doc["graph"]["nodes"] if n["op"] == "arg")
    arg["attrs"]["type"]["aval"]["shape"] = [2**63]
    return a.http.post("/v1/programs", json={"program": doc})


@case(400, "loops and branches nested more than 16 deep")
def program_of_loops_nested_100_deep(a):
    doc = copy.deepcopy(a.program)
    graph: dict[str, Any] = {"nodes": []}
    for _ in range(100):
        graph = {"nodes": [{"op": "while", "inputs": [], "outputs": [],
                            "attrs": {"cond": graph, "body": {"nodes": []}}}]}
    doc["graph"] = graph
    return a.http.post("/v1/programs", json={"program": doc})


@case(400, "stack s0", "expected one push and one pop, found no push")
def program_popping_a_stack_nothing_pushed(a):
    doc = copy.deepcopy(a.program)
    nodes = doc["graph"]["nodes"]
    arg = next(n for n in nodes if n["op"] == "arg")
    nodes.insert(len(nodes) - 1, {"op": "pop", "inputs": [], "outputs": ["%popped"],
                                  "attrs": {"type": arg["attrs"]["type"], "stack": "s0", "depth": 1}})
    return a.http.post("/v1/programs", json={"program": doc})


@case(400, "trips t0", "expected one while that saves them and one repeat, found 0 and 1")
def program_repeating_a_loop_that_never_ran(a):
    doc = copy.deepcopy(a.program)
    nodes = doc["graph"]["nodes"]
    nodes.insert(len(nodes) - 1, {"op": "repeat", "inputs": [], "outputs": [],
                                  "attrs": {"body": {"nodes": [{"op": "result", "inputs": [], "outputs": [],
                                                                "attrs": {}}]},
                                            "trips": "t0", "depth": 0}})
    return a.http.post("/v1/programs", json={"program": doc})


@case(404, "does not exist")
def id_of_10000_characters_in_a_path(a):
    return a.http.get(f"/v1/buffers/b-{'0' * 10_000}")


@case(422, "computation_id")
def id_of_10000_characters_in_a_body(a):
    return a.http.post("/v1/calls", json={"computation_id": "c-" + "0" * 10_000, "inputs": []})


def ids(a: Attack, n: int) -> list[str]:
    """`n` ids: bob's, then short unknown ones (so that the list fits in 1 MiB)."""
    return [*a.bob, *(["b"] * (n - len(a.bob)))]


@case(422, "ids", "100000")
def release_list_of_100001_ids(a):
    return a.http.post("/v1/buffers/delete", json={"ids": ids(a, 100_001)})


@case(204)
def release_list_of_100000_ids_some_another_clients(a):
    """Within the bound, so accepted; another client's ids are skipped like unknown ones."""
    return a.http.post("/v1/buffers/delete", json={"ids": ids(a, 100_000)})


@case(404, "does not exist")
def call_releasing_100000_ids_some_another_clients(a):
    return a.http.post("/v1/calls", json={"computation_id": "c-000000000000", "inputs": [],
                                          "release": ids(a, 100_000)})


@case(413, f"larger than the {LIMIT_MB} MiB limit")
def release_list_of_100000_real_ids_past_the_body_limit(a):
    return a.http.post("/v1/buffers/delete", json={"ids": (a.bob * 50_000)[:100_000]})
