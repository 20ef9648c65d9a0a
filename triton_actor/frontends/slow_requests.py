"""Requests whose body came too slowly, as the front ends log them: one line at info, no traceback.

A request body must average ``--request-body-min-rate`` bytes/s once ``--request-body-grace-secs`` have
passed (``protocol/http1.py`` and ``protocol/h2_connection.py`` keep the deadline: Apache mod_reqtimeout's
MinRate); one that does not is answered 408 (HTTP/1) or DEADLINE_EXCEEDED (gRPC), and what it held of the
request memory budget is freed. Each is logged at info, as mod_reqtimeout logs it; a flood is summarised
(at most one line per ``quiet`` seconds, with the count of the others) so that an attacker cannot fill the
log. One per front end, owned by its greenlets on the hub; no locks.
"""

from __future__ import annotations

import logging
from time import monotonic
from typing import Any

log = logging.getLogger(__name__)


class SlowRequestLog:
    __slots__ = ("transport", "quiet", "_logged_at", "_unlogged")

    def __init__(self, transport: str, quiet: float = 10.0) -> None:
        self.transport = transport
        self.quiet = quiet
        self._logged_at = -1e18
        self._unlogged = 0

    def report(self, peer: Any, text: str, now: float | None = None) -> bool:
        """Log one request closed for ``text``, or count it when a line went out less than ``quiet`` s
        ago; True when it was logged."""
        now = monotonic() if now is None else now
        if now - self._logged_at < self.quiet:
            self._unlogged += 1
            return False
        more, self._unlogged, self._logged_at = self._unlogged, 0, now
        suffix = f" (and {more} more since the last report)" if more else ""
        log.info("%s request from %s closed: %s%s", self.transport, _peer(peer), text, suffix)
        return True


def _peer(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        return f"{peer[0]}:{peer[1]}"
    return str(peer)
