"""Dashboard sessions, kept in Redis so every worker shares them."""

from __future__ import annotations

from typing import cast

from aggregator.storage import keys
from aggregator.storage.cluster import Connection


class SessionStore:
    """A session id names the fingerprint of the token that opened it, until it expires."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    def open(self, sid: str, fingerprint: str, ttl_s: int) -> None:
        self._connection.set(keys.session(sid), fingerprint, ex=ttl_s)

    def fingerprint(self, sid: str) -> bytes | None:
        """The fingerprint the session was opened with, or None if it is closed or expired."""
        # The connection runs with decode_responses off: replies are bytes.
        return cast(bytes | None, self._connection.get(keys.session(sid)))

    def close(self, sid: str) -> None:
        self._connection.delete(keys.session(sid))
