"""A server joining a Ray cluster (`--ray-address`) that it did not start.

- It refuses a Ray without token authentication unless told `--insecure-ray`, and then
  warns, naming the flag (docs/security.md).
- It takes its islands from the nodes' labels: a node labelled `isthmus.dev/island: a` with
  `isthmus.dev/devices: "2"` is host a0 of island a with two devices, its executor pinned to
  that node (docs/kubernetes.md, "Labels"). One node here; the multi-node form needs nodes
  of their own (network namespaces, tests/e2e/test_multinode.py).

One Ray for the module (no token auth, loopback, labelled) and one server joined to it, each
in its own process group, stopped by their pids.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from external_ray import start_ray_without_auth, stop

from client.embedded import EmbeddedServer
from server.state import secret

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

LABELS = {"isthmus.dev/island": "a", "isthmus.dev/devices": "2"}
# The server must resolve 127.0.0.1 as loopback too (Ray's single-machine mode).
ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


@pytest.fixture(scope="module")
def ray_address() -> Iterator[str]:
    head, address = start_ray_without_auth(LABELS)
    try:
        yield address
    finally:
        stop(head)


def state_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A state dir whose server has a Ray token, which the cluster does not ask for."""
    state = tmp_path_factory.mktemp("joining") / "state"
    secret(state / "ray_token")
    return state


@pytest.fixture(scope="module")
def joined(ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedServer]:
    state = state_dir(tmp_path_factory)
    srv = EmbeddedServer.start(state, extra=["--ray-address", ray_address, "--insecure-ray"], env=ENV)
    srv.token = (state / "token").read_text().strip()  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


def test_a_ray_without_token_auth_is_joined_only_with_insecure_ray(ray_address, joined, tmp_path_factory):
    state = state_dir(tmp_path_factory)
    with pytest.raises(RuntimeError) as refused:
        EmbeddedServer.start(state, extra=["--ray-address", ray_address], env=ENV).stop()
    assert "does not require the token" in str(refused.value)
    assert "--insecure-ray" in str(refused.value)
    assert "--insecure-ray" in "".join(joined.log)  # the warning names what it allowed


def test_a_labelled_node_is_a_host_of_its_island_and_runs_calls(joined):
    import client as isthmus

    with isthmus.connect(joined.address, token=joined.token, name="labels") as c:
        table = c.devices()
        islands = [(i["name"], [h["name"] for h in i["hosts"]]) for i in table.islands]
        assert islands == [("a", ["a0"])]
        assert len(table.devices) == 2, json.dumps(table.devices)
        s = c.slice({"x": 2}, island="a")
        f = c.jit(lambda v: v * 2.0 + 1.0, slice=s)
        x = np.arange(4, dtype=np.float32)
        np.testing.assert_array_equal(f(c.put(x, s)).numpy(), x * 2.0 + 1.0)
