"""Dashboard sessions and failed sign-in counters, kept in Redis so every worker shares them."""

from __future__ import annotations

from typing import cast

import redis

SESSION_KEY = "ldp:dashboard:session:{sid}"
FAILURES_KEY = "ldp:ratelimit-authfail:{client}:{window}"


class SessionStore:
    """A session id names the fingerprint of the token that opened it, until it expires."""

    def __init__(self, connection: redis.Redis) -> None:
        self._connection = connection

    def open(self, sid: str, fingerprint: str, ttl_s: int) -> None:
        self._connection.set(SESSION_KEY.format(sid=sid), fingerprint, ex=ttl_s)

    def fingerprint(self, sid: str) -> bytes | None:
        """The fingerprint the session was opened with, or None if it is closed or expired."""
        # The connection runs with decode_responses off: replies are bytes.
        return cast(bytes | None, self._connection.get(SESSION_KEY.format(sid=sid)))

    def close(self, sid: str) -> None:
        self._connection.delete(SESSION_KEY.format(sid=sid))


class FailureCounter:
    """Failed authentication attempts per client address in fixed windows."""

    def __init__(self, connection: redis.Redis) -> None:
        self._connection = connection

    def count(self, client: str, window: int) -> int:
        """Failures counted so far for ``client`` in window number ``window``."""
        return int(self._connection.get(FAILURES_KEY.format(client=client, window=window)) or 0)

    def add(self, client: str, window: int, window_s: int) -> int:
        """Count one more failure; the count so far in this window, this one included."""
        key = FAILURES_KEY.format(client=client, window=window)
        with self._connection.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, window_s)
            return int(pipe.execute()[0])
