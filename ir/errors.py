"""One shallow error hierarchy for all of Isthmus.

Every error a user can cause or see derives from `IsthmusError`. The server maps each class
to one HTTP status in one place (`server/errors.py`); the client maps them back.
"""


class IsthmusError(Exception):
    """Base of every Isthmus error."""


class InvalidArgument(IsthmusError):
    """The request is malformed: a shape, dtype, spec or field that does not fit."""


class NotFound(IsthmusError):
    """No such slice, buffer, computation or client, or not visible to the caller."""


class Conflict(IsthmusError):
    """The request is well formed but cannot be met now (no island fits, a failed artifact)."""


class RemoteError(IsthmusError):
    """A computation or executor failed; the message carries the remote cause."""


class DataLoss(RemoteError):
    """A buffer's value is gone and cannot be made again; the message names what was lost
    and why."""


class Unavailable(IsthmusError):
    """An executor host is down or did not answer in time."""
