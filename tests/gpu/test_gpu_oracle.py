"""On a machine with an NVIDIA GPU: a host whose process sees the GPU serves it as its
devices, and computations on it equal local `jax.jit`. Skipped without a GPU."""

import json
import shutil
import subprocess

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


def gpu_count() -> int:
    if shutil.which("nvidia-smi") is None:
        return 0
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return len([line for line in out.stdout.splitlines() if line.startswith("GPU")])


@pytest.mark.skipif(gpu_count() == 0, reason="no NVIDIA GPU on this machine")
def test_matmul_on_a_gpu_host_equals_local_jit(tmp_path):
    import jax
    import jax.numpy as jnp

    import client as isthmus
    from client.embedded import EmbeddedServer

    cluster = tmp_path / "gpu.json"
    cluster.write_text(json.dumps({"islands": [
        {"name": "g", "hosts": [{"name": "g0", "devices": gpu_count(), "platform": "gpu"}]},
    ]}))
    server = EmbeddedServer.start(tmp_path / "state", extra=["--cluster", str(cluster)])
    try:
        token = (tmp_path / "state" / "token").read_text().strip()
        with isthmus.connect(server.address, token=token) as c:
            assert {d["platform"] for d in c.devices().devices} == {"gpu"}
            s = c.slice({"x": 1})
            f = c.jit(lambda w, x: jnp.tanh(x @ w), slice=s, in_specs=P(), out_specs=P())
            rng = np.random.default_rng(0)
            w = rng.standard_normal((256, 256), dtype=np.float32)
            x = rng.standard_normal((128, 256), dtype=np.float32)
            want = jax.jit(lambda w, x: jnp.tanh(x @ w), backend="cpu")(w, x)
            np.testing.assert_allclose(f(w, x).numpy(), np.asarray(want), rtol=2e-2, atol=2e-2)
    finally:
        server.stop()
