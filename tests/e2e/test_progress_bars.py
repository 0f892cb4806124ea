"""Progress bars through a real server: an upload, a fetch and a compile each draw theirs on
stderr when asked (`ISTHMUS_PROGRESS=1`), and the values go and come back whole."""

from __future__ import annotations

import numpy as np
import pytest

from client import progress

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_an_upload_a_fetch_and_a_compile_show_their_bars(c, monkeypatch, capsys):
    monkeypatch.setenv("ISTHMUS_PROGRESS", "1")
    monkeypatch.setattr(progress, "MIN_BYTES", 64 << 10)  # what counts as large, here
    monkeypatch.setattr(progress, "CHUNK", 16 << 10)
    monkeypatch.setattr(progress, "AFTER_S", 0.0)  # every wait is long
    s = c.slice({"x": 1})
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32)  # 400 kB: sent alone
    b = c.put(x, s)
    f = c.jit(lambda v: v * 2, slice=s, name="doubled")
    y = f(b)
    np.testing.assert_array_equal(y.numpy(), x * 2)
    drawn = capsys.readouterr().err
    assert f"upload {b.id}" in drawn and f"fetch {y.id}" in drawn and "compile doubled" in drawn
