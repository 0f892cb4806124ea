"""Who is asking: the admin (the server's token) or one client (the secret it was given).

Contract:
- `POST /v1/clients`, with the admin token, opens a client and returns its secret once;
  the server keeps only the secret's SHA-256. Every later request of that client carries
  the secret as its bearer credential, and the server derives the client from it: a client
  id alone, in a header or a path, grants nothing.
- The admin token acts on the cluster (opening and closing any client, restarting an
  island, per-client scheduling figures); a client's secret acts on that client's own
  objects. Neither stands in for the other.
- `GET /metrics` takes the admin token, or the metrics token where the server has one
  (`scrapes`); a client's secret is no credential there (401, as an unknown one).
- An empty, missing or unknown credential never matches anything. Comparisons are of
  fixed-length digests (the admin token's in constant time), so a credential cannot be
  guessed a character at a time from response times.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from server.errors import Unauthorized

SECRET_PREFIX = "isc_"  # makes a leaked client secret recognisable (and greppable) as one


@dataclass(frozen=True)
class Admin:
    """The holder of the server's admin token."""


ADMIN = Admin()


def digest(credential: str) -> bytes:
    return hashlib.sha256(credential.encode()).digest()


def bearer(authorization: str | None) -> str:
    """The credential of an `Authorization: Bearer <credential>` header."""
    scheme, _, given = (authorization or "").strip().partition(" ")
    given = given.strip()
    if scheme.lower() != "bearer" or not given:
        raise Unauthorized("missing credential: send Authorization: Bearer <client secret or admin token>")
    return given


class Credentials:
    """The admin token's digest, the metrics token's, and each open client's secret digest
    -> client id."""

    def __init__(self, admin_token: str, metrics_token: str | None = None) -> None:
        if not admin_token:
            raise ValueError("the admin token must not be empty")
        if metrics_token == "":
            raise ValueError("the metrics token must not be empty (None: no metrics token)")
        self._admin = digest(admin_token)
        self._metrics = None if metrics_token is None else digest(metrics_token)
        self._clients: dict[bytes, str] = {}

    def issue(self, client_id: str) -> tuple[str, bytes]:
        """A new secret for the client, and the digest under which it is known."""
        secret = SECRET_PREFIX + secrets.token_urlsafe(32)
        key = digest(secret)
        self._clients[key] = client_id
        return secret, key

    def restore(self, key: bytes, client_id: str) -> None:
        """Know again a client whose secret was issued before the server restarted."""
        self._clients[key] = client_id

    def revoke(self, key: bytes) -> None:
        self._clients.pop(key, None)

    def who(self, authorization: str | None) -> Admin | str:
        """ADMIN, or the id of the client whose secret this is; else `Unauthorized`."""
        key = digest(bearer(authorization))
        if secrets.compare_digest(key, self._admin):
            return ADMIN
        client = self._clients.get(key)
        if client is None:
            raise Unauthorized("unknown credential: not the admin token, nor the secret of an open "
                               "client (a closed or expired client's secret no longer works)")
        return client

    def scrapes(self, authorization: str | None) -> None:
        """Nothing if this is the admin token or the metrics token; else `Unauthorized`."""
        key = digest(bearer(authorization))
        # (both compared, whichever matches: the time taken says nothing of which)
        admin = secrets.compare_digest(key, self._admin)
        metrics = self._metrics is not None and secrets.compare_digest(key, self._metrics)
        if not (admin or metrics):
            raise Unauthorized("unknown credential: /metrics takes the admin token or the metrics token "
                               "(ISTHMUS_METRICS_TOKEN), not a client's secret")
