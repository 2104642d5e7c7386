"""Where a campaign's data lives: its keys, its shards and its deduplication buckets.

A campaign's record (spec, status, creation time and the layout below) sits under
the hash tag ``{c:<id>}``. Its per-report state is split into ``shards`` shards,
each under its own hash tag ``{c:<id>:<shard>}``, so that on a Redis Cluster the
shards spread over the masters while everything one report touches stays in one
slot (one atomic script per shard). A shard holds:

- ``state``: the campaign's status and spec hash (copied from the record, so the
  ingestion script checks them without leaving its slot), reports stored, last report;
- ``counts`` and ``hourly``: reports per output index and per hour;
- ``period:<key>`` or ``period-dense:<key>``: reports per output index received in one
  period (:mod:`aggregator.storage.periods`): a hash while few outputs have reports, then
  (from :func:`dense_from` outputs on) a string of 32-bit big-endian counts, one per output
  index, which is faster to read, and smaller once many outputs have reports;
- ``enrollment``: the unused enrollment tokens routed to the shard;
- ``ratelimit:<client>:<window>`` and ``ratelimit-reports:<client>:<window>``: a client's
  submissions and new reports counted in the shard against its share of the rate limit and
  the report budget (:mod:`aggregator.storage.ingest`), expiring with their window;
- ``reports``: the raw reports, only when they are kept (``LDP_RAW_REPORTS=keep``);
- ``seen:<window>:<bucket>``: deduplication sets.

A report id is remembered as a 64-bit integer (from a 128-bit BLAKE2b hash of
the id) in one of ``buckets`` sets of the current time window; small integer sets
use Redis's compact ``intset`` encoding, 8 bytes a member, instead of a key per
report. A window lasts ``window_s`` and its sets expire whole
:data:`WINDOWS_LIVE` windows after it began, so an id is remembered for at least
``(WINDOWS_LIVE - 1) * window_s`` (the report-id TTL) and at most a window more,
and is looked up in the :data:`WINDOWS_LIVE` windows still alive.

On a Redis Cluster the shards are placed, not hashed: when a campaign is created,
:func:`placement` gives each shard a salt (a number appended to its hash tag,
``{c:<id>:<shard>:<salt>}``) that puts its slot on a chosen master, so that every
master that holds slots gets the same number of the campaign's shards to within one,
whatever share of the slots it serves. Salt 0 is the plain tag ``{c:<id>:<shard>}``
(one server, and campaigns created before shards were placed).

The layout of a campaign is fixed when it is created and stored in its record. The
keys' names are made in :mod:`aggregator.storage.keys`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property

from redis.crc import key_slot

from aggregator.storage import keys

# Layout of campaigns stored by this version (1: one hash tag and a key per report id;
# 2: sharded, without counts per period).
LAYOUT = 3
DEFAULT_SHARDS = 16
MAX_SHARDS = 1024
# Windows a report id is looked up in: the current one and the ones before, still alive.
WINDOWS_LIVE = 3
# Share of Redis's set-max-intset-entries a bucket is sized to hold on average: bucket
# sizes scatter (Poisson) and a bucket over the limit costs 5x the memory, not correctness.
BUCKET_FILL = 0.75
# Redis's own default of set-max-intset-entries, assumed when the server does not say.
REDIS_DEFAULT_INTSET_ENTRIES = 512
# Reports a campaign without a quota is sized for.
UNBOUNDED_CAMPAIGN_REPORTS = 10**9
# Redis's own default of hash-max-ziplist-entries (hash-max-listpack-entries since 7.0).
REDIS_DEFAULT_HASH_ENTRIES = 128
# Salts tried per shard to land it on its master: a master serving a share f of the slots
# is hit with probability f per salt, so even a master with 1% of them is found in 2,000
# tries but for a chance of 2e-9 (the shard then keeps the plain tag).
MAX_SALT = 2000
# A shard's counts of a period become dense once their hash has a field for this share of
# the outputs: reading a hash costs about 1 microsecond a field in Python (a trend reads 30
# periods x 16 shards of them), a dense string next to nothing; the compact hash then takes
# about 6 / 8 bytes per output of the campaign, the dense string 4.
DENSE_SHARE = 1 / 8
# Bytes per field of a hash of small integers in a hash table (``MEMORY USAGE`` of 1,000
# fields on Redis 6.2; in the compact encoding about 6), and per output of a dense string.
TABLE_FIELD_BYTES = 80
DENSE_COUNT_BYTES = 4


def buckets_for(expected_reports: int, shards: int, intset_entries: int) -> int:
    """Buckets per shard and window so that ``expected_reports`` fit in compact sets.

    A power of two, at least 1: ``expected_reports`` (the campaign's quota) spread
    over the shards, :data:`BUCKET_FILL` of ``intset_entries`` to a bucket.
    """
    per_bucket = max(int(intset_entries * BUCKET_FILL), 1)
    needed = max(math.ceil(expected_reports / (shards * per_bucket)), 1)
    return 1 << (needed - 1).bit_length()


def dense_from(n_outputs: int, hash_entries: int) -> int:
    """Outputs with reports in one shard and period from which its counts are kept dense.

    :data:`DENSE_SHARE` of the outputs, or sooner when the hash would leave Redis's compact
    encoding (``hash_entries`` fields), unless the hash table is still smaller than the dense
    string (:data:`TABLE_FIELD_BYTES` a field against :data:`DENSE_COUNT_BYTES` an output).
    """
    table = math.ceil(DENSE_COUNT_BYTES * n_outputs / TABLE_FIELD_BYTES)
    return max(min(math.ceil(DENSE_SHARE * n_outputs), hash_entries + 1), table, 1)


def window_for(report_id_ttl_s: int) -> int:
    """The window length that remembers a report id for at least ``report_id_ttl_s``."""
    return max(math.ceil(report_id_ttl_s / (WINDOWS_LIVE - 1)), 1)


def placement(campaign_id: str, shards: int, owners: Mapping[int, str]) -> tuple[int, ...]:
    """Each shard's salt so that the shards spread evenly over the masters in ``owners``.

    ``owners`` maps each slot to its master's name (the cluster's current map). Shard
    ``s`` goes to master ``(s + r) mod M`` of the M masters in name order, where the
    rotation ``r`` comes from the campaign's id, so that the masters given one shard more
    differ from campaign to campaign.
    """
    masters = sorted(set(owners.values()))
    if len(masters) < 2:
        return (0,) * shards
    digest = hashlib.blake2b(campaign_id.encode("utf-8"), digest_size=8).digest()
    rotation = int.from_bytes(digest, "big") % len(masters)
    salts = []
    for shard in range(shards):
        target = masters[(shard + rotation) % len(masters)]
        salts.append(
            next(
                (
                    salt
                    for salt in range(MAX_SALT)
                    if owners.get(key_slot(keys.shard_tag(campaign_id, shard, salt).encode()))
                    == target
                ),
                0,
            )
        )
    return tuple(salts)


@dataclass(frozen=True)
class Route:
    """Where one report goes: its shard, its bucket and the integer that stands for its id."""

    shard: int
    bucket: int
    member: int


@dataclass(frozen=True)
class Layout:
    """The keys and the routing of one campaign (see the module's docstring)."""

    campaign_id: str
    shards: int
    buckets: int
    window_s: int
    # Each shard's salt (:func:`placement`); empty: all 0.
    salts: tuple[int, ...] = ()

    @property
    def record_key(self) -> str:
        return keys.record(self.campaign_id)

    @property
    def placement_field(self) -> str:
        """The salts as the record keeps them: comma-separated, empty when all are 0."""
        return ",".join(map(str, self.salts)) if any(self.salts) else ""

    @cached_property
    def _tags(self) -> tuple[str, ...]:
        """Every shard's tag, built once (each of a shard's keys, a report's seen-sets
        included, starts from it)."""
        salts = self.salts or (0,) * self.shards
        return tuple(
            keys.shard_tag(self.campaign_id, shard, salts[shard]) for shard in range(self.shards)
        )

    def shard_tag(self, shard: int) -> str:
        return self._tags[shard]

    def slot(self, shard: int) -> int:
        """The cluster slot that holds every key of the shard (its tag decides it)."""
        return key_slot(self.shard_tag(shard).encode())

    def state_key(self, shard: int) -> str:
        return keys.state(self.shard_tag(shard))

    def counts_key(self, shard: int) -> str:
        return keys.counts(self.shard_tag(shard))

    def hourly_key(self, shard: int) -> str:
        return keys.hourly(self.shard_tag(shard))

    def period_key(self, shard: int, period: str) -> str:
        """The shard's counts of one period while they are a hash (output index -> count)."""
        return keys.period(self.shard_tag(shard), period)

    def period_dense_key(self, shard: int, period: str) -> str:
        """The shard's counts of one period once dense (32-bit big-endian, by output index)."""
        return keys.period_dense(self.shard_tag(shard), period)

    def tokens_key(self, shard: int) -> str:
        return keys.enrollment(self.shard_tag(shard))

    def stream_key(self, shard: int) -> str:
        return keys.reports(self.shard_tag(shard))

    def rate_key(self, shard: int, client: str, window: int) -> str:
        """A client's submissions counted in the shard in one rate-limit window."""
        return keys.rate(self.shard_tag(shard), client, window)

    def budget_key(self, shard: int, client: str, window: int) -> str:
        """A client's new reports stored in the shard in one budget window."""
        return keys.budget(self.shard_tag(shard), client, window)

    def seen_key(self, shard: int, window: int, bucket: int) -> str:
        return keys.seen(self.shard_tag(shard), window, bucket)

    def route(self, report_id: str, token_digest: str | None = None) -> Route:
        """Shard, bucket and member of a report.

        The shard comes from the enrollment token's digest when there is one (the
        token is spent in the same atomic step, so it must live in the same shard),
        else from the report id; bucket and member always come from the id, so a
        retried report (same id, same token) finds itself.
        """
        digest = hashlib.blake2b(report_id.encode("utf-8"), digest_size=16).digest()
        member = int.from_bytes(digest[:8], "big", signed=True)
        bucket = int.from_bytes(digest[8:12], "big") % self.buckets
        if token_digest is None:
            shard = int.from_bytes(digest[12:], "big") % self.shards
        else:
            shard = self.token_shard(token_digest)
        return Route(shard, bucket, member)

    def token_shard(self, token_digest: str) -> int:
        """The shard that keeps an enrollment token (by its SHA-256 hex digest)."""
        return int(token_digest[:8], 16) % self.shards

    def windows(self, now: float) -> tuple[int, ...]:
        """The windows alive at ``now``, current first."""
        current = int(now // self.window_s)
        return tuple(current - age for age in range(WINDOWS_LIVE))

    def expires_at(self, window: int) -> int:
        """When (unix seconds) the sets of ``window`` expire."""
        return (window + WINDOWS_LIVE) * self.window_s

    @property
    def report_id_ttl_s(self) -> int:
        """How long a report id is remembered at least."""
        return (WINDOWS_LIVE - 1) * self.window_s
