"""Start or join the Ray that the executors run on, closed to anyone without Ray's token.

Contract:
- A Ray without token authentication (before 2.52) is refused, by its version.
- A Ray this process starts (`address=None`, the embedded default) is never one found
  running on the machine, except the daemon Ray of its own state dir (`daemon_dir`,
  `executors.ray_daemon`), which a server killed before left for the next one. It binds
  every server it has to loopback, requires the token in `token_file` (without one, a
  token made for this start that only this process and its children hold), and exports no
  metrics from its nodes (with ray[default] installed, the autoscaler's and the
  dashboard's own exporters remain, on loopback). Its workers (the executors) run at the
  priority of the process that starts it, not at Ray's default nice 15, unless
  RAY_worker_niceness says otherwise. With `daemon_dir` it runs apart from this process,
  and outlives it; without, in this process's own tree.
- An external Ray (`address`) is joined with the token in `token_file` when that file
  exists, else with the one Ray finds itself (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH,
  ~/.ray/auth_token).
- What Ray does is checked, not what it was told: every node's runtime-env agent, asked
  without the token, must answer 401 (an external Ray's right after joining it, before any
  executor runs there; our own Ray's once its first workers run, `check_own`), and a Ray of
  our own must have every node on loopback. A Ray that fails this is refused (`UnsafeRay`);
  only `insecure` lets the server join an external Ray without token authentication
  (docs/security.md says why that is refused by default).

Ray reads its settings from environment variables, which its daemons and workers inherit
from this process; so they are set here, in `os.environ`, before `ray.init`.
"""

from __future__ import annotations

import http.client
import ipaddress
import logging
import os
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from executors import ray_daemon
from ir import InvalidArgument

log = logging.getLogger("isthmus.executors")

MIN_RAY = (2, 52)  # the first Ray with token authentication
PROBE_TIMEOUT_S = 10.0


class UnsafeRay(InvalidArgument):
    """The Ray to run on would take requests from peers without its token."""


@dataclass(frozen=True)
class Connection:
    """This process's hold on Ray: one it started (`owned`: in its own tree, or the daemon
    of its state dir) or one it joined; and the environment it had before (`restore`)."""

    owned: bool
    daemon: ray_daemon.Daemon | None = None
    restore: Mapping[str, str | None] = field(default_factory=dict)

    def close(self) -> None:
        """Leave Ray, stop it if this process started it, and put the environment back as
        it was (so that a Ray started later in this process starts as if this one never had)."""
        if ray.is_initialized():
            ray.shutdown()
        if self.daemon is not None:
            self.daemon.stop()
        _use_environment(self.restore)


def connect(address: str | None, *, namespace: str, num_cpus: int, object_store_bytes: int,
            token_file: Path | None, insecure: bool, daemon_dir: Path | None = None,
            orphan_timeout_s: float = 600.0) -> Connection:
    """Start a Ray of this process's own (`address=None`) or join the one at `address`, as
    the module docstring says; `Connection.close` undoes it."""
    require_token_auth(ray.__version__)
    owned = address is None
    env = _own_env(token_file) if owned else _external_env(token_file, insecure)
    # Under `uv run`, Ray would start each worker through uv again; executors run this Python.
    env.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", os.environ.get("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0"))
    restore = _use_environment(env)
    try:
        return _connect(address, owned, restore, namespace=namespace, num_cpus=num_cpus,
                        object_store_bytes=object_store_bytes, token_file=token_file, insecure=insecure,
                        daemon_dir=daemon_dir, orphan_timeout_s=orphan_timeout_s)
    except BaseException:
        _use_environment(restore)
        raise


def _connect(address: str | None, owned: bool, restore: Mapping[str, str | None], *, namespace: str,
             num_cpus: int, object_store_bytes: int, token_file: Path | None, insecure: bool,
             daemon_dir: Path | None, orphan_timeout_s: float) -> Connection:
    common: dict[str, Any] = {"namespace": namespace, "logging_level": "WARNING", "log_to_driver": True}
    if owned and daemon_dir is not None:
        if token_file is None:
            raise InvalidArgument("a Ray daemon needs a token file")
        daemon = ray_daemon.find(daemon_dir) or ray_daemon.start(
            daemon_dir, num_cpus=num_cpus, object_store_bytes=object_store_bytes, token_file=token_file,
            orphan_timeout_s=orphan_timeout_s)
        try:
            ray.init(address=daemon.address, **common)
        except BaseException:
            daemon.stop()
            raise
        return Connection(True, daemon, restore)  # checked by `check_own` once its workers run
    if owned:
        ray.init(address="local", num_cpus=num_cpus, object_store_memory=object_store_bytes,
                 include_dashboard=False,
                 _system_config={"enable_metrics_collection": False, "enable_worker_prestart": False,
                                "prestart_worker_first_driver": False},
                 **common)
    else:
        try:
            ray.init(address=address, **common)
        except ray.exceptions.AuthenticationError as e:
            raise UnsafeRay(f"joining Ray at {address} with its token failed: {e}. Put the cluster's "
                            f"token in {token_file} (mode 0600) or in RAY_AUTH_TOKEN; a Ray without "
                            "token authentication is joined only with --insecure-ray") from None
    if owned:
        return Connection(True, None, restore)  # checked by `check_own` once its workers run
    if insecure:
        log.warning("joining Ray at %s without checking that it requires its token "
                    "(--insecure-ray): anyone who can reach it can run code there", address)
        return Connection(False, None, restore)
    try:
        check_nodes(ray.nodes(), loopback=False)
    except BaseException:
        ray.shutdown()
        raise
    return Connection(False, None, restore)


