"""The server's one settings object, read from flags and `ISTHMUS_*` environment variables.

Built once at start-up (`isthmus serve`) and passed down; nothing reads settings at import.
"""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_PORT = 8470


def default_state_dir() -> Path:
    return Path.home() / ".isthmus"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ISTHMUS_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(DEFAULT_PORT, ge=0, le=65535)
    cluster_file: Path | None = None
    state_dir: Path = Field(default_factory=default_state_dir)
    token: str | None = Field(None, min_length=16)
    ray_address: str | None = None
    ray_num_cpus: int = Field(2, ge=1)
    object_store_mb: int = Field(1024, ge=64)
    max_upload_mb: int = Field(1024, ge=1)
    rpc_timeout_s: float = Field(120.0, gt=0)
    fetch_timeout_s: float = Field(600.0, gt=0)
    # How long a host waits for a peer's data, an executable, or (CPU) its peers in a
    # collective before failing the value.
    step_timeout_s: float = Field(300.0, gt=0)
    # A run's loops end, failed, once it has run this long on a host (its client closed: at
    # once). One computation (a lax.while_loop inside one jitted function) cannot be stopped:
    # its host's executor is replaced once it runs past this (server/healing.py).
    max_run_s: float = Field(3600.0, gt=0)
    # ... and once it has held its host this long while another client's work waits for
    # the host: a tenant holds a host it shares with others for at most this long at once.
    max_hold_s: float = Field(300.0, gt=0)
    # Program runs: one message per host (parallel), or one per node after the previous
    # one is accepted (sequential, for comparison).
    dispatch: Literal["parallel", "sequential"] = "parallel"
    # Trace every program run, as `trace=True` on a run asks for one (server/tracing.py): its
    # hosts wait for each of its computations as it runs, so that each span is its run.
    trace: bool = False
    # Each multi-host island forms one JAX distributed group, so a slice may span its hosts.
    # Off by default: the island's CPU collectives then all go through gloo, whose reduction
    # order can differ from one process's jax.jit in the last bit (measured).
    island_groups: bool = False
    # The per-island gang scheduler: its policy (share: proportional to the clients' weights,
    # the default, so that one client's backlog does not hold another's work on the island
    # behind all of it; or fifo) and how many calls or program runs an island has admitted and not
    # yet finished. Wide by default: a client's back-to-back calls then reach the executors
    # in few messages (calls/s doubled from 16 to 256, measured), while each executor still
    # bounds what it has in flight on its devices; a narrow window gives the share policy a
    # finer grain (1 is the finest).
    gang_policy: Literal["fifo", "share"] = "share"
    gang_window: int = Field(256, ge=1, le=1024)
    # ... and how many seconds of work, as each kind of submission took last (past two at
    # once): a backlog of long computations holds few places ahead of another client's work.
    gang_window_s: float = Field(0.5, gt=0, le=3600)
    # Computations an executor issues to its devices without waiting for each to finish
    # (XLA's asynchronous dispatch); 1 runs each to completion (docs/architecture.md).
    executor_in_flight: int = Field(8, ge=1, le=1024)
    # MiB of XLA temporaries (working memory no quota counts) a CPU host's computations in
    # flight may take together; one needing more alone fails to compile. Default: half the
    # memory of the host's machine (its cgroup's limit, if lower) shared by the hosts on it.
    executor_temp_mb: int | None = Field(None, ge=1)
    # MiB of buffers a CPU host may hold; past it (summed over the hosts of one machine) a
    # new buffer is refused (429). Default: 35% of the host's machine's memory (its cgroup's
    # limit, if lower) shared by the hosts on it: with the temporaries' half, the rest is the
    # server's, Ray's and the system's (server/host_memory.py).
    executor_buffer_mb: int | None = Field(None, ge=1)
    # MiB a host's runs may keep on their loop stacks together on its devices (the forward
    # values a loop's gradient reads back, executors/stacks.py), and swapped to host memory
    # past that (0: never swapped); past both the run fails, typed, and the host serves on.
    # Defaults: a quarter of the temporaries' share (executor_temp_mb), and as much again.
    executor_stack_mb: int | None = Field(None, ge=1)
    executor_stack_swap_mb: int | None = Field(None, ge=0)
    # The fraction of that room, in each machine's pool, kept for each open client's claim:
    # its weight's share of it. A client may take more only where the others' unused claims
    # leave room (alone, all of it), so that one cannot fill a machine the others share;
    # 0: first come, first served (server/host_memory.py).
    buffer_reserve: float = Field(1.0, ge=0, le=1)
    # Joining a cluster whose nodes' labels name the islands: how often to look for nodes
    # labelled since, which then become hosts (server/membership.py).
    node_poll_s: float = Field(5.0, gt=0, le=3600)
    # Islands heal by themselves (server/healing.py): every health_probe_s (0: never) each
    # host is asked for its stats, and one silent for health_timeout_s is lost, as one whose
    # channel ends is at once; its island restarts, tried heal_attempts times.
    health_probe_s: float = Field(5.0, ge=0, le=3600)
    health_timeout_s: float = Field(20.0, gt=0, le=3600)
    heal_attempts: int = Field(3, ge=1, le=100)
    # Debug only: False drops the island order (no admission, and each host of a submission
    # takes it after a random delay, in its own arrival order), to show what the order
    # prevents (docs/architecture.md). Never in production: cross-host collectives deadlock.
    gang_order: bool = True
    # Fuse adjacent computations on one slice into one executable (a program may override).
    # Off by default: XLA then optimizes across the computations, which can move results by
    # an ulp or so against the same functions jitted apart.
    fuse: bool = False
    # The server's records (clients and their secrets, slices, buffers, computations,
    # programs) are kept in an SQLite file in the state dir, `db_file` if given, so that a
    # restarted server carries on with them (server/store.py); off: in memory only.
    persist: bool = True
    db_file: Path | None = None
    # Executors outlive the server (detached actors): a server started again takes over
    # those it finds, with the values they hold (server/recovery.py). The Ray the server
    # starts runs apart from it for that (executors/ray_daemon.py), and stops by itself once
    # no server has used it for orphan_timeout_s. On a clean stop (SIGTERM, Ctrl-C) the server
    # stops what it started, or leaves the executors for the next server when
    # keep_executors; unset, they are kept on a Ray it joined, stopped on its own.
    keep_executors: bool | None = None
    # Lineage recovery (server/lineage.py): a lost buffer is made again from its upload, kept
    # up to lineage_mb in all, or by repeating the runs that made it; released buffers that
    # a kept buffer's lineage reads are remembered, up to lineage_released of them.
    lineage_mb: int = Field(1024, ge=0)
    lineage_released: int = Field(10_000, ge=0)
    orphan_timeout_s: float = Field(600.0, gt=0)
    allow_remote: bool = False
    # Join an external Ray cluster (`ray_address`) that has no token authentication. Off by
    # default: such a cluster runs whatever anyone who can reach it sends (docs/security.md).
    insecure_ray: bool = False
    # `GET /metrics` (Prometheus) answers the admin token, and this token too where it is set
    # (off by default): a scraper need not hold the admin's. Its client label names at most
    # `metrics_client_labels` distinct client names; the rest count as "other" (server/metrics.py).
    metrics_token: str | None = Field(None, min_length=16)
    metrics_client_labels: int = Field(16, ge=0, le=1000)

    # -- limits on what one request or one client may hold (docs/security.md) ----------------
    max_json_mb: int = Field(64, ge=1)  # JSON bodies (artifacts travel base64 inside them)
    max_bodies_mb: int = Field(2048, ge=1)  # request bodies in progress at once, all clients
    max_artifact_mb: int = Field(32, ge=1)  # one serialized jax.export artifact
    max_artifact_ops: int = Field(200_000, ge=1)  # operations in one artifact's module
    # Processes reading artifacts (server.readers): one client's reads take one at a time;
    # one starts with the server, the others once reads overlap.
    artifact_readers: int = Field(2, ge=1, le=16)
    max_clients: int = Field(1024, ge=1)  # open client sessions
    max_slices: int = Field(64, ge=1)  # per client
    max_buffer_mb: int = Field(16_384, ge=1)  # live buffer bytes per client
    max_buffers: int = Field(100_000, ge=1)  # live buffers per client
    max_computations: int = Field(1024, ge=1)  # per client
    max_programs: int = Field(256, ge=1)  # per client
    # distinct (artifact, slice) pairs in one program: each is an executable its hosts compile
    max_program_computations: int = Field(256, ge=1)
    max_stored_mb: int = Field(1024, ge=1)  # per client: its artifacts and programs kept in the state dir
    max_queued: int = Field(4096, ge=1)  # calls and runs a client has waiting for admission
    # Connections that send no request (docs/security.md): a request's headers must be
    # complete within `header_timeout_s`; past `max_idle_connections` idle at once, a new one
    # closes the one idle the longest.
    header_timeout_s: float = Field(10.0, gt=0, le=3600)
    max_idle_connections: int = Field(1024, ge=1)
    # A client that sends nothing for this long is closed and everything it holds freed (the
    # Python client renews its lease in the background while it is open).
    client_lease_s: float = Field(300.0, gt=0)

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> Settings:
        if not self.allow_remote and not _is_loopback(self.host):
            raise ValueError(
                f"host {self.host!r} is not a loopback address; serving beyond this machine "
                "needs ISTHMUS_ALLOW_REMOTE=1 and an explicit ISTHMUS_TOKEN"
            )
        if self.allow_remote and self.token is None:
            raise ValueError("ISTHMUS_ALLOW_REMOTE needs an explicit ISTHMUS_TOKEN")
        return self

    @property
    def token_file(self) -> Path:
        return self.state_dir / "token"

    @property
    def ray_token_file(self) -> Path:
        """Ray's token for the Ray this server starts: kept with the server's state, 0600."""
        return self.state_dir / "ray_token"

    @property
    def db_path(self) -> Path | None:
        """Where the records are kept (None: in memory only)."""
        return (self.db_file or self.state_dir / "state.db") if self.persist else None

    def resolve_token(self) -> str:
        """The configured admin token, else the one in the state dir (written there first if
        there is none; see `server.state` for what makes one acceptable)."""
        from server.state import ensure_state_dir, secret

        ensure_state_dir(self.state_dir)
        return self.token or secret(self.token_file, 24)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
