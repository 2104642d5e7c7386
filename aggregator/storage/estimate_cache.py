"""The estimate cache: bodies kept in Redis until their counts change, in a budget of their own.

A body takes from a few hundred bytes to tens of MB (a 512 x 512 grid: 23 MB for
one method and confidence level), each variant (method, confidence, window) is
an entry of its own, and an entry is kept a day after it was computed. Reports
are refused above a high-water mark (:class:`aggregator.storage.capacity.CapacityGuard`);
the cache must never be what takes Redis there. So an entry is kept only if

* Redis uses less than the cache's own mark (:attr:`CacheBudget.high_water` of
  ``maxmemory``, below the reports' mark), by the guard's reading, which a process
  takes at most once a second;
* the campaign's entries stay within its cap: its least recently computed entries
  are evicted to make room, in the same atomic step (``lua/cache_store.lua``);
* all campaigns' entries stay within the total cap (``lua/cache_ledger.lua``): the
  least recently computed entries of any campaign are evicted to make room, if the
  oldest few (:data:`EVICT_AT_ONCE`) free enough.

Otherwise the request is answered all the same and the next one computes the body
again (and the stale body of that variant is dropped). The sizes are kept in
Redis, so the caps hold across processes: a campaign's under its hash tag, next
to its entries; the total in three keys under the tag ``{estimate-cache}``, one
slot of a Redis Cluster. Each is a sorted set of entries by expiry and a hash of
their sizes, so an entry leaves the count when its body expires. An entry's
space is reserved in the total before it is written and set to what Redis
allocated for it (``MEMORY USAGE``) after; a process that dies in between leaves
an over-count that expires with the entry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import redis

from aggregator.storage import capacity, keys
from aggregator.storage.cluster import Connection, lua_script
from aggregator.storage.errors import is_out_of_memory
from aggregator.storage.locks import Lock

if TYPE_CHECKING:
    from aggregator.storage.capacity import MemoryReading

# A cached estimate is kept this long after it was last computed (it is recomputed anyway
# as soon as the counts change; the expiry only bounds the keys of unused methods and levels).
ESTIMATE_CACHE_TTL_S = 24 * 3600
# The cache's mark: no new entry above this share of maxmemory. Under the reports' default
# mark (0.9) it leaves 15 % of maxmemory between the cache's last entry and the reports'
# refusal; without a setting the aggregator takes this share of the reports' mark.
DEFAULT_MARK_SHARE = 5 / 6
DEFAULT_HIGH_WATER = capacity.DEFAULT_HIGH_WATER * DEFAULT_MARK_SHARE
# Without a setting, the cache may hold this share of maxmemory (less than the room between
# the two marks), and one campaign this share of that: four campaigns' analysts can have
# their estimates cached at once, none can take the whole cache. At 1 GiB of maxmemory a
# campaign keeps its 16 variants (4 methods x 4 levels) of a 1 MB estimate, or one 23 MB
# variant of a 512 x 512 grid.
DEFAULT_TOTAL_SHARE = 0.1
DEFAULT_CAMPAIGN_SHARE = 0.25
# The total cap of a Redis without maxmemory (nothing to take a share of).
UNLIMITED_TOTAL_BYTES = 256 * 2**20
# What an entry is reserved before it is written, over the allocation of its keys' and
# fields' lengths (:func:`allocated`): Redis adds the key's and the hash's structures (about
# 400 bytes for a small body, a page for a large one with libc malloc, as measured with
# MEMORY USAGE), and the ledgers hold the entry's key twice each.
SIZE_CLASSES_PER_DOUBLING = 4
ENTRY_OVERHEAD_BYTES = 4096
BOOKKEEPING_BYTES = 512
# When the total is full, a store evicts the least recently computed entries of any campaign
# to make room, if this many of the oldest free enough (one call to each one's slot).
EVICT_AT_ONCE = 16
LOG_EVERY_S = 60.0
# A reply of HMGET: the connection runs with decode_responses off, so values are bytes.
_Fields = list[bytes | None]
# Refusals, logged at most once a minute each per process.
MEMORY, TOO_LARGE, TOTAL = "memory", "too_large", "total"

_MARK_SEEN = """
if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('HSET', KEYS[1], 'reports', ARGV[1]) end
return 0
"""

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheBudget:
    """What the estimate cache may take of Redis.

    Parameters
    ----------
    high_water : float
        Share of ``maxmemory`` in (0, 1] from which nothing new is cached; keep it below
        the reports' mark (the settings check it is).
    total_bytes : int, optional
        Most bytes all entries may take (0: cache nothing). None: :data:`DEFAULT_TOTAL_SHARE`
        of ``maxmemory``, or :data:`UNLIMITED_TOTAL_BYTES` without one.
    campaign_bytes : int, optional
        Most bytes one campaign's entries may take. None: :data:`DEFAULT_CAMPAIGN_SHARE`
        of the total cap.
    """

    high_water: float = DEFAULT_HIGH_WATER
    total_bytes: int | None = None
    campaign_bytes: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.high_water, bool) or not isinstance(self.high_water, int | float):
            raise TypeError(f"high_water must be a number, got {type(self.high_water).__name__}")
        if not 0 < self.high_water <= 1:
            raise ValueError(f"high_water must be in (0, 1], got {self.high_water!r}")
        for name in ("total_bytes", "campaign_bytes"):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be a whole number or None, got {value!r}")
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")

    def caps(self, maxmemory: int) -> tuple[int, int]:
        """(total, per campaign) caps in bytes under Redis's ``maxmemory`` (0: no limit)."""
        if self.total_bytes is not None:
            total = self.total_bytes
        elif maxmemory > 0:
            total = int(maxmemory * DEFAULT_TOTAL_SHARE)
        else:
            total = UNLIMITED_TOTAL_BYTES
        campaign = (
            int(total * DEFAULT_CAMPAIGN_SHARE)
            if self.campaign_bytes is None
            else self.campaign_bytes
        )
        return total, min(campaign, total)


