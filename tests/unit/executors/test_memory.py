"""The working memory a CPU host's computations take (`executors.memory`)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from executors.memory import MIB, Budget, check, machine_memory, working_bytes

pytestmark = [pytest.mark.unit, pytest.mark.timeout(60)]


def test_the_default_budgets_are_shares_of_the_machine_divided_among_its_hosts():
    assert Budget(sharing=4).temp_bytes(machine=24 << 30) == 3 << 30
    assert Budget().temp_bytes(machine=1000) == 500
    assert Budget(temp_mb=64, sharing=4).temp_bytes(machine=1 << 40) == 64 * MIB
    assert 0 < Budget().temp_bytes() <= machine_memory()
    assert Budget(sharing=4).buffer_bytes(machine=4000) == 350
    assert Budget(buffer_mb=100, sharing=4).buffer_bytes(machine=1 << 40) == 100 * MIB
    assert Budget(temp_mb=64).buffer_bytes(machine=1000) == 350  # each set alone


def test_a_cgroup_limit_below_the_machine_is_the_memory(tmp_path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "limit_in_bytes"
    v2.write_text("max\n")
    v1.write_text(f"{1 << 62}\n")  # cgroup v1's "no limit"
    physical = machine_memory(())
    assert machine_memory((v2, v1, tmp_path / "absent")) == physical
    v2.write_text("1073741824\n")
    assert machine_memory((v2, v1)) == min(physical, 1 << 30)


def test_working_bytes_are_the_temporaries_on_each_of_this_hosts_devices():
    big = jax.jit(lambda x: x + (jnp.full((1024, 1024), x[0]) @ jnp.ones(1024))[:4] * 0)
    exe = big.lower(jnp.ones(4, jnp.float32)).compile()
    needed, devices = working_bytes(exe)
    assert devices == 1 and needed >= 1024 * 1024 * 4, needed  # the [1024, 1024] it materializes
    small = jax.jit(lambda x: x + 1).lower(np.ones(4, np.float32)).compile()
    assert working_bytes(small)[0] < 4096


def test_a_computation_over_the_budget_alone_is_refused_naming_both_figures():
    check(100 * MIB, 4, 100 * MIB, "a0")  # exactly the budget fits
    with pytest.raises(MemoryError) as e:
        check(12 << 30, 4, 3 << 30, "a0")
    assert str(e.value) == (
        "it needs 12288 MiB of working memory on host a0 (XLA temporaries: 3072 MiB a device, on 4 "
        "devices); a host's computations in flight may take 3072 MiB together (executor_temp_mb)")
