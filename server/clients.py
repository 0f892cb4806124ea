"""Clients, their credentials and their leases.

Contract:
- `create` opens a client within the server's client quota and returns its secret, shown
  only then (`server.auth`); its weight is its share under proportional-share scheduling.
- `caller` is the admin or the open client whose credential a request carries; `get` finds
  an open client by id.
- `expired(now)` names the clients that have sent nothing for longer than their lease
  (`client_lease_s`) and have no request in progress: the server closes them
  (`Service.close_client`), freeing all they hold.
- `forget` revokes a closing client's secret and drops its weight; `restore` knows again the
  clients of a restarted server.
"""

from __future__ import annotations

from ir import NotFound
from server.auth import Admin, Credentials
from server.gang import Gangs
from server.quotas import Quotas
from server.records import ClientRecord, new_id
from server.registry import Registry


class Clients:
    def __init__(self, credentials: Credentials, registry: Registry, quotas: Quotas, gangs: Gangs,
                 lease_s: float) -> None:
        self._credentials = credentials
        self._registry = registry
        self._quotas = quotas
        self._gangs = gangs
        self.lease_s = lease_s
        self.records = registry.clients

    def create(self, name: str, weight: float = 1.0) -> tuple[ClientRecord, str]:
        """Open a client; returns it and its secret (the only time the secret is shown)."""
        self._quotas.check("clients", len(self.records), 1)
        rec = ClientRecord(new_id("cl"), name, weight)
        secret, rec.key = self._credentials.issue(rec.id)
        self._registry.add_client(rec)
        self._gangs.set_weight(rec.id, weight)
        return rec, secret

    def caller(self, authorization: str | None) -> Admin | ClientRecord:
        """The admin or the client whose credential this is (`server.auth`)."""
        who = self._credentials.who(authorization)
        return who if isinstance(who, Admin) else self.records[who]

    def get(self, client_id: str) -> ClientRecord:
        rec = self.records.get(client_id)
        if rec is None:
            raise NotFound(f"client {client_id!r} does not exist")
        return rec

    def expired(self, now: float) -> list[str]:
        """The clients idle past their lease with no request in progress."""
        return [c.id for c in self.records.values() if c.in_flight == 0 and now - c.last_seen > self.lease_s]

    def restore(self) -> None:
        """Know again every client the registry loaded (a restarted server)."""
        for rec in self.records.values():
            self._credentials.restore(rec.key, rec.id)
            self._gangs.set_weight(rec.id, rec.weight)

    def forget(self, owner: ClientRecord) -> None:
        """Its secret stops working, and its queued work is dropped (nothing of it runs after)."""
        self._credentials.revoke(owner.key)
        self._gangs.cancel_client(owner.id)

    def remove(self, owner: ClientRecord) -> None:
        """The client's record goes, once what it held is freed."""
        self._registry.remove_client(owner)
