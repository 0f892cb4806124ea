"""Read an untrusted `jax.export` artifact in a process of its own.

Contract: `read(data, mesh, platform, max_ops)` deserializes an artifact, applies
`server.artifact_policy` to its fields and to every operation of its StableHLO module, and
returns what the server must know of it as a JSON-able dict; it raises `InvalidArgument`
naming the problem. `ArtifactReader.read(...)` does the same in a child process and never
raises anything else: a reader that crashes or overruns its time comes back as
`InvalidArgument`, and the next call starts a fresh one.

Why a process: deserializing MLIR bytecode is native code, and bytes flipped in a real
artifact can crash it, loop in it or make it allocate without bound. Flipping 1-8 bytes of
one small module 1,500 times gave 17 crashes (SIGSEGV, SIGABRT) and 2 reads still running
after minutes; another flip allocated until the kernel killed the process. Checked in the
server itself, one such request would take the server down. The child caps its address
space, so runaway allocation fails there as `MemoryError`, and is killed at `timeout_s`.
Whatever it accepted deserializes the same way on the executors, so they never see bytes
that crash or hang the reader.

Protocol (pipes, one request at a time): the child says `{"ready": true}` once JAX is
imported; then, per request, the parent writes a JSON header line `{"size", "mesh",
"platform", "max_ops"}` and `size` bytes, and the child answers one JSON line, `{"info":
{...}}` or `{"error": message}`. `ArtifactReader` is thread-safe (one lock, so one read at a
time); a read blocks its caller for up to `timeout_s`.
"""

from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, cast

import jax
import jax.extend.mlir
from jax.sharding import AbstractMesh, AxisType
from jaxlib.mlir import ir as mlir

from ir import Aval, InvalidArgument, MeshAxes, Spec, Unavailable, dtype_name
from server.artifact_policy import check_exported, check_module

_MESSAGE_LIMIT = 400
_READY = b'{"ready": true}'
_SERVER_DIR = Path(__file__).resolve().parent
# The child imports two modules of the `server` package, not the package: its __init__ builds
# the whole app (Ray included), seconds and hundreds of MB the reader has no use for.
_CHILD = (
    "import sys, types; p = types.ModuleType('server'); p.__path__ = [sys.argv[1]]; "
    "sys.modules['server'] = p; from server.artifact_reader import main; main(int(sys.argv[2]))"
)


def read(data: bytes, mesh: MeshAxes, platform: str, max_ops: int | None = None) -> dict[str, Any]:
    """What the server must know of an artifact, after the policy's checks (in this process)."""
    try:
        exported = jax.export.deserialize(bytearray(data))
    except Exception as e:  # any parse failure is the caller's bad artifact
        _refuse(f"artifact: not a serialized jax.export artifact ({type(e).__name__}: {e})")
    check_exported(exported)
    platforms = [p.lower() for p in exported.platforms]
    info: dict[str, Any] = {
        "in_avals": [_aval(a, f"input {i}").to_json() for i, a in enumerate(exported.in_avals)],
        "out_avals": [_aval(a, f"output {i}").to_json() for i, a in enumerate(exported.out_avals)],
        "platforms": platforms,
        "nr_devices": exported.nr_devices,
    }
    wanted = {"gpu": ("cuda", "rocm")}.get(platform, (platform,))
    if not set(wanted) & set(platforms):
        _refuse(f"artifact: exported for platforms {platforms}; the slice runs on {platform}")
    if exported.nr_devices != mesh.size:
        _refuse(f"artifact: exported for {exported.nr_devices} devices; the slice has {mesh.size}")
    check_module(_module(exported.mlir_module_serialized), max_ops)
    # Auto axes, as the executors' concrete meshes have (newer JAX defaults to Explicit),
    # unless the artifact was traced on others: then its avals carry that mesh in their
    # types, and JAX reads its shardings only on a mesh of those types.
    carried = [m for a in (*exported.in_avals, *exported.out_avals)
               if (m := getattr(getattr(a, "sharding", None), "mesh", None)) is not None and m.axis_names]
    types = carried[0].axis_types if carried else (AxisType.Auto,) * len(mesh.names)
    try:
        abstract = AbstractMesh(mesh.sizes, mesh.names, axis_types=types)
        info["in_specs"] = _specs(exported.in_shardings_jax(abstract))
        info["out_specs"] = _specs(exported.out_shardings_jax(abstract))
    except Exception as e:  # shardings over other axes: the artifact was made for another mesh
        _refuse(f"artifact: its shardings do not fit the slice's mesh {mesh.to_json()}: {e}")
    return info


