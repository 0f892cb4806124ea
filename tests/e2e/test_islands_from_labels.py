"""A server joining a Ray cluster takes its islands from the nodes' labels: a node labelled
`isthmus.dev/island: a` with `isthmus.dev/devices: "2"` is host a0 of island a with two
devices, its executor pinned to that node (docs/kubernetes.md, "Labels"). One node here; the
multi-node form needs nodes of their own (network namespaces).

The test starts its Ray (no token auth, loopback, labelled) and the server in their own
process groups and stops both by their pids.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from external_ray import start_ray_without_auth, stop

from client.embedded import EmbeddedServer
from server.state import secret

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

LABELS = {"isthmus.dev/island": "a", "isthmus.dev/devices": "2"}


def test_a_labelled_node_is_a_host_of_its_island_and_runs_calls(tmp_path):
    import client as isthmus

    head, address = start_ray_without_auth(LABELS)
    try:
        state = tmp_path / "state"
        secret(state / "ray_token")
        env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
        srv = EmbeddedServer.start(state, extra=["--ray-address", address, "--insecure-ray"], env=env)
        try:
            token = (state / "token").read_text().strip()
            with isthmus.connect(srv.address, token=token, name="labels") as c:
                table = c.devices()
                islands = [(i["name"], [h["name"] for h in i["hosts"]]) for i in table.islands]
                assert islands == [("a", ["a0"])]
                assert len(table.devices) == 2, json.dumps(table.devices)
                s = c.slice({"x": 2}, island="a")
                f = c.jit(lambda v: v * 2.0 + 1.0, slice=s)
                x = np.arange(4, dtype=np.float32)
                np.testing.assert_array_equal(f(c.put(x, s)).numpy(), x * 2.0 + 1.0)
        finally:
            srv.stop()
    finally:
        stop(head)
