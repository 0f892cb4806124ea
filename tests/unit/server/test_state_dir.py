"""server.state: the state dir and its secrets refuse anything others could read or plant."""

import os

import pytest

from server.state import UnsafeState, ensure_state_dir, read_secret, secret, write_secret

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def test_a_new_state_dir_is_0700_and_its_secret_0600_written_once(tmp_path):
    state = tmp_path / "state"
    first = secret(state / "token")
    assert (os.stat(state).st_mode & 0o777) == 0o700
    assert (os.stat(state / "token").st_mode & 0o777) == 0o600
    assert len(first) >= 32 and secret(state / "token") == first  # read back, not rewritten
    assert [p.name for p in state.iterdir()] == ["token"]  # no temporary file left


def test_a_state_dir_others_may_enter_is_refused(tmp_path):
    state = tmp_path / "open"
    state.mkdir(mode=0o755)
    os.chmod(state, 0o755)
    with pytest.raises(UnsafeState, match="chmod 700"):
        ensure_state_dir(state)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604])
def test_a_secret_readable_by_others_is_refused(tmp_path, mode):
    path = tmp_path / "token"
    path.write_text("a-long-enough-token-value")
    os.chmod(path, mode)
    with pytest.raises(UnsafeState, match="chmod 600"):
        read_secret(path)


def test_an_empty_secret_is_refused(tmp_path):
    path = tmp_path / "token"
    path.touch(mode=0o600)
    with pytest.raises(UnsafeState, match="empty"):
        read_secret(path)


def test_a_symlink_is_neither_followed_nor_written_through(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_text("planted")
    os.chmod(target, 0o600)
    link = tmp_path / "token"
    link.symlink_to(target)
    with pytest.raises(UnsafeState, match="without following a link"):
        read_secret(link)
    with pytest.raises(FileExistsError):
        write_secret(link, "new-secret")
    assert target.read_text() == "planted"
