"""Every Redis key the aggregator writes, named here and nowhere else.

The table of ``docs/aggregator.md`` ("Storage") lists them with their types. Keys that
must move together share a hash tag, so that one script or one pipeline reaches them in
one slot of a Redis Cluster; keys that must spread do not:

- a campaign's record and its estimate cache sit under ``{c:<id>}`` (:func:`campaign_key`);
- each of its shards' per-report state under its own tag, ``{c:<id>:<shard>}`` or, placed
  on a chosen master, ``{c:<id>:<shard>:<salt>}`` (:func:`shard_tag`,
  :mod:`aggregator.storage.layout`);
- the ledger of all cached estimates under ``{estimate-cache}``;
- the rest under no tag: the campaign index, metrics, the migration lock, the request
  counters of public views and dashboard sessions, each a key of its own.

Layout 1 (before sharding) kept everything of a campaign under ``{c:<id>}``: its names
there (``counts``, ``hourly``, ``reports``, ``enrollment``, ``seen:<report id>``) are
what :mod:`aggregator.storage.migrate` reads, through :func:`campaign_key` as well.
"""

from __future__ import annotations

# Campaign ids by creation time (sorted set).
CAMPAIGNS = "ldp:campaigns"
# Refused submissions and reports by reason, reports acknowledged on fewer replicas (hash).
METRICS = "ldp:metrics"
# Held by the process migrating campaigns from an earlier layout.
MIGRATION_LOCK = "ldp:migration-lock"
# Every campaign's cached estimates by expiry, their sizes and their total, in one slot.
CACHE_EXPIRY = "ldp:{estimate-cache}:expiry"
CACHE_BYTES = "ldp:{estimate-cache}:bytes"
CACHE_TOTAL = "ldp:{estimate-cache}:total"
_CAMPAIGN_PREFIX = "ldp:{c:"


# -- under the campaign's tag ------------------------------------------------------------


def campaign_key(campaign_id: str, name: str) -> str:
    """A key under the campaign's own hash tag: ``ldp:{c:<id>}:<name>``."""
    return f"{_CAMPAIGN_PREFIX}{campaign_id}}}:{name}"


def campaign_of(key: str) -> str:
    """The campaign id in a key made by :func:`campaign_key`."""
    return key[len(_CAMPAIGN_PREFIX) : key.index("}")]


def record(campaign_id: str) -> str:
    """The campaign's record: spec, status, creation time and layout (hash)."""
    return campaign_key(campaign_id, "campaign")


def estimate(campaign_id: str, variant: str) -> str:
    """One cached estimate body (hash)."""
    return campaign_key(campaign_id, f"estimate:{variant}")


def estimate_lock(campaign_id: str, variant: str, digest: str) -> str:
    """The worker computing one estimate from counts of this digest."""
    return campaign_key(campaign_id, f"estimate-lock:{variant}:{digest}")


def estimate_expiry(campaign_id: str) -> str:
    """The campaign's cached estimates (their keys) by expiry, unix ms (sorted set)."""
    return campaign_key(campaign_id, "estimate-expiry")


def estimate_bytes(campaign_id: str) -> str:
    """The campaign's cached estimates' sizes in bytes (hash)."""
    return campaign_key(campaign_id, "estimate-bytes")


# -- under a shard's tag -----------------------------------------------------------------


def shard_tag(campaign_id: str, shard: int, salt: int = 0) -> str:
    """The hash tag (braces included) of one shard's keys; salt 0 is the plain tag."""
    if salt:
        return f"{{c:{campaign_id}:{shard}:{salt}}}"
    return f"{{c:{campaign_id}:{shard}}}"


def state(tag: str) -> str:
    """The shard's copy of status and spec hash, its reports and last report (hash)."""
    return f"ldp:{tag}:state"


def counts(tag: str) -> str:
    """Reports per output index (hash)."""
    return f"ldp:{tag}:counts"


def hourly(tag: str) -> str:
    """Reports per hour start, unix seconds (hash)."""
    return f"ldp:{tag}:hourly"


def period(tag: str, period_key: str) -> str:
    """Reports per output index received in one period, while a hash."""
    return f"ldp:{tag}:period:{period_key}"


def period_dense(tag: str, period_key: str) -> str:
    """The same once dense: 32-bit big-endian counts by output index (string)."""
    return f"ldp:{tag}:period-dense:{period_key}"


def enrollment(tag: str) -> str:
    """The unused enrollment tokens routed to the shard, SHA-256 digests (set)."""
    return f"ldp:{tag}:enrollment"


def reports(tag: str) -> str:
    """The raw reports, when they are kept (stream)."""
    return f"ldp:{tag}:reports"


def rate(tag: str, client: str, window: int) -> str:
    """A client's submissions counted in the shard in one rate-limit window."""
    return f"ldp:{tag}:ratelimit:{client}:{window}"


def budget(tag: str, client: str, window: int) -> str:
    """A client's new reports stored in the shard in one budget window."""
    return f"ldp:{tag}:ratelimit-reports:{client}:{window}"


def seen(tag: str, window: int, bucket: int) -> str:
    """One deduplication set of a window (set of 64-bit integers)."""
    return f"ldp:{tag}:seen:{window}:{bucket}"


# -- under no tag ------------------------------------------------------------------------


def request_rate(view: str, client: str, window: int) -> str:
    """Requests of one client to one rate-limited public view in one window (no tag: the
    counters spread over the slots)."""
    return f"ldp:ratelimit:{view}:{client}:{window}"


def session(sid: str) -> str:
    """A dashboard session: the fingerprint of the token that opened it."""
    return f"ldp:dashboard:session:{sid}"
