"""The server's state directory and the secrets kept in it (its admin token, Ray's token).

Contract:
- The directory is created 0700 and must be owned by the user running the server and
  closed to group and others; a directory that is not refuses to start, by name.
- A secret file is created at most once, atomically: written to a fresh file opened with
  `O_EXCL | O_NOFOLLOW` (mode 0600) and linked into place, so a reader never sees it half
  written and a symlink planted at its path is never followed.
- An existing secret file is read without following a symlink, and refused when it is
  empty, not a regular file, not the user's, or readable by group or others.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from ir import InvalidArgument


class UnsafeState(InvalidArgument):
    """The state directory or a secret in it could be read or replaced by someone else."""


def ensure_state_dir(path: Path) -> Path:
    """Create the directory (0700) if missing; refuse one that others may enter or own."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise UnsafeState(f"state dir {path}: not a directory (a symlink is refused)")
    _private(f"state dir {path}", st, f"chmod 700 {path}")
    return path


def _private(what: str, st: os.stat_result, remedy: str) -> None:
    """Refuse what is not this user's, or what group or others may read or enter."""
    if st.st_uid != os.getuid():
        raise UnsafeState(f"{what}: owned by uid {st.st_uid}, not by this user ({os.getuid()})")
    if st.st_mode & 0o077:
        raise UnsafeState(f"{what}: mode {stat.S_IMODE(st.st_mode):o} lets group or others in; {remedy}")


def read_secret(path: Path) -> str:
    """The secret in `path`, checked as the module docstring says."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise UnsafeState(f"{path}: cannot be read without following a link ({e.strerror})") from None
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeState(f"{path}: not a regular file")
        _private(str(path), st, f"chmod 600 {path}")
        value = f.read().strip()
    if not value:
        raise UnsafeState(f"{path}: empty; delete it to have a new secret written")
    return value


def write_secret(path: Path, value: str) -> None:
    """Write `value` into `path` (which must not exist) as the module docstring says."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(value)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)  # fails if anything (a symlink included) is already at `path`
    finally:
        tmp.unlink(missing_ok=True)


def secret(path: Path, nbytes: int = 32) -> str:
    """The secret kept in `path`, written there first if there is none (two servers
    starting at once both end up with the one that was linked first)."""
    ensure_state_dir(path.parent)
    if not os.path.lexists(path):
        try:
            write_secret(path, secrets.token_urlsafe(nbytes))
        except FileExistsError:
            pass
    return read_secret(path)
