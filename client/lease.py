"""Keep a client's lease on the server alive while the client is open.

The server closes a client that sends nothing for its lease (`lease_s`), freeing all it
holds, so a client whose process died leaks nothing. An open client may be idle for longer
(a user thinking between two cells), so this thread sends the cheapest request,
`GET /v1/clients/self`, whenever a third of the lease passes without any request.
"""

from __future__ import annotations

import logging
import threading
import time

from client.transport import Transport, Unauthorized
from ir import IsthmusError

log = logging.getLogger("isthmus.client")


class Lease:
    def __init__(self, transport: Transport, lease_s: float) -> None:
        self._transport = transport
        self._every = max(lease_s / 3, 0.05)
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="isthmus-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stopped.wait(self._every / 2):
            if time.monotonic() - self._transport.last_request < self._every:
                continue
            try:
                self._transport.request("GET", "/v1/clients/self", counted=False)
            except Unauthorized as e:  # closed (or expired) on the server: nothing to renew
                log.warning("isthmus client lease: %s", e)
                return
            except IsthmusError as e:  # the server is unreachable now; try again later
                log.debug("isthmus client lease: %s", e)

    def stop(self) -> None:
        self._stopped.set()