def _module(serialized: bytes) -> Any:
    """The StableHLO module, in a context of its own (nothing a hostile module interns
    outlives the request) that reports MLIR's diagnostics instead of printing them."""
    context = mlir.Context()
    context.enable_multithreading(False)
    diagnostics: list[str] = []

    def keep(d: Any) -> bool:
        diagnostics.append(str(d.message))
        return True

    # (typed `object` in jaxlib's stub; it is a DiagnosticHandler)
    handler = cast(mlir.DiagnosticHandler, context.attach_diagnostic_handler(keep))
    try:
        return jax.extend.mlir.deserialize_portable_artifact(serialized, context)
    except Exception as e:
        _refuse(f"artifact: its StableHLO module cannot be read ({'; '.join(diagnostics) or e})")
    finally:
        handler.detach()


def _aval(a: Any, what: str) -> Aval:
    shape = getattr(a, "shape", ())
    if not all(isinstance(d, int) for d in shape):
        _refuse(f"artifact: {what} has a symbolic shape {shape}; shapes must be static")
    try:
        return Aval(tuple(shape), dtype_name(a.dtype))
    except InvalidArgument as e:
        _refuse(f"artifact: {what}: {e}")


def _specs(shardings: Sequence[Any]) -> list[Any]:
    return [None if s is None or not hasattr(s, "spec") else Spec.of(s.spec).to_json() for s in shardings]


def _refuse(message: str) -> NoReturn:
    raise InvalidArgument(message[:_MESSAGE_LIMIT])


# -- the child ------------------------------------------------------------------------------

def main(memory_mb: int) -> None:
    """The reader process: answer requests on stdin until it closes, mapping at most
    `memory_mb` beyond what importing this module (JAX included) mapped."""
    _exit_with_parent()
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # whatever else prints must not corrupt the replies
    headroom = memory_mb << 20
    mapped = _vm_size()
    if mapped:
        resource.setrlimit(resource.RLIMIT_AS, (mapped + headroom, mapped + headroom))
    replies.write(_READY + b"\n")
    replies.flush()
    requests = sys.stdin.buffer
    while header := requests.readline():
        request = json.loads(header)
        data = requests.read(request["size"])
        try:
            reply: dict[str, Any] = {"info": read(data, MeshAxes.of(request["mesh"]),
                                                  request["platform"], request["max_ops"])}
        except InvalidArgument as e:
            reply = {"error": str(e)}
        except Exception as e:  # MemoryError included: the artifact's fault, said as such
            reply = {"error": f"artifact: cannot be read ({type(e).__name__}: {e})"[:_MESSAGE_LIMIT]}
        replies.write(json.dumps(reply).encode() + b"\n")
        replies.flush()


