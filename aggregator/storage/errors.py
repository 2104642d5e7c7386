"""Telling Redis's own refusals apart."""

from __future__ import annotations

import redis


def is_out_of_memory(error: redis.RedisError) -> bool:
    """Whether Redis refused a write at its ``maxmemory`` (directly or inside a script)."""
    return isinstance(error, redis.exceptions.OutOfMemoryError) or (
        isinstance(error, redis.ResponseError) and "OOM command not allowed" in str(error)
    )