def check_own() -> None:
    """Check the Ray `connect` started, once its first workers run: a node's runtime-env
    agent listens only some time after `ray.init` returns, but before any worker started
    with a runtime env does. The caller shuts Ray down if this raises."""
    check_nodes(ray.nodes(), loopback=True)


def require_token_auth(version: str) -> None:
    """Refuse a Ray older than the first one with token authentication."""
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        return  # a development build: its checks after the start still apply
    if found < MIN_RAY:
        raise UnsafeRay(f"Ray {version} has no token authentication; Isthmus needs Ray >= "
                        f"{'.'.join(map(str, MIN_RAY))}")


def check_nodes(nodes: list[dict[str, Any]], loopback: bool) -> None:
    """Refuse a Ray where a live node answers a peer without the token, or (`loopback`) where
    a node listens on another address than loopback."""
    for node in nodes:
        if not node.get("Alive"):
            continue
        host = node["NodeManagerAddress"]
        if loopback and not ipaddress.ip_address(host).is_loopback:
            raise UnsafeRay(f"Ray's node {node['NodeID'][:12]} listens on {host}, not on loopback")
        status = probe(host, int(node.get("RuntimeEnvAgentPort", -1)))
        if status != 401:
            remedy = ("this Ray did not take the token settings it was started with" if loopback else
                      "start that Ray with RAY_AUTH_MODE=token, or pass --insecure-ray to join it anyway")
            raise UnsafeRay(f"Ray's node at {host} does not require the token: its runtime-env agent, "
                            f"asked without it, answered {status} (expected 401); {remedy} "
                            "(docs/security.md)")


def probe(host: str, port: int) -> int | str:
    """What a node's runtime-env agent answers to a request without the token: an HTTP
    status, or why there was none."""
    if port <= 0:
        return "no runtime-env agent port"
    conn = http.client.HTTPConnection(host, port, timeout=PROBE_TIMEOUT_S)
    try:
        conn.request("GET", "/")
        return conn.getresponse().status
    except OSError as e:
        return f"no answer ({e})"
    finally:
        conn.close()


def _own_env(token_file: Path | None) -> dict[str, str | None]:
    """The environment of a Ray this process starts (None: unset)."""
    _refuse_disabled_auth()
    env: dict[str, str | None] = {
        # Ray's single-machine mode (its default on macOS and Windows): the node's address is
        # the loopback, and GCS, raylet, workers and agents bind to it, not to every interface.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "token",
        # Ray starts its workers at nice 15, behind everything else on the machine; the
        # executors' work is the latency a client waits for (docs/architecture.md).
        "RAY_worker_niceness": os.environ.get("RAY_worker_niceness", "0"),
    }
    if token_file is not None:
        env |= {"RAY_AUTH_TOKEN_PATH": str(token_file), "RAY_AUTH_TOKEN": None}  # the variable would win
    else:
        env |= {"RAY_AUTH_TOKEN": secrets.token_urlsafe(32), "RAY_AUTH_TOKEN_PATH": None}
    return env


def _external_env(token_file: Path | None, insecure: bool) -> dict[str, str | None]:
    """The environment for joining an external Ray: its token, and token mode unless
    `insecure` leaves that to Ray's own RAY_AUTH_MODE."""
    env: dict[str, str | None] = {}
    if not insecure:
        _refuse_disabled_auth()
        env["RAY_AUTH_MODE"] = "token"
    if token_file is not None and token_file.exists():
        env |= {"RAY_AUTH_TOKEN_PATH": str(token_file), "RAY_AUTH_TOKEN": None}
    return env


def _refuse_disabled_auth() -> None:
    mode = os.environ.get("RAY_AUTH_MODE", "token")
    if mode.lower() != "token":
        raise UnsafeRay(f"RAY_AUTH_MODE={mode} in the environment: Isthmus runs Ray only with token "
                        "authentication (unset it; to join an external Ray without it, see --insecure-ray)")


def _use_environment(env: Mapping[str, str | None]) -> dict[str, str | None]:
    """Put `env` in this process's environment (for Ray's daemons and workers to inherit) and
    make Ray in this process read it again; returns what it replaced."""
    previous = {name: os.environ.get(name) for name in env}
    for name, value in env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    # This process imported Ray, which read some of these variables then, before the server
    # knew its settings. Ray has no public way to read them again, so this does what Ray's
    # own start-up does when it turns token authentication on; the checks after the start
    # (`check_nodes`, and tests/e2e/test_listening_sockets.py) catch a Ray where it no
    # longer works. (Ray's `_raylet.pyi` declares neither class; the compiled module has both.)
    from ray._private import ray_constants
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    cluster = os.environ.get(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR)
    ray_constants.ENABLE_RAY_CLUSTER = (not ray_constants.IS_WINDOWS_OR_OSX if cluster is None
                                        else cluster.lower() in ("1", "true"))
    Config.initialize("")  # RAY_AUTH_MODE
    AuthenticationTokenLoader.instance().reset_cache()  # the token (a new one on each start)
    return previous
