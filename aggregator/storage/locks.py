"""A lock held in Redis by one holder at a time, across processes, expiring on its own."""

from __future__ import annotations

import secrets

import redis

from aggregator.storage.cluster import Connection
from aggregator.storage.errors import is_out_of_memory

_RELEASE_IF_OURS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Lock:
    """Taken with ``SET NX PX`` under a random token, released only by its holder.

    At Redis's memory limit there is no room for the lock: :meth:`acquire` then
    answers True without holding it (the caller goes on unguarded rather than fail),
    and :meth:`release` leaves an unreleased lock to expire.
    """

    def __init__(self, connection: Connection, key: str, ttl_ms: int) -> None:
        self._connection = connection
        self._key = key
        self._ttl_ms = ttl_ms
        self._token = secrets.token_hex(16)
        self._held = False

    def acquire(self) -> bool:
        """Take the lock if it is free (True); False if another holder has it."""
        try:
            self._held = bool(
                self._connection.set(self._key, self._token, nx=True, px=self._ttl_ms)
            )
        except redis.ResponseError as exc:
            if not is_out_of_memory(exc):
                raise
            return True
        return self._held

    def release(self) -> None:
        if not self._held:
            return
        self._held = False
        try:
            self._connection.eval(_RELEASE_IF_OURS, 1, self._key, self._token)
        except redis.ResponseError as exc:
            if not is_out_of_memory(exc):
                raise
