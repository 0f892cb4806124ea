"""What a client's `jax.export` artifact may contain before XLA sees it.

Contract: `check_exported(exported)` refuses what the artifact's own fields claim (waived
safety checks, a calling convention this JAX cannot call); `check_module(module, max_ops)`
walks every operation of the deserialized StableHLO module, nested regions (while and case
bodies, shard_map bodies) included, and refuses custom calls outside jax.export's stable
targets (host callbacks among them), transfers to or from the host, ops of dialects
jax.export does not emit, and more than `max_ops` operations. Both raise `InvalidArgument`
naming the field, op, target and function; `check_module` returns the number of operations.

The walk runs on the MLIR objects, never on text or bytes: a target name is the attribute's
value, so no spelling or escaping hides one. Reading untrusted bytes into MLIR can crash the
process that does it, so the server calls these from its artifact reader process
(`server.artifact_reader`), not from itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NoReturn

import jax
from jaxlib.mlir import ir as mlir
from jaxlib.mlir.dialects import stablehlo

from ir import InvalidArgument

# jax.export's custom-call targets "guaranteed stable", copied from jax 0.10.2
# (jax/_src/export/_export.py: _CUSTOM_CALL_TARGETS_GUARANTEED_STABLE, with _CPU_FFI_KERNELS
# and _GPU_FFI_KERNELS). These are the targets `jax.export` writes without a waiver, so every
# artifact the client makes fits; an artifact naming any other target was edited or exported
# with `disabled_checks`. Written out rather than imported because that name is private;
# tests/unit/server/test_artifact_policy.py compares the two to notice drift on a JAX upgrade.
STABLE_CUSTOM_CALL_TARGETS: frozenset[str] = frozenset({
    # LAPACK on CPU: cholesky, qr, eigh, eig, svd, lu, tridiagonal, hessenberg, schur, solves
    "lapack_spotrf_ffi", "lapack_dpotrf_ffi", "lapack_cpotrf_ffi", "lapack_zpotrf_ffi",
    "lapack_sgeqrf_ffi", "lapack_dgeqrf_ffi", "lapack_cgeqrf_ffi", "lapack_zgeqrf_ffi",
    "lapack_sorgqr_ffi", "lapack_dorgqr_ffi", "lapack_cungqr_ffi", "lapack_zungqr_ffi",
    "lapack_ssyevd_ffi", "lapack_dsyevd_ffi", "lapack_cheevd_ffi", "lapack_zheevd_ffi",
    "lapack_sgeev_ffi", "lapack_dgeev_ffi", "lapack_cgeev_ffi", "lapack_zgeev_ffi",
    "lapack_sgesdd_ffi", "lapack_dgesdd_ffi", "lapack_cgesdd_ffi", "lapack_zgesdd_ffi",
    "lapack_sgetrf_ffi", "lapack_dgetrf_ffi", "lapack_cgetrf_ffi", "lapack_zgetrf_ffi",
    "lapack_ssytrd_ffi", "lapack_dsytrd_ffi", "lapack_chetrd_ffi", "lapack_zhetrd_ffi",
    "lapack_sgehrd_ffi", "lapack_dgehrd_ffi", "lapack_cgehrd_ffi", "lapack_zgehrd_ffi",
    "lapack_sgees_ffi", "lapack_dgees_ffi", "lapack_cgees_ffi", "lapack_zgees_ffi",
    "lapack_strsm_ffi", "lapack_dtrsm_ffi", "lapack_ctrsm_ffi", "lapack_ztrsm_ffi",
    "lapack_sgtsv_ffi", "lapack_dgtsv_ffi", "lapack_cgtsv_ffi", "lapack_zgtsv_ffi",
    # lu, qr, cholesky, eigh, svd and tridiagonal on GPU
    "cu_lu_pivots_to_permutation", "cusolver_getrf_ffi",
    "hip_lu_pivots_to_permutation", "hipsolver_getrf_ffi",
    "cusolver_geqrf_ffi", "cusolver_orgqr_ffi", "hipsolver_geqrf_ffi", "hipsolver_orgqr_ffi",
    "cusolver_potrf_ffi", "hipsolver_potrf_ffi",
    "cusolver_syevd_ffi", "hipsolver_syevd_ffi",
    "cusolver_gesvd_ffi", "cusolver_gesvdj_ffi",
    "hipsolver_gesvd_ffi", "hipsolver_gesvdj_ffi", "hipsolver_gesdd_ffi",
    "cusolver_sytrd_ffi", "hipsolver_sytrd_ffi",
    "cusparse_gtsv2_ffi",
    # sharding annotations and shard_map boundaries
    "Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "annotate_device_placement",
    # threefry random bits on GPU
    "cu_threefry2x32_ffi", "hip_threefry2x32_ffi",
    # linear algebra and top-k on TPU
    "Eigh", "Qr", "ProductOfElementaryHouseholderReflectors", "LuDecomposition",
    "ApproxTopK", "stablehlo.dynamic_approx_top_k",
    "tf.call_tf_function",  # jax2tf.call_tf; needs TensorFlow's runtime to compile
    "tpu_custom_call",  # Pallas kernels on TPU
    "AllocateBuffer",  # lax.empty
    "mosaic_gpu_v2",  # Pallas Mosaic GPU kernels
    "stablehlo.dynamic_reduce_window", "stablehlo.dynamic_rng_bit_generator",
    "stablehlo.dynamic_top_k",
    "shape_assertion",  # shape polymorphism's assertions
})

# Infeed and outfeed always move values between the device and the host process, as do
# send and recv on a host channel (JAX's host callbacks on TPU); a computation has no use for
# them. Send and recv between devices (`lax.psend`/`precv` on GPU) are collectives: allowed.
HOST_TRANSFER_OPS = frozenset({"stablehlo.infeed", "stablehlo.outfeed"})
CHANNEL_OPS = frozenset({"stablehlo.send", "stablehlo.recv"})
_DEVICE_TO_DEVICE = 1  # stablehlo's ChannelType: DEVICE_TO_DEVICE

# The dialects a deserialized jax.export module is made of (shardy's `sdy` carries meshes,
# sharding constraints and shard_map bodies; `chlo` may survive in mixed serialization).
DIALECTS = frozenset({"builtin", "func", "stablehlo", "sdy", "chlo"})

_MESSAGE_LIMIT = 400


def check_exported(exported: Any) -> None:
    """Refuse an `Exported` whose fields waive a check, or that this JAX cannot call.

    Its effects are left alone: the ones that can be serialized at all (FFI calls,
    one-sided collectives, no-DCE markers) are not callbacks, and a callback's custom call is
    refused by the walk whatever the fields claim."""
    waived = [str(d) for d in exported.disabled_safety_checks]
    if waived:
        _refuse(f"artifact: disabled_safety_checks {waived} must be empty "
                "(an artifact may not waive jax.export's safety checks)")
    low = jax.export.minimum_supported_calling_convention_version
    high = jax.export.maximum_supported_calling_convention_version
    version = exported.calling_convention_version
    if not low <= version <= high:
        _refuse(f"artifact: calling convention version {version}; this server calls {low} to {high}")


def check_module(module: Any, max_ops: int | None = None) -> int:
    """Walk every operation of a deserialized module (an MLIR `Module` or `Operation`), refuse
    what may not reach XLA, and return how many operations it has."""
    count = 0
    # Iterative, not recursive: a module is untrusted, and its nesting depth is its author's.
    stack: list[tuple[Any, str]] = [(module.operation, "")]
    while stack:
        op, func = stack.pop()
        count += 1
        if max_ops is not None and count > max_ops:
            _refuse(f"artifact: its module has more than {max_ops} operations (max_artifact_ops)")
        name = op.name
        _check_op(op, name, func)
        if name == "func.func":
            func = _string(op, "sym_name") or "?"
        for region in op.regions:
            for block in region:
                stack.extend((o.operation, func) for o in block)
    return count


def _check_op(op: Any, name: str, func: str) -> None:
    where = f" in @{func}" if func else ""
    dialect = name.split(".", 1)[0]
    if dialect not in DIALECTS:
        _refuse(f"artifact: operation '{name}'{where} is of dialect '{dialect}'; "
                f"jax.export modules are made of {_listed(DIALECTS)}")
    if name in HOST_TRANSFER_OPS or (name in CHANNEL_OPS and _to_host(op)):
        _refuse(f"artifact: operation '{name}'{where} is not allowed "
                "(it moves data between the device and the host)")
    if name == "stablehlo.custom_call":
        target = _string(op, "call_target_name")
        if target is None:
            _refuse(f"artifact: a custom call{where} has no call_target_name string")
        if target not in STABLE_CUSTOM_CALL_TARGETS:
            why = ("host callbacks run Python on the executor" if target.endswith("callback")
                   else "not among jax.export's stable custom-call targets")
            _refuse(f"artifact: custom call to {target!r}{where} is not allowed ({why})")


def _to_host(op: Any) -> bool:
    """Whether a send/recv crosses to the host; one whose channel is unreadable counts."""
    attributes = op.attributes
    try:
        if "is_host_transfer" in attributes and mlir.BoolAttr(attributes["is_host_transfer"]).value:
            return True
        return bool(stablehlo.ChannelHandle(attributes["channel_handle"]).channel_type
                    != _DEVICE_TO_DEVICE)
    except (KeyError, ValueError):
        return True


def _string(op: Any, attribute: str) -> str | None:
    try:
        return str(mlir.StringAttr(op.attributes[attribute]).value)
    except (KeyError, ValueError):
        return None


def _listed(names: Iterable[str]) -> str:
    return ", ".join(sorted(names))


def _refuse(message: str) -> NoReturn:
    raise InvalidArgument(message[:_MESSAGE_LIMIT])
