"""server.auth and server.quotas: who a credential names, and what a client may hold."""

import pytest

from server.auth import ADMIN, Credentials, bearer
from server.errors import OverQuota, Unauthorized
from server.quotas import Quotas

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def test_a_secret_names_its_client_and_the_admin_token_the_admin():
    creds = Credentials("admin-token-0123456789")
    alice, key = creds.issue("cl-alice")
    bob, _ = creds.issue("cl-bob")
    assert alice.startswith("isc_") and alice != bob
    assert creds.who(f"Bearer {alice}") == "cl-alice"
    assert creds.who(f"bearer  {bob} ") == "cl-bob"
    assert creds.who("Bearer admin-token-0123456789") is ADMIN
    creds.revoke(key)
    with pytest.raises(Unauthorized, match="unknown credential"):
        creds.who(f"Bearer {alice}")


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer ", "Bearer    ", "Basic abc", "cl-alice",
                                    "Bearer cl-alice", "Bearer isc_", "Bearer admin-token-012345678"])
def test_missing_empty_and_guessed_credentials_never_match(header):
    creds = Credentials("admin-token-0123456789")
    creds.issue("cl-alice")
    with pytest.raises(Unauthorized):
        creds.who(header)


def test_bearer_names_what_is_missing():
    with pytest.raises(Unauthorized, match="Authorization: Bearer"):
        bearer("Token x")
    assert bearer("Bearer  x ") == "x"


def test_an_empty_admin_token_is_refused():
    with pytest.raises(ValueError, match="empty"):
        Credentials("")


def test_quotas_refuse_past_the_limit_by_name():
    q = Quotas(clients=2, slices=1, buffers=3, buffer_bytes=100, computations=1, programs=1, queued=2,
               stored_bytes=100)
    q.check("buffers", 2, 1)
    with pytest.raises(OverQuota, match=r"buffers: 3 held, 1 more would pass the limit of 3"):
        q.check("buffers", 3, 1)
    with pytest.raises(OverQuota, match="buffer bytes: 60 bytes held, 50 bytes more"):
        q.check("buffer_bytes", 60, 50, " bytes")
    assert OverQuota.retry_after_s == 1
