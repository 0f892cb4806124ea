"""server.caches: a host forgets a key when its last holder goes, and only then."""

import pytest

from server.caches import HostCaches

pytestmark = [pytest.mark.unit, pytest.mark.timeout(30)]


def test_a_key_is_forgotten_when_its_last_holder_lets_go():
    told: list[tuple[str, list[str], list[str]]] = []
    caches = HostCaches(lambda host, keys, plans: told.append((host, list(keys), list(plans))))
    caches.hold([("a0", "k1"), ("a1", "k1")], [("a0", "p1")])
    caches.hold([("a0", "k1")])  # a second computation with the same executable on a0
    assert caches.held("a0") == (1, 1)
    caches.drop([("a0", "k1"), ("a1", "k1")])
    assert told == [("a1", ["k1"], [])]  # a0's k1 is still held
    caches.drop([("a0", "k1")], [("a0", "p1")])
    assert told[1:] == [("a0", ["k1"], ["p1"])]
    assert caches.held("a0") == (0, 0) and caches.held("a1") == (0, 0)


def test_dropping_nothing_tells_nobody():
    told = []
    HostCaches(lambda *a: told.append(a)).drop()
    assert told == []
