"""Artifacts are checked before they reach XLA: what jax.export writes passes; custom calls
outside its stable targets, host callbacks and transfers, waived checks, effects, too many
ops or bytes, and bytes that are no artifact at all are refused with the problem named.

Refused artifacts that jax.export would not write are made the way an attacker would: by
editing a real artifact's module and serializing it again (`_edited`). The reader runs in
its own process here too, so bytes that crash MLIR cost the test nothing.
"""

import dataclasses
import io
import random
import re
import signal
import sys
from collections.abc import Callable

import jax
import jax.extend.lowering
import jax.extend.mlir
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental import io_callback
from jax.export import DisabledSafetyCheck
from jax.sharding import AbstractMesh, AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from jaxlib.mlir import ir
from jaxlib.mlir.dialects import chlo, sdy
from jaxlib.mlir.dialects import stablehlo as hlo

from ir import InvalidArgument, MeshAxes, Spec, Unavailable
from ir.fused import Call, encode_fused
from server.artifact_policy import STABLE_CUSTOM_CALL_TARGETS, check_module
from server.artifact_reader import ArtifactReader
from server.artifacts import ArtifactInfo, inspect_artifact
from server.errors import PayloadTooLarge

pytestmark = [pytest.mark.unit, pytest.mark.timeout(120)]

ONE = MeshAxes.of({"x": 1})
F32 = jax.ShapeDtypeStruct((4,), jnp.float32)
SQUARE = jax.ShapeDtypeStruct((4, 4), jnp.float32)


@pytest.fixture(scope="module")
def reader():
    with ArtifactReader() as r:
        yield r


def _export(fn: Callable, *args: jax.ShapeDtypeStruct, **kw) -> jax.export.Exported:
    return jax.export.export(jax.jit(fn), platforms=["cpu"], **kw)(*args)


def _bytes(exported: jax.export.Exported) -> bytes:
    return bytes(exported.serialize())


def _context() -> ir.Context:
    context = ir.Context()
    context.append_dialect_registry(jax.extend.lowering.upstream_dialects)
    context.load_all_available_dialects()
    for dialect in (hlo, sdy, chlo):
        dialect.register_dialect(context)
    return context


def _portable(text: str) -> bytes:
    """A module's text as jax.export stores it: a StableHLO portable artifact."""
    with _context() as context, ir.Location.unknown(context):
        module = ir.Module.parse(text)
        target = hlo.get_version_from_compatibility_requirement(hlo.StablehloCompatibilityRequirement.WEEK_4)
        return jax.extend.mlir.serialize_portable_artifact(module, target, True)


def _edited(exported: jax.export.Exported, text: str, **fields) -> bytes:
    """`exported` with its module replaced by `text`: a valid artifact whose module jax.export
    never checked (it may still deserialize it without complaint)."""
    edited = dataclasses.replace(exported, mlir_module_serialized=_portable(text), **fields)
    data = _bytes(edited)
    jax.export.deserialize(bytearray(data))  # what the server accepted until now
    return data


def _refused(reader: ArtifactReader, data: bytes, *words: str, mesh: MeshAxes = ONE,
             error: type[Exception] = InvalidArgument, **limits) -> str:
    with pytest.raises(error) as caught:
        inspect_artifact(data, mesh, "cpu", reader=reader, **limits)
    message = str(caught.value)
    assert message.startswith("artifact:"), message
    for w in words:
        assert w in message, message
    return message


# -- what jax.export writes passes --------------------------------------------------------

def test_an_ordinary_function_passes(reader):
    exported = _export(lambda w, x: jnp.tanh(x @ w), jax.ShapeDtypeStruct((8, 4), jnp.float32),
                       jax.ShapeDtypeStruct((2, 8), jnp.float32))
    info = inspect_artifact(_bytes(exported), ONE, "cpu", reader=reader, max_bytes=1 << 20, max_ops=1000)
    assert isinstance(info, ArtifactInfo)
    assert [(a.shape, a.dtype) for a in info.in_avals] == [((8, 4), "float32"), ((2, 8), "float32")]
    assert [(a.shape, a.dtype) for a in info.out_avals] == [((2, 4), "float32")]
    assert (info.platforms, info.nr_devices) == (("cpu",), 1)


