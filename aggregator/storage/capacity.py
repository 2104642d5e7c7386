"""Room in Redis: new reports stop at a high-water mark, everything else goes on.

Redis runs with ``maxmemory`` and the ``noeviction`` policy, so at its limit it
refuses every write: reports, but also dashboard sessions, rate-limit counters
and the estimate cache. :class:`CapacityGuard` keeps a reserve below the limit
for those: once ``used_memory`` reaches ``high_water`` (a share of
``maxmemory``) the report endpoint answers 507 with ``Retry-After`` and writes
nothing, while health, reads, estimates and sign-in go on in the reserve. The
reading (``INFO memory``) is cached for ``check_interval_s`` per process, so it
costs one Redis call a second, not one per report.

Refusals are counted in Redis (:data:`aggregator.storage.keys.METRICS`, shown on
``/health``) and logged, at most once a minute per reason and campaign per
process; no report content is ever logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis

from aggregator.storage import keys
from aggregator.storage.cluster import Connection, node_clients, refresh_map
from aggregator.storage.errors import StorageFull

DEFAULT_HIGH_WATER = 0.9
DEFAULT_CHECK_INTERVAL_S = 1.0
# What a refused client is told to wait: room comes back when an operator acts (retention,
# a higher limit), not within seconds.
STORAGE_FULL_RETRY_AFTER_S = 300
LOG_EVERY_S = 60.0
REFUSAL_REASONS = ("storage_full", "campaign_full", "report_budget_exceeded")

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MemoryReading:
    """Redis's memory use and limit in bytes (limit 0: none, or not readable)."""

    used_bytes: int
    limit_bytes: int
    high_water_bytes: int

    @property
    def full(self) -> bool:
        return self.limit_bytes > 0 and self.used_bytes >= self.high_water_bytes

    @property
    def used_fraction(self) -> float | None:
        return round(self.used_bytes / self.limit_bytes, 4) if self.limit_bytes else None


class CapacityGuard:
    """Refuses reports above the high-water mark; counts and logs refusals.

    Parameters
    ----------
    connection : redis.Redis or RedisCluster
        The store's connection (on a cluster, the fullest master is what counts).
    high_water : float
        Share of ``maxmemory`` in (0, 1] above which reports are refused.
    check_interval_s : float
        How long a memory reading is reused (0: read on every check).
    clock : callable
        Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        connection: Connection,
        *,
        high_water: float = DEFAULT_HIGH_WATER,
        check_interval_s: float = DEFAULT_CHECK_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not 0 < high_water <= 1:
            raise ValueError(f"STORAGE_HIGH_WATER must be in (0, 1], got {high_water!r}")
        if not check_interval_s >= 0:
            raise ValueError(f"STORAGE_CHECK_INTERVAL_S must be >= 0, got {check_interval_s!r}")
        self.connection = connection
        self.high_water = float(high_water)
        self.check_interval_s = float(check_interval_s)
        self._clock = clock
        self._reading: MemoryReading | None = None
        self._read_at = float("-inf")
        self._was_full = False
        self._logged_at: dict[tuple[str, str], float] = {}

    def reading(self) -> MemoryReading:
        """The memory reading, at most ``check_interval_s`` old."""
        now = self._clock()
        if self._reading is None or now - self._read_at >= self.check_interval_s:
            self._reading = self._fullest_node()
            self._read_at = now
            self._note_transition(self._reading)
        return self._reading

    def _fullest_node(self) -> MemoryReading:
        """The reading of the master closest to its limit (a cluster fills node by node).

        A master that does not answer (failing over) is left out, and the cluster's
        map read again; if none answers, the connection's error is raised.
        """
        readings = []
        failure: redis.RedisError | None = None
        for _, client in node_clients(self.connection):
            try:
                info = client.info("memory")
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                failure = exc
                continue
            except redis.ResponseError:  # INFO disabled (some managed servers): no guard
                info = {}
            used = int(info.get("used_memory", 0))
            limit = int(info.get("maxmemory", 0))
            readings.append(MemoryReading(used, limit, int(limit * self.high_water)))
        if failure is not None:
            refresh_map(self.connection)
            if not readings:
                raise failure
        return max(readings, key=lambda r: r.used_bytes / r.limit_bytes if r.limit_bytes else 0)

    def _note_transition(self, reading: MemoryReading) -> None:
        if reading.full and not self._was_full:
            logger.warning(
                "report storage full: Redis uses %d of %d bytes (high-water mark %d, %.0f%%); "
                "new reports are refused with 507 until memory is freed or the limit raised",
                reading.used_bytes,
                reading.limit_bytes,
                reading.high_water_bytes,
                self.high_water * 100,
            )
        elif self._was_full and not reading.full:
            logger.warning(
                "report storage below its high-water mark again (%d of %d bytes): "
                "accepting reports",
                reading.used_bytes,
                reading.limit_bytes,
            )
        self._was_full = reading.full

    def check_reports(self, campaign_id: str, n_reports: int) -> None:
        """Raise :class:`StorageFull` (and count it) if reports must be refused now."""
        if self.reading().full:
            raise self.storage_full(campaign_id, n_reports)

    def storage_full(self, campaign_id: str, n_reports: int) -> StorageFull:
        """Count a submission refused for want of memory; the error to raise for it.

        Also for Redis's own refusal (``OOM``) when a flood overshot the mark
        between two readings: the next check reads the memory again.
        """
        self._read_at = float("-inf")
        self.record_refusal("storage_full", campaign_id, n_reports)
        return StorageFull(
            "the report store is full; nothing was stored, retry later",
            campaign_id=campaign_id,
            retry_after_s=STORAGE_FULL_RETRY_AFTER_S,
        )

    def record_refusal(self, reason: str, campaign_id: str, n_reports: int) -> None:
        """Count a refused submission and its reports; log it at most once a minute."""
        try:
            with self.connection.pipeline(transaction=False) as pipe:
                pipe.hincrby(keys.METRICS, f"refused_submissions:{reason}", 1)
                pipe.hincrby(keys.METRICS, f"refused_reports:{reason}", n_reports)
                pipe.execute()
        except redis.RedisError as exc:  # a metric must not turn a refusal into a 503
            logger.warning("refusal not counted (%s): %s", reason, exc)
        now = self._clock()
        key = (reason, campaign_id)
        if now - self._logged_at.get(key, float("-inf")) >= LOG_EVERY_S:
            self._logged_at[key] = now
            logger.warning(
                "reports refused (%s): campaign %r, %d reports in this submission "
                "(further refusals counted in %s, logged at most once a minute)",
                reason,
                campaign_id,
                n_reports,
                keys.METRICS,
            )

    def refusals(self) -> dict[str, dict[str, int]]:
        """Refused submissions and reports per reason since the store was created."""
        raw = cast(dict[bytes, bytes], self.connection.hgetall(keys.METRICS))
        counts = {key.decode(): int(value) for key, value in raw.items()}
        return {
            reason: {
                "submissions": counts.get(f"refused_submissions:{reason}", 0),
                "reports": counts.get(f"refused_reports:{reason}", 0),
            }
            for reason in REFUSAL_REASONS
        }
