"""Requests to rate-limited views outside a campaign, counted per client in fixed windows.

The public views (health, the campaign list and specs, the OpenAPI document, the
dashboard's sign-in) and failed token attempts are limited per client address: each
request is counted by ``lua/ratelimit.lua`` in a key of its own per view, client and
window (:func:`aggregator.storage.keys.request_rate`), which expires with its window.
The counters carry no hash tag, so on a Redis Cluster they spread over the slots. The
HTTP layer decides what a count means (:mod:`aggregator.http.ratelimits`).
"""

from __future__ import annotations

from typing import NamedTuple

from aggregator.storage import keys
from aggregator.storage.cluster import Connection, lua_script
from aggregator.storage.ingest import RateLimit


class WindowCount(NamedTuple):
    """A fixed window's requests so far (the one just counted included) and its seconds left."""

    hits: int
    ttl_s: int


class RequestCounter:
    """Counts requests of clients to views against a :class:`RateLimit`'s fixed window, in
    the store's ``connection``."""

    def __init__(self, connection: Connection) -> None:
        self._count = lua_script(connection, "ratelimit.lua")
        self.connection = connection

    def count(self, view: str, limit: RateLimit, now: float) -> WindowCount:
        """Count one request of ``limit.client`` to ``view`` at ``now`` (unix seconds) in its
        fixed window: one Redis call.

        The counter is the ingestion script's kind (a key per client and window, expiring
        with it); the caller compares ``hits`` with ``limit.amount``. Raises the
        connection's errors (e.g. Redis at its memory limit refuses the write).
        """
        hits, ttl_s = self._count(keys=[self._key(view, limit, now)], args=[limit.window_s])
        return WindowCount(int(hits), int(ttl_s))

    def counted(self, view: str, limit: RateLimit, now: float) -> int:
        """What :meth:`count` has counted so far in this window (a read only)."""
        return int(self.connection.get(self._key(view, limit, now)) or 0)

    @staticmethod
    def _key(view: str, limit: RateLimit, now: float) -> str:
        return keys.request_rate(view, limit.client, int(now // limit.window_s))
