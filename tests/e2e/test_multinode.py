"""A real multi-node Ray on this machine: each node in a network namespace of its own, with its
own address on a bridge (`ip netns` and veth pairs; needs root). The head's node runs the
Isthmus server, which joins the cluster and takes its islands from the worker nodes' labels:
a0 and a1 (island a) and b0 (island b), each executor on its own node (its process in the
node's namespace, and the address and Ray node it reports its node's). A two-island program
moves a value from island a to island b, node to node, and equals local JAX. A node labelled
for island b then joins the running cluster and becomes host b1, which a new slice uses.
Last, node b0 stops: a call there fails typed within 10 s while island a goes on, and the
island heals by itself (b0, whose node Ray finds gone, is marked down; b1 serves again).

Before the node joins, `bench.multinode --smoke` runs its multi-node half on this cluster's
server (`--cluster-server`) and its embedded half on the test run's; its JSON is checked as
every benchmark's is (`bench_smokes.py`), and the call-latency and dispatch JSON of each half
as those smokes' own would be (they do not run again in `test_bench_smoke.py`). One cluster,
started once, serves both.

The cluster is `bench.netns`'s: it stops every process in its namespaces by pid, then
removes the namespaces.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import jax
import numpy as np
import pytest
from bench_smokes import SMOKES, addresses, baseline_ray, check_result, run_smoke, runs_within
from polling import admin_hosts, until

from bench.netns import Cluster, netns_cluster, unusable

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
XDIST_GROUP = "netns"  # one namespace cluster at a time under pytest-xdist (tests/conftest.py)
XDIST_EARLY = True  # a long module: handed out first under pytest-xdist (tests/conftest.py)

WORKERS = {"a0": "a", "a1": "a", "b0": "b"}  # node -> its island
LATER = {"b1": "b"}  # a node that joins once the server runs
DEVICES = 4  # simulated CPU devices per worker node (bench.dispatch's slices fill a host)

__all__ = ["addresses", "baseline_ray"]  # fixtures, from bench_smokes


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    why = unusable()
    if why is not None:
        pytest.skip(why)
    with netns_cluster(tmp_path, WORKERS, later=list(LATER), devices=DEVICES) as c:
        yield c


def test_islands_are_nodes_and_values_move_between_them(cluster: Cluster, tmp_path: Path, baseline_ray: None,
                                                        addresses) -> None:
    import client as isthmus

    srv, api_token = cluster.start_server(tmp_path / "state", {"ISTHMUS_NODE_POLL_S": "0.5"})
    try:
        with isthmus.connect(srv.address, token=api_token, name="multinode") as c:
            table = c.devices()
            islands = {i["name"]: [h["name"] for h in i["hosts"]] for i in table.islands}
            assert islands == {"a": ["a0", "a1"], "b": ["b0"]}
            assert len(table.devices) == DEVICES * len(WORKERS)
            for node in WORKERS:  # each host's executor runs on its own node, nowhere else
                assert cluster.processes(node).count("ray::RayHost") == 1, (node, cluster.processes(node))
            assert "ray::RayHost" not in cluster.processes("head")
            rows = admin_hosts(srv.address, api_token)
            assert {h: r["address"] for h, r in rows.items()} == {n: cluster.addresses[n] for n in WORKERS}
            assert len({r["node"] for r in rows.values()}) == len(WORKERS)  # three Ray nodes

            sa, sb = c.slice({"x": DEVICES}, island="a"), c.slice({"x": DEVICES}, island="b")
            f = c.jit(lambda v: v * 2.0 + 1.0, slice=sa)
            g = c.jit(lambda v: jax.numpy.cumsum(v) - 3.0, slice=sb)
            two_islands = c.program(lambda v: g(f(v)))  # a -> b: the value crosses node to node
            x = np.arange(8, dtype=np.float32)
            want = np.asarray(jax.jit(lambda v: jax.numpy.cumsum(v * 2.0 + 1.0) - 3.0)(x))
            np.testing.assert_array_equal(two_islands(c.put(x, sa)).numpy(), want)
            np.testing.assert_array_equal(g(f(c.put(x, sa))).numpy(), want)  # op by op too

            token_file = tmp_path / "cluster_token"
            token_file.write_text(api_token)
            smoked = run_smoke("multinode", tmp_path, addresses, "--cluster-server", srv.address,
                               "--cluster-token-file", str(token_file))
            assert smoked["workers"] == WORKERS and smoked["devices_per_host"] == DEVICES
            for name, smoke in SMOKES.items():  # the smokes it ran, in both halves, as their own would be
                if runs_within(smoke):
                    check_result(name, smoked["embedded"][name])
                    check_result(name, smoked["multinode"][name])

            # A node labelled for island b joins: it becomes host b1, and a new slice takes it
            # (b0 holds sb already, so b1 is the least loaded host of b).
            cluster.start_node("b1", LATER["b1"])
            rows = until(lambda: (r := admin_hosts(srv.address, api_token)).get("b1") and r, 90,
                         "host b1 in the islands' table")
            assert rows["b1"]["island"] == "b" and rows["b1"]["address"] == cluster.addresses["b1"]
            assert cluster.processes("b1").count("ray::RayHost") == 1
            sb1 = c.slice({"x": DEVICES}, island="b")
            assert sb1.hosts == ["b1"], sb1.hosts
            g1 = c.jit(lambda v: jax.numpy.cumsum(v) - 3.0, slice=sb1)
            want_g = jax.jit(lambda v: jax.numpy.cumsum(v) - 3.0)
            np.testing.assert_array_equal(c.program(lambda v: g1(f(v)))(c.put(x, sa)).numpy(), want)

            # A worker node stops: its host fails, typed (not a hang: the test's timeout); island
            # a goes on.
            y = c.put(x, sb)
            cluster.stop_node("b0")
            with pytest.raises((isthmus.Unavailable, isthmus.RemoteError)):
                g(y).numpy()
            np.testing.assert_array_equal(f(c.put(x, sa)).numpy(), x * 2.0 + 1.0)
            # The island heals by itself: Ray finds b0's node gone, so b0 is marked down (its
            # devices too) rather than replaced, and b1, on the same island, serves again.
            until(lambda: all(d["status"] == "down" for d in c.devices().devices if d["host"] == "b0"),
                  120, "host b0 marked down")
            np.testing.assert_array_equal(g1(c.put(x, sb1)).numpy(), want_g(x))
    finally:
        srv.stop()
    assert sys.platform == "linux"

