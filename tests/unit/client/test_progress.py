"""client.progress: bars for long uploads, fetches and waits, drawn on stderr only where
wanted and only for what is long; a body sent in chunks is the same bytes."""

from __future__ import annotations

import io
import threading

import pytest
from rich.console import Console

from client import progress

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


class Answer:
    """An HTTP answer's body, read in pieces."""

    def __init__(self, body: bytes, length: str | None) -> None:
        self._body = io.BytesIO(body)
        self._length = length

    def read(self, amt: int | None = None) -> bytes:
        return self._body.read(amt)

    def getheader(self, name: str) -> str | None:
        return self._length if name == "content-length" else None


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """What the bars draw, as a terminal would show it; bars on, and small sizes count."""
    out = io.StringIO()
    monkeypatch.setattr(progress, "_console", lambda: Console(file=out, force_terminal=True, width=100))
    monkeypatch.setattr(progress, "MIN_BYTES", 1000)
    monkeypatch.setattr(progress, "CHUNK", 256)
    monkeypatch.setenv("ISTHMUS_PROGRESS", "1")
    return out


def test_a_large_body_goes_in_chunks_of_the_same_bytes_with_a_bar(screen):
    data = bytes(range(256)) * 20
    sent = progress.chunks("upload b1", data)
    assert not isinstance(sent, bytes)
    assert b"".join(sent) == data
    assert "upload b1" in screen.getvalue()
    assert progress.chunks("upload b2", data[:999]) == data[:999]  # small: as is


def test_a_large_answer_is_read_whole_with_a_bar(screen):
    body = b"x" * 5000
    assert progress.read("fetch b1", Answer(body, "5000")) == body
    assert "fetch b1" in screen.getvalue()
    screen.truncate(0)
    assert progress.read("fetch b2", Answer(body, None)) == body  # no length: no bar
    assert progress.read(None, Answer(body, "5000")) == body
    assert screen.getvalue() == ""


def test_a_wait_shows_its_time_only_once_it_is_long(screen, monkeypatch):
    monkeypatch.setattr(progress, "AFTER_S", 0.05)
    with progress.waiting("compile quick"):
        pass
    assert "compile quick" not in screen.getvalue()
    shown = threading.Event()
    monkeypatch.setattr(progress, "_bar", _bar_that_tells(shown))
    with progress.waiting("compile slow"):
        assert shown.wait(10)


def _bar_that_tells(shown: threading.Event):
    real = progress._bar

    def bar(label, total, unit_bytes):
        shown.set()
        return real(label, total, unit_bytes)

    return bar


def test_off_unless_stderr_is_a_terminal_or_it_is_asked_for(monkeypatch):
    monkeypatch.setenv("ISTHMUS_PROGRESS", "0")
    assert not progress.enabled()
    monkeypatch.setenv("ISTHMUS_PROGRESS", "1")
    assert progress.enabled()
    monkeypatch.delenv("ISTHMUS_PROGRESS")
    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert not progress.enabled()
    data = b"y" * (progress.MIN_BYTES + 1)
    assert progress.chunks("upload", data) is data