def _exit_with_parent() -> None:
    """A reader stuck in a hostile module reads no EOF: a watch thread ends it when the
    server is gone (MLIR's reader releases the GIL, so the thread runs meanwhile)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _vm_size() -> int:
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0  # no /proc: the cap is skipped, the wall-clock limit remains
    line = next((x for x in status.splitlines() if x.startswith("VmSize:")), "")
    return int(line.split()[1]) << 10 if line else 0


# -- the parent -----------------------------------------------------------------------------

class ArtifactReader:
    """One reader process, started on first use and again after it dies."""

    def __init__(self, timeout_s: float = 30.0, memory_mb: int = 4096, start_timeout_s: float = 120.0,
                 command: Sequence[str] | None = None) -> None:
        # `command` replaces the child (tests give one that crashes or hangs).
        self._timeout_s, self._start_timeout_s = timeout_s, start_timeout_s
        self._command = list(command) if command else [
            sys.executable, "-P", "-c", _CHILD, str(_SERVER_DIR), str(memory_mb)]
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._greeted = False  # the child said it is ready

    def read(self, data: bytes, mesh: MeshAxes, platform: str, max_ops: int | None) -> dict[str, Any]:
        header = {"size": len(data), "mesh": [list(a) for a in mesh.axes], "platform": platform,
                  "max_ops": max_ops}
        with self._lock:
            process = self._ready()
            deadline = time.monotonic() + self._timeout_s
            try:
                assert process.stdin is not None and process.stdout is not None
                _write(process.stdin, json.dumps(header).encode() + b"\n" + data, deadline)
                line = _read_line(process.stdout, deadline)
            except TimeoutError:
                self._stop()
                _refuse(f"artifact: reading it took over {self._timeout_s:g} s; refused")
            except OSError:
                line = b""  # a broken pipe: the child died; its exit status says how
            if not line:
                _refuse(f"artifact: it crashed the artifact reader ({self._died()}); "
                        "it is not a well-formed jax.export artifact")
        reply = json.loads(line)
        if "error" in reply:
            _refuse(str(reply["error"]))
        return dict(reply["info"])

    def start(self) -> None:
        """Start the child now, without waiting for it (it imports JAX: about a second)."""
        with self._lock:
            self._started()

    def close(self) -> None:
        with self._lock:
            self._stop()

    def __enter__(self) -> ArtifactReader:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _ready(self) -> subprocess.Popen[bytes]:
        """The child, once it said it is ready; a child that cannot start is the server's
        fault, not the artifact's."""
        process = self._started()
        if not self._greeted:
            assert process.stdout is not None
            try:
                line = _read_line(process.stdout, time.monotonic() + self._start_timeout_s)
            except TimeoutError:
                line = b""
            if line.strip() != _READY:
                raise Unavailable(f"the artifact reader did not start ({self._died()})")
            self._greeted = True
        return process

    def _started(self) -> subprocess.Popen[bytes]:
        if self._process is None or self._process.poll() is not None:
            self._greeted = False
            env = os.environ | {"JAX_PLATFORMS": "cpu",  # reading needs no device; take none
                                "PYTHONPATH": os.pathsep.join(filter(None, (
                                    str(_SERVER_DIR.parent), os.environ.get("PYTHONPATH"))))}
            self._process = subprocess.Popen(self._command, stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, env=env)
            assert self._process.stdin is not None
            os.set_blocking(self._process.stdin.fileno(), False)  # see _write
        return self._process

    def _died(self) -> str:
        """How the child ended; it is stopped if it had not."""
        assert self._process is not None
        try:
            code: int | None = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._stop()
        if code is None:
            return "no answer"
        if code >= 0:
            return f"exit status {code}"
        return signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"

    def _stop(self) -> None:
        if self._process is None:
            return
        self._process.kill()  # nothing if it already ended
        self._process.wait()
        for pipe in (self._process.stdin, self._process.stdout):
            if pipe is not None:
                try:
                    pipe.close()
                except OSError:
                    pass  # a broken pipe has nothing left to flush
        self._process = None


def _write(pipe: IO[bytes], data: bytes, deadline: float) -> None:
    """All of `data`, or TimeoutError: a child that stops reading must not block the server."""
    fd = pipe.fileno()
    view = memoryview(data)
    while view:
        if not select.select([], [fd], [], max(0.0, deadline - time.monotonic()))[1]:
            raise TimeoutError
        try:
            written = os.write(fd, view[:1 << 16])  # non-blocking: a full pipe takes part of it
        except BlockingIOError:
            continue
        view = view[written:]


def _read_line(pipe: IO[bytes], deadline: float) -> bytes:
    """One reply line, b"" if the child closed its end first, or TimeoutError."""
    fd = pipe.fileno()
    chunks: list[bytes] = []
    while True:
        if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            raise TimeoutError
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b""
        chunks.append(chunk)
        if chunk.endswith(b"\n"):
            return b"".join(chunks)