def test_a_sharded_function_with_collectives_passes(reader):
    mesh = AbstractMesh((2, 2), ("data", "model"))

    def body(x):
        return jax.lax.psum(x, "model") + jax.lax.all_gather(x, "data", tiled=True)[: x.shape[0]]

    def fn(x):
        return jax.shard_map(body, mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"))(x)

    sharding = NamedSharding(mesh, P("data", "model"))
    exported = jax.export.export(jax.jit(fn, in_shardings=sharding, out_shardings=sharding),
                                 platforms=["cpu"])(jax.ShapeDtypeStruct((8, 8), jnp.float32))
    assert "all_reduce" in exported.mlir_module() and "all_gather" in exported.mlir_module()
    info = inspect_artifact(_bytes(exported), MeshAxes.of({"data": 2, "model": 2}), "cpu", reader=reader)
    assert info.in_specs == (Spec(("data", "model")),) and info.out_specs == (Spec(("data", "model")),)


def test_a_function_traced_on_explicit_axes_is_read_with_its_axis_types(reader):
    # its avals carry the mesh in their types, and JAX reads the shardings only on a mesh
    # of the same axis types
    mesh = AbstractMesh((2, 2), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    rows = NamedSharding(mesh, P("data"))
    double = jax.jit(lambda x: x * 2, in_shardings=rows, out_shardings=rows)
    with jax.sharding.use_abstract_mesh(mesh):
        exported = jax.export.export(double, platforms=["cpu"])(
            jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=rows))
    info = inspect_artifact(_bytes(exported), MeshAxes.of({"data": 2, "model": 2}), "cpu", reader=reader)
    assert info.in_specs == info.out_specs == (Spec(("data",)),)
    _refused(reader, _bytes(exported), "do not fit", mesh=MeshAxes.of({"x": 2, "y": 2}))


@pytest.mark.parametrize("fn", [jnp.linalg.cholesky, lambda a: jnp.linalg.qr(a)[0],
                                lambda a: jnp.linalg.eigh(a)[0], lambda a: jnp.linalg.svd(a)[1],
                                lambda a: jax.scipy.linalg.lu(a)[0]],
                         ids=["cholesky", "qr", "eigh", "svd", "lu"])
def test_linear_algebra_with_lapack_custom_calls_passes(reader, fn):
    exported = _export(fn, SQUARE)
    assert "stablehlo.custom_call @lapack_" in exported.mlir_module()  # the case this covers
    inspect_artifact(_bytes(exported), ONE, "cpu", reader=reader)


def test_the_allow_list_is_jax_exports_stable_targets():
    """Ours is written out; jax's is private. A JAX upgrade that changes it fails here."""
    from jax._src.export._export import _CUSTOM_CALL_TARGETS_GUARANTEED_STABLE

    assert STABLE_CUSTOM_CALL_TARGETS == frozenset(_CUSTOM_CALL_TARGETS_GUARANTEED_STABLE)


# -- custom calls, callbacks, transfers -------------------------------------------------

def test_a_smuggled_custom_call_is_refused_by_name(reader):
    exported = _export(jnp.linalg.cholesky, SQUARE)
    text = exported.mlir_module()
    for target in ("xla_ffi_python_cpu_callback", "my_kernel", 'odd\\22name'):
        data = _edited(exported, text.replace("@lapack_spotrf_ffi", f'@"{target}"'))
        _refused(reader, data, "custom call to", "is not allowed", "in @cholesky")
    message = _refused(reader, _edited(exported, text.replace("@lapack_spotrf_ffi", "@my_kernel")))
    assert "'my_kernel'" in message and "not among jax.export's stable custom-call targets" in message
    message = _refused(reader, _edited(exported, text.replace("@lapack_spotrf_ffi",
                                                              "@xla_ffi_python_cpu_callback")))
    assert "'xla_ffi_python_cpu_callback'" in message and "host callbacks run Python" in message


def test_a_custom_call_nested_in_a_branch_is_found(reader):
    def fn(a):
        return jax.lax.cond(a[0, 0] > 0, jax.lax.linalg.cholesky, lambda b: b * 2, a)

    exported = _export(fn, SQUARE)
    text = exported.mlir_module()
    assert "stablehlo.case" in text and "@lapack_spotrf_ffi" in text
    inspect_artifact(_bytes(exported), ONE, "cpu", reader=reader)
    # The branch is a region of the case op inside @main, not a function of its own.
    _refused(reader, _edited(exported, text.replace("@lapack_spotrf_ffi", "@nested_kernel")),
             "custom call to 'nested_kernel' in @main")


def _pure(x):
    return jax.pure_callback(np.sin, F32, x)


def _debug(x):
    jax.debug.callback(print, x)
    return x * 2


def _io(x):
    return io_callback(np.sin, F32, x)


@pytest.mark.parametrize("fn", [_pure, _debug, _io], ids=["pure_callback", "debug.callback", "io_callback"])
def test_host_callbacks_are_refused(reader, fn):
    target = "xla_ffi_python_cpu_callback"
    with pytest.raises(NotImplementedError):  # jax.export will not write one, waiver or not
        _export(fn, F32, disabled_checks=[DisabledSafetyCheck.custom_call(target)])
    lowered = jax.jit(fn).lower(F32).as_text()
    assert f"@{target}" in lowered
    base = _export(jnp.sin, F32)
    waived = _edited(base, lowered, disabled_safety_checks=(DisabledSafetyCheck.custom_call(target),))
    _refused(reader, waived, "disabled_safety_checks", f"custom_call:{target}")
    message = _refused(reader, _edited(base, lowered), f"custom call to '{target}'")
    assert "host callbacks run Python on the executor" in message


def test_host_transfers_are_refused(reader):
    exported = _export(jnp.sin, F32)
    outfeed = ('%t = stablehlo.create_token : !stablehlo.token\n'
               '    %t2 = "stablehlo.outfeed"(%arg0, %t) {outfeed_config = ""} '
               ': (tensor<4xf32>, !stablehlo.token) -> !stablehlo.token\n    %0 = stablehlo.sine')
    text = exported.mlir_module().replace("%0 = stablehlo.sine", outfeed)
    _refused(reader, _edited(exported, text), "'stablehlo.outfeed' in @main is not allowed",
             "between the device and the host")


def _sends(*attributes: str) -> ir.Module:
    body = "".join(f'  %s{i} = "stablehlo.send"(%arg0, %t) {{{a}}} '
                   ": (tensor<4xf32>, !stablehlo.token) -> !stablehlo.token\n"
                   for i, a in enumerate(attributes))
    return ir.Module.parse("func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n"
                           "  %t = stablehlo.create_token : !stablehlo.token\n"
                           f"{body}  return %arg0 : tensor<4xf32>\n}}")


def test_send_to_the_host_is_refused_and_between_devices_is_not():
    """As lax.psend lowers on GPU (device to device) and host callbacks on TPU (to the host)."""
    device = "channel_handle = #stablehlo.channel_handle<handle = 1, type = 1>"
    with _context() as context, ir.Location.unknown(context):
        assert check_module(_sends(device)) == 5  # module, func, create_token, send, return
        host = "channel_handle = #stablehlo.channel_handle<handle = 2, type = 2>, is_host_transfer = true"
        with pytest.raises(InvalidArgument, match=re.escape("'stablehlo.send' in @main is not allowed")):
            check_module(_sends(device, host))


def test_ops_of_other_dialects_are_refused():
    """Portable artifacts hold no such op (the reader's context refuses plain bytecode), so
    the walk is tried on a module parsed here."""
    with _context() as context, ir.Location.unknown(context):
        module = ir.Module.parse("func.func @main() -> f32 {\n"
                                 "  %c = arith.constant 1.0 : f32\n  return %c : f32\n}")
        refused = "'arith.constant' in @main is of dialect 'arith'"
        with pytest.raises(InvalidArgument, match=re.escape(refused)):
            check_module(module)


def test_plain_mlir_bytecode_is_not_a_portable_artifact(reader):
    exported = _export(jnp.sin, F32)
    with _context() as context, ir.Location.unknown(context):
        module = ir.Module.parse(exported.mlir_module())
        out = io.BytesIO()
        module.operation.write_bytecode(out)
    data = _bytes(dataclasses.replace(exported, mlir_module_serialized=out.getvalue()))
    _refused(reader, data, "its StableHLO module cannot be read")


# -- the artifact's own fields --------------------------------------------------------------

@pytest.mark.parametrize("check", [DisabledSafetyCheck.platform(),
                                   DisabledSafetyCheck.custom_call("xla_ffi_python_cpu_callback")],
                         ids=str)
def test_disabled_safety_checks_are_refused(reader, check):
    data = _bytes(_export(jnp.sin, F32, disabled_checks=[check]))
    _refused(reader, data, "disabled_safety_checks", str(check), "must be empty")


def test_an_artifact_for_another_device_count_is_refused(reader):
    _refused(reader, _bytes(_export(lambda a: (a,), F32)), "exported for 1 devices; the slice has 2",
             mesh=MeshAxes.of({"x": 2}))


def test_a_fused_artifact_cannot_be_sent(reader):
    part = _bytes(_export(jnp.sin, F32))
    fused = encode_fused([part], [Call(0, (("in", 0),))], [("out", 0, 0)])
    _refused(reader, fused, "fused artifact", "never sent")


# -- limits -----------------------------------------------------------------------------

def _mlp(layers: int) -> jax.export.Exported:
    def loss(ws, x):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x.sum()

    return _export(jax.value_and_grad(loss), [jax.ShapeDtypeStruct((16, 16), jnp.float32)] * layers,
                   jax.ShapeDtypeStruct((4, 16), jnp.float32))


def test_the_op_count_is_capped(reader):
    data = _bytes(_mlp(50))
    inspect_artifact(data, ONE, "cpu", reader=reader, max_ops=2000)
    _refused(reader, data, "more than 100 operations", "max_artifact_ops", max_ops=100)


def test_the_size_is_capped_before_reading(reader):
    data = _bytes(_mlp(2))
    inspect_artifact(data, ONE, "cpu", reader=reader, max_bytes=len(data))
    _refused(reader, data, f"{len(data)} bytes; at most {len(data) - 1}", "max_artifact_mb",
             error=PayloadTooLarge, max_bytes=len(data) - 1)
    _refused(reader, b"\0" * 100, "at most 10", error=PayloadTooLarge, max_bytes=10)  # never read


# -- bytes that are no artifact ---------------------------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 8, 100, 1000, 100_000])
def test_random_bytes_are_refused(reader, size):
    data = np.random.default_rng(size).bytes(size)
    if data.startswith(b"{"):
        data = b"x" + data[1:]
    _refused(reader, data, "not a serialized jax.export artifact")


def test_every_eighth_prefix_of_an_artifact_is_refused(reader):
    data = _bytes(_export(jnp.linalg.cholesky, SQUARE))
    for k in range(8):
        message = _refused(reader, data[: len(data) * k // 8])
        assert "not a serialized jax.export artifact" in message or "module cannot be read" in message
    inspect_artifact(data, ONE, "cpu", reader=reader)


def test_a_module_with_flipped_bytes_never_gets_past_the_reader(reader):
    """Some of these crash or hang MLIR's reader; each is an answer, and the reader goes on."""
    exported = _export(lambda a: jnp.linalg.cholesky(a) @ jnp.sin(a), SQUARE)
    module = exported.mlir_module_serialized
    with ArtifactReader(timeout_s=5) as short:
        for seed in range(40):
            rng = random.Random(seed)
            flipped = bytearray(module)
            for _ in range(rng.randint(1, 8)):
                flipped[rng.randrange(len(flipped))] = rng.randrange(256)
            data = _bytes(dataclasses.replace(exported, mlir_module_serialized=bytes(flipped)))
            try:
                inspect_artifact(data, ONE, "cpu", reader=short)
            except InvalidArgument as e:
                assert str(e).startswith("artifact:"), e
        inspect_artifact(_bytes(exported), ONE, "cpu", reader=short)


# -- the reader process ---------------------------------------------------------------------

def _fake_reader(then: str, **kw) -> ArtifactReader:
    """A reader whose child says it is ready, takes a request's header, then does `then`."""
    code = ("import os, signal, sys, time; sys.stdout.write('{\"ready\": true}\\n'); "
            f"sys.stdout.flush(); sys.stdin.readline(); {then}")
    return ArtifactReader(command=[sys.executable, "-c", code], **kw)


def test_a_reader_that_crashes_is_an_answer_and_is_replaced():
    with _fake_reader("os.kill(os.getpid(), signal.SIGSEGV)") as fake:
        for _ in range(2):  # the second read starts a new child
            crashed = f"crashed the artifact reader ({signal.SIGSEGV.name})"
            with pytest.raises(InvalidArgument, match=re.escape(crashed)):
                fake.read(b"x" * 10, ONE, "cpu", None)


def test_a_reader_that_hangs_is_stopped_at_its_time_limit():
    with _fake_reader("time.sleep(60)", timeout_s=0.5) as fake, \
            pytest.raises(InvalidArgument, match=re.escape("took over 0.5 s")):
        fake.read(b"x" * 10, ONE, "cpu", None)


def test_a_reader_that_cannot_start_is_the_servers_fault():
    with ArtifactReader(command=[sys.executable, "-c", "raise SystemExit(3)"]) as broken, \
            pytest.raises(Unavailable, match=re.escape("did not start (exit status 3)")):
        broken.read(b"x", ONE, "cpu", None)