def allocated(n: int) -> int:
    """The most an allocator takes for a block of ``n`` bytes: jemalloc's size class, Redis's
    default (:data:`SIZE_CLASSES_PER_DOUBLING` between two powers of two, so less than a
    quarter more; libc's malloc rounds a large block up to pages, which is less)."""
    # The classes from 2**k up to 2**(k + 1) are 2**k / 4 apart (16 bytes at least).
    step = max(2 ** (n.bit_length() - 1) // SIZE_CLASSES_PER_DOUBLING, 16)
    return -(-n // step) * step


def reserved_bytes(key: str, fields: dict[str, bytes | str]) -> int:
    """The most an entry of these fields may take, bookkeeping included (see the constants)."""
    raw = len(key) + sum(
        len(name) + len(value if isinstance(value, bytes) else value.encode())
        for name, value in fields.items()
    )
    return allocated(raw) + ENTRY_OVERHEAD_BYTES + BOOKKEEPING_BYTES


def campaign_keys(key: str) -> list[str]:
    """The keys ``lua/cache_store.lua`` takes for an entry: its campaign's ledger, itself."""
    campaign_id = keys.campaign_of(key)
    return [keys.estimate_expiry(campaign_id), keys.estimate_bytes(campaign_id), key]


class EstimateCache:
    """Estimate bodies by campaign and variant, within a :class:`CacheBudget`.

    Parameters
    ----------
    connection : redis.Redis or RedisCluster
        The store's connection.
    budget : CacheBudget, optional
        The cache's mark and caps (None: the defaults).
    memory : callable, optional
        Redis's memory reading (:meth:`CapacityGuard.reading`, which reads at most once
        per its interval); None: no mark, and the caps of a Redis without ``maxmemory``.
    ttl_s : int
        How long an entry is kept after it was computed.
    clock : callable
        Unix seconds (tests pass their own): entries expire by it.
    """

    def __init__(
        self,
        connection: Connection,
        *,
        budget: CacheBudget | None = None,
        memory: Callable[[], MemoryReading] | None = None,
        ttl_s: int = ESTIMATE_CACHE_TTL_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not ttl_s > 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s!r}")
        self.connection = connection
        self.budget = CacheBudget() if budget is None else budget
        self.ttl_s = ttl_s
        self._memory = memory
        self._clock = clock
        self._store = lua_script(connection, "cache_store.lua")
        self._ledger = lua_script(connection, "cache_ledger.lua")
        self._mark_seen_script = connection.register_script(_MARK_SEEN)
        self._logged_at: dict[str, float] = {}

    def key(self, campaign_id: str, variant: str) -> str:
        """The key of one entry."""
        return keys.estimate(campaign_id, variant)

    def lock(self, campaign_id: str, variant: str, digest: str, ttl_ms: int) -> Lock:
        """The lock on computing one estimate (campaign, variant, counts digest)."""
        return Lock(self.connection, keys.estimate_lock(campaign_id, variant, digest), ttl_ms)

    # -- lookups -----------------------------------------------------------------------

    def get_many(
        self, campaign_id: str, variants: Sequence[str], *, reports: str
    ) -> list[bytes | None]:
        """:meth:`get` of each of ``variants`` by ``reports`` alone: one round trip."""
        pipe = self.connection.pipeline(transaction=False)
        for variant in variants:
            pipe.hmget(self.key(campaign_id, variant), ("reports", "body"))
        return [
            body if seen is not None and seen.decode() == reports else None
            for seen, body in (pipe.execute() if variants else [])
        ]

    def get(
        self,
        campaign_id: str,
        variant: str,
        *,
        counts_digest: str | None = None,
        reports: str | None = None,
    ) -> bytes | None:
        """The estimate body cached for ``variant`` if it was made from these very counts
        (their digest), or from counts read after the campaign had accepted these
        ``reports`` (:attr:`Campaign.reports_seen`; see :meth:`put`)."""
        key = self.key(campaign_id, variant)
        digest, seen, body = cast(
            _Fields, self.connection.hmget(key, ("counts_digest", "reports", "body"))
        )
        if counts_digest is not None and digest is not None and digest.decode() == counts_digest:
            if reports is not None and (seen is None or seen.decode() != reports):
                # Made from the counts read after ``reports`` were accepted: the next request
                # of a campaign that has accepted no report since finds it without reading them.
                self._mark_seen(key, reports)
            return body
        if reports is not None and seen is not None and seen.decode() == reports:
            return body
        return None

    def _mark_seen(self, key: str, reports: str) -> None:
        # Only on an entry still there: a key made here would have no expiry and no size.
        try:
            self._mark_seen_script(keys=[key], args=[reports])
        except redis.ResponseError as exc:
            if not is_out_of_memory(exc):
                raise

    # -- stores ------------------------------------------------------------------------

    def put(
        self,
        campaign_id: str,
        variant: str,
        counts_digest: str,
        body: bytes | str,
        *,
        reports: str | None = None,
    ) -> bool:
        """Keep an estimate body, if the budget has room for it (True if kept).

        The body is kept with the digest of the counts it was made from and
        ``reports``, what the campaign had accepted before those counts were read
        (its :attr:`Campaign.reports_seen`): a campaign that has accepted no report
        since has the same counts, so a request can find the body without reading
        them. A cache, not a record: above the cache's mark, past its caps or at
        Redis's memory limit the body is not kept, the stale body of the variant is
        dropped, and the next request computes it again, rather than fail a read.
        """
        key = self.key(campaign_id, variant)
        fields: dict[str, bytes | str] = {"counts_digest": counts_digest, "body": body}
        if reports is not None:
            fields["reports"] = reports
        now = self._clock()
        now_ms, expiry_ms = int(now * 1000), int((now + self.ttl_s) * 1000)
        try:
            reading = None if self._memory is None else self._memory()
            total_cap, campaign_cap = self.budget.caps(
                0 if reading is None else reading.limit_bytes
            )
            reserved = reserved_bytes(key, fields)
            refusal = self._refusal(reading, reserved, campaign_cap)
            if refusal is None and not self._reserve(key, reserved, now_ms, expiry_ms, total_cap):
                refusal = TOTAL
            if refusal is None:
                if self._write(key, fields, now_ms, expiry_ms, reserved, campaign_cap):
                    return True
                refusal = TOO_LARGE
            elif self._drop(key, now_ms):
                self._set_sizes(now_ms, None, [(key, 0, 0)])
        except redis.ResponseError as exc:
            if not is_out_of_memory(exc):
                raise
            logger.warning(
                "estimate of campaign %r not cached: Redis is at its memory limit", campaign_id
            )
            return False
        self._log_refusal(refusal, campaign_id, reading, reserved, (total_cap, campaign_cap))
        return False

    def _refusal(
        self, reading: MemoryReading | None, reserved: int, campaign_cap: int
    ) -> str | None:
        if (
            reading is not None
            and reading.limit_bytes > 0
            and reading.used_bytes >= self.budget.high_water * reading.limit_bytes
        ):
            return MEMORY
        if reserved > campaign_cap:
            return TOO_LARGE
        return None

    def _reserve(
        self, key: str, reserved: int, now_ms: int, expiry_ms: int, total_cap: int
    ) -> bool:
        """Reserve an entry's bytes in the total; when it is full, evict the least recently
        computed entries of any campaign to make room (see :data:`EVICT_AT_ONCE`)."""
        entry = [(key, reserved, expiry_ms)]
        done, total = self._set_sizes(now_ms, total_cap, entry)
        if done:
            return True
        oldest = [
            other.decode()
            for other in cast(
                list[bytes], self.connection.zrange(keys.CACHE_EXPIRY, 0, EVICT_AT_ONCE - 1)
            )
            if other.decode() != key
        ]
        sizes = cast(_Fields, self.connection.hmget(keys.CACHE_BYTES, oldest)) if oldest else []
        evicted, freed, needed = [], 0, total + reserved - total_cap
        for other, size in zip(oldest, sizes, strict=True):
            if freed >= needed:
                break
            evicted.append(other)
            freed += int(size or 0)
        if freed < needed:
            return False
        for other in evicted:
            self._drop(other, now_ms)
        self._set_sizes(now_ms, None, [(other, 0, 0) for other in evicted])
        done, _ = self._set_sizes(now_ms, total_cap, entry)
        return done

    def _write(
        self,
        key: str,
        fields: dict[str, bytes | str],
        now_ms: int,
        expiry_ms: int,
        reserved: int,
        campaign_cap: int,
    ) -> bool:
        """Write the entry in its campaign's ledger (evicting), then settle the total."""
        args: list[Any] = [now_ms, campaign_cap, reserved, expiry_ms, BOOKKEEPING_BYTES, 1]
        for name, value in fields.items():
            args += [name, value]
        stored, size, *evicted = self._store(keys=campaign_keys(key), args=args)
        self._set_sizes(
            now_ms,
            None,
            [
                (key, size if stored else 0, expiry_ms),
                *((other.decode(), 0, 0) for other in evicted),
            ],
        )
        return bool(stored)

    def _drop(self, key: str, now_ms: int) -> bool:
        """Drop an entry from its campaign (True if it was there); the total is the caller's."""
        _, _, *dropped = self._store(keys=campaign_keys(key), args=[now_ms, 0, 0, 0, 0, 0])
        return bool(dropped)

    def _set_sizes(
        self, now_ms: int, cap: int | None, sizes: Sequence[tuple[str, int, int]]
    ) -> tuple[bool, int]:
        """Set (key, bytes, expiry ms) in the total's ledger unless the total passes ``cap``;
        whether they were set, and the total."""
        args: list[Any] = [now_ms, -1 if cap is None else cap]
        for entry in sizes:
            args += entry
        done, total = self._ledger(
            keys=[keys.CACHE_EXPIRY, keys.CACHE_BYTES, keys.CACHE_TOTAL], args=args
        )
        return bool(done), int(total)

    def _log_refusal(
        self,
        refusal: str,
        campaign_id: str,
        reading: MemoryReading | None,
        reserved: int,
        caps: tuple[int, int],
    ) -> None:
        now = time.monotonic()
        if now - self._logged_at.get(refusal, float("-inf")) < LOG_EVERY_S:
            return
        self._logged_at[refusal] = now
        if refusal == MEMORY and reading is not None:
            logger.warning(
                "estimate of campaign %r not cached: Redis uses %d of %d bytes, above the "
                "cache's mark (%.0f%%, LDP_CACHE_HIGH_WATER); logged at most once a minute",
                campaign_id,
                reading.used_bytes,
                reading.limit_bytes,
                self.budget.high_water * 100,
            )
        elif refusal == TOO_LARGE:
            logger.info(
                "estimate of campaign %r not cached: %d bytes do not fit in a campaign's cap "
                "(%d, LDP_CACHE_CAMPAIGN_MAX_BYTES); logged at most once a minute",
                campaign_id,
                reserved,
                caps[1],
            )
        else:
            logger.info(
                "estimate of campaign %r not cached: the cache holds its total (%d bytes, "
                "LDP_CACHE_MAX_BYTES) and its oldest entries would not make room; logged at "
                "most once a minute",
                campaign_id,
                caps[0],
            )

    # -- sizes -------------------------------------------------------------------------

    def bytes_used(self, campaign_id: str | None = None) -> int:
        """Bytes the live entries take, bookkeeping included: a campaign's, or all campaigns'."""
        if campaign_id is None:
            expiry_key, bytes_key = keys.CACHE_EXPIRY, keys.CACHE_BYTES
        else:
            expiry_key = keys.estimate_expiry(campaign_id)
            bytes_key = keys.estimate_bytes(campaign_id)
        now_ms = int(self._clock() * 1000)
        live = cast(list[bytes], self.connection.zrangebyscore(expiry_key, f"({now_ms}", "+inf"))
        if not live:
            return 0
        sizes = cast(_Fields, self.connection.hmget(bytes_key, live))
        return sum(int(size) for size in sizes if size is not None)
