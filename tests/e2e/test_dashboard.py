"""The dashboard at `/`, in a real headless Chromium driven by Playwright, against the
session's embedded server while a tenant's slice is allocated and a program of it runs:
the grid shows both islands and all 16 devices with the slice and its owner; a tenant sees
its own slice and not another's; the admin sees both with their owners; a traced run's
trace downloads from the runs table. A screenshot of each view is saved with the test's
files (and under $ISTHMUS_SCREENSHOTS, where set).

Chromium is the system's (`/usr/bin/chromium`, Debian's package, which `.ci/run` installs;
or $ISTHMUS_CHROMIUM): Playwright's own download of a browser is not used."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from polling import admin_hosts, until

import client as isthmus

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium() -> str:
    path = os.environ.get("ISTHMUS_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail("no Chromium: install Debian's `chromium` package (.ci/run does) or set ISTHMUS_CHROMIUM")
    return path


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium(), headless=True, args=CHROMIUM_FLAGS)
        try:
            yield b
        finally:
            b.close()


def screenshot(page: Any, tmp_path: Path, name: str) -> Path:
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 10_000  # a page, not an empty image
    if os.environ.get("ISTHMUS_SCREENSHOTS"):
        shutil.copy(path, Path(os.environ["ISTHMUS_SCREENSHOTS"]) / path.name)
    return path


def open_dashboard(browser: Any, address: str, credential: str) -> Any:
    page = browser.new_page(viewport={"width": 1400, "height": 1000}, accept_downloads=True)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{address}/#token={credential}")
    page.wait_for_selector("body[data-ready='1']", timeout=60_000)
    assert "token=" not in page.url  # taken from the address at once
    assert not errors, errors
    return page


def grid(page: Any) -> dict[str, Any]:
    return page.evaluate("""() => ({
        islands: [...document.querySelectorAll('.island')].map(i => i.dataset.island),
        devices: document.querySelectorAll('.device').length,
        up: document.querySelectorAll('.device.up').length,
        slices: [...document.querySelectorAll('.slice-tag')].map(t => [t.dataset.slice, t.dataset.owner]),
        listed: [...document.querySelectorAll('#slices tbody tr')].map(r => r.dataset.slice),
        runs: [...document.querySelectorAll('#runs tbody tr')].map(r => r.dataset.run),
    })""")


def test_the_dashboard_shows_the_grid_slices_and_runs_each_caller_may_see(browser, server, connect, tmp_path):
    token = (Path(server.state_dir) / "token").read_text().strip()
    alice, bob = connect("alice-dash"), connect("bob-dash")
    sa = alice.slice({"x": 2}, island="a")
    sb = bob.slice({"y": 2}, island="b")
    traced = alice.program(lambda v: alice.jit(lambda u: u * 2, slice=sa)(v), trace=True, name="dash_traced")
    np.testing.assert_array_equal(traced(np.arange(4, dtype=np.float32)).numpy(), np.arange(4) * 2)
    # A program running while the page is open: a loop counting to 2**30, ended by its slice's delete.
    sl = alice.slice({"x": 1}, island="a")
    lt, inc = alice.jit(lambda i, n: i < n, slice=sl), alice.jit(lambda i: i + 1, slice=sl)
    count = alice.program(lambda i, n: isthmus.while_loop(lambda j: lt(j, n), inc, i), name="dash_forever")
    running = count(np.int32(0), np.int32(2**30))
    until(lambda: "run p-" in str(admin_hosts(server.address, token)[sl.hosts[0]]["running"]), 60,
          "the loop running")
    try:
        page = open_dashboard(browser, server.address, alice.secret)
        seen = grid(page)
        assert sorted(seen["islands"]) == ["a", "b"] and seen["devices"] == 16 and seen["up"] == 16
        mine = {s for s, _ in seen["slices"]}
        assert {sa.id, sl.id} <= mine and sb.id not in mine  # bob's is not alice's to see
        assert set(seen["listed"]) >= {sa.id, sl.id} and sb.id not in seen["listed"]
        assert page.locator(f".island[data-island='a'] .slice-tag[data-slice='{sa.id}']").count() == 2
        assert page.get_by_text("client alice-dash").count() == 1
        # the traced run's trace, downloaded from the runs table
        row = page.locator("#runs tbody tr", has_text="dash_traced").first
        with page.expect_download() as download:
            row.locator("button.trace").click()
        trace = json.loads(Path(download.value.path()).read_text())
        assert {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"} == {
            "server", f"host {sa.hosts[0]}"}
        screenshot(page, tmp_path, "dashboard-tenant")
        page.close()

        admin = open_dashboard(browser, server.address, token)
        seen = grid(admin)
        owners = dict(seen["slices"])
        assert owners[sa.id] == "alice-dash" and owners[sb.id] == "bob-dash"
        assert admin.get_by_text("admin: every client's work").count() == 1
        screenshot(admin, tmp_path, "dashboard-admin")
        admin.close()
    finally:
        sl.delete()
        del running


def test_the_page_holds_no_data_and_a_refused_credential_asks_again(browser, server):
    import httpx

    r = httpx.get(f"{server.address}/", timeout=30)
    assert r.status_code == 200 and "text/html" in r.headers["content-type"]
    assert "script-src 'self'" in r.headers["content-security-policy"]
    page = browser.new_page()
    page.goto(f"{server.address}/#token=isc_not-a-secret")
    page.wait_for_selector("#login:not([hidden])", timeout=60_000)
    assert "refused (401)" in page.locator("#error").inner_text()
    assert page.locator("#view").is_hidden()
    page.close()
