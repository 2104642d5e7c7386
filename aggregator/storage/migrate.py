"""Moving campaigns stored by earlier versions into the current layout, losing nothing.

Layout 1 kept a campaign under one hash tag: its record held ``n_reports``, and
beside it ``counts``, ``hourly``, the ``reports`` stream, the unused
``enrollment`` tokens and one ``seen:<report id>`` key per report, expiring
after the report-id TTL. :func:`migrate_campaigns` moves each such campaign into
:mod:`aggregator.storage.layout`:

1. the new layout is written into the record (without its version, so the
   campaign still counts as unmigrated and a re-run reuses the same layout), and
   every shard gets the campaign's status and spec hash;
2. every ``seen`` key becomes a member of its bucket's set in the window of its
   report's arrival (its remaining TTL tells when that was), and is deleted; for a
   campaign that requires enrollment the member goes into every shard, since a
   report is routed by its token, which the old key does not name;
3. unused enrollment tokens move to their shards, and the stream's entries are
   copied, with their ids, into shard 0's stream;
4. the counts, hourly counts and report total are written into shard 0, the
   layout version is set, and only then are the old keys deleted.

Layout 2 is layout 3 without counts per period (:mod:`aggregator.storage.periods`).
Its campaigns need nothing moved: ingestion counts their new reports per period
from now on. :func:`migrate_campaigns` records in each record since when
(``periods_from``, unix seconds) and sets the version to 3; their counts until
then are all-time only, so a window over earlier periods has no counts for them,
and says so. A layout-1 campaign gets the same mark when its migration finishes.

Every step can be run again after a crash without counting anything twice
(counts are written, not added; members and tokens are set members; stream
entries are copied after the last one copied). Ingestion refuses an unmigrated
campaign (503), so nothing is written to it meanwhile; a lock keeps two
processes from migrating at once. Only reports and their state move: the
estimate cache and rate-limit counters expire on their own.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable
from typing import Any, cast

from aggregator.storage import keys
from aggregator.storage import layout as layouts
from aggregator.storage.layout import Layout
from aggregator.storage.locks import Lock
from aggregator.storage.store import CampaignStore
from shared.spec import CampaignSpec

LOCK_TTL_MS = 10 * 60 * 1000
LOCK_WAIT_S = 60.0
CHUNK = 1000

logger = logging.getLogger(__name__)


def _legacy_key(campaign_id: str, name: str) -> str:
    """A key of layout 1: everything of a campaign under its record's tag."""
    return keys.campaign_key(campaign_id, name)


def unmigrated(store: CampaignStore) -> list[str]:
    """The ids of campaigns still in layout 1."""
    connection = store.connection
    ids = store.campaign_ids()
    pipe = connection.pipeline(transaction=False)
    for campaign_id in ids:
        pipe.hmget(_legacy_key(campaign_id, "campaign"), ("spec_hash", "layout"))
    return [
        campaign_id
        for campaign_id, (spec_hash, version) in zip(ids, pipe.execute(), strict=True)
        if spec_hash is not None and version is None
    ]


def mark_period_counts(store: CampaignStore, *, now: float | None = None) -> list[str]:
    """Give every layout-2 campaign its ``periods_from`` (``now``) and layout 3; their ids.

    Idempotent: a campaign marked already keeps its mark (HSETNX), so a crash between
    the two writes, or two processes opening the store at once, change nothing.
    """
    connection = store.connection
    moment = store.clock() if now is None else now
    ids = store.campaign_ids()
    pipe = connection.pipeline(transaction=False)
    for campaign_id in ids:
        pipe.hmget(_legacy_key(campaign_id, "campaign"), ("spec_hash", "layout"))
    marked = [
        campaign_id
        for campaign_id, (spec_hash, version) in zip(ids, pipe.execute(), strict=True)
        if spec_hash is not None and version == b"2"
    ]
    pipe = connection.pipeline(transaction=False)
    for campaign_id in marked:
        record = _legacy_key(campaign_id, "campaign")
        pipe.hsetnx(record, "periods_from", repr(moment))
        pipe.hset(record, "layout", layouts.LAYOUT)
    pipe.execute()
    for campaign_id in marked:
        logger.info(
            "campaign %r is counted per period from now on; its earlier reports are in its "
            "all-time counts only",
            campaign_id,
        )
    return marked


def migrate_campaigns(store: CampaignStore, *, now: float | None = None) -> dict[str, int]:
    """Migrate every campaign of an earlier layout; the report ids moved per layout-1
    campaign migrated (a layout-2 campaign moves none and is not listed)."""
    mark_period_counts(store, now=now)
    if not unmigrated(store):
        return {}
    lock = Lock(store.connection, keys.MIGRATION_LOCK, LOCK_TTL_MS)
    deadline = time.monotonic() + LOCK_WAIT_S
    while not lock.acquire():
        if time.monotonic() > deadline:
            raise TimeoutError("another process has been migrating campaigns for too long")
        time.sleep(0.5)
    try:
        moved = {}
        for campaign_id in unmigrated(store):
            moved[campaign_id] = _migrate(store, campaign_id, store.clock() if now is None else now)
            logger.info(
                "campaign %r moved to the sharded layout (%d report ids)",
                campaign_id,
                moved[campaign_id],
            )
        return moved
    finally:
        lock.release()


def _migrate(store: CampaignStore, campaign_id: str, now: float) -> int:
    connection = store.connection
    record = _legacy_key(campaign_id, "campaign")
    fields = ("spec_hash", "status", "shards", "buckets", "window_s", "n_reports")
    spec_hash, status, shards, buckets, window_s, n_reports = cast(
        list[bytes | None], connection.hmget(record, fields)
    )
    assert spec_hash is not None and status is not None
    if shards is None or buckets is None or window_s is None:
        chosen = store.new_layout(campaign_id)
        connection.hset(
            record,
            mapping={
                "shards": chosen.shards,
                "buckets": chosen.buckets,
                "window_s": chosen.window_s,
            },
        )
        layout = chosen
    else:
        layout = Layout(campaign_id, int(shards), int(buckets), int(window_s))
    pipe = connection.pipeline(transaction=False)
    for shard in range(layout.shards):
        pipe.hsetnx(layout.state_key(shard), "spec_hash", spec_hash)
        pipe.hsetnx(layout.state_key(shard), "status", status)
    pipe.execute()
    raw_spec = json.loads(cast(bytes, connection.hget(record, "spec")))
    spec = CampaignSpec.from_dict(raw_spec, stored=True)
    moved = _move_seen(store, layout, spec.enrollment_required, now)
    _move_tokens(store, layout)
    last_ms = _copy_stream(store, layout)
    _finish(store, layout, int(n_reports or 0), last_ms, now)
    return moved


def _move_seen(store: CampaignStore, layout: Layout, everywhere: bool, now: float) -> int:
    """Each ``seen:<id>`` key into its bucket's set in its arrival's window; the keys moved."""
    connection = store.connection
    prefix = _legacy_key(layout.campaign_id, "seen:")
    live = layout.windows(now)
    moved = 0
    for found in _chunks(connection.scan_iter(match=_glob(prefix) + "*", count=CHUNK), CHUNK):
        pipe = connection.pipeline(transaction=False)
        for key in found:
            pipe.pttl(key)
        ttls = pipe.execute()
        pipe = connection.pipeline(transaction=False)
        for key, ttl_ms in zip(found, ttls, strict=True):
            if ttl_ms == -2:  # expired meanwhile
                continue
            report_id = key.decode()[len(prefix) :]
            arrival = now if ttl_ms < 0 else now + ttl_ms / 1000 - store.report_id_ttl_s
            window = min(max(int(arrival // layout.window_s), live[-1]), live[0])
            route = layout.route(report_id)
            targets = range(layout.shards) if everywhere else (route.shard,)
            for shard in targets:
                seen = layout.seen_key(shard, window, route.bucket)
                pipe.sadd(seen, route.member)
                pipe.expire(seen, max(math.ceil(layout.expires_at(window) - now), 1))
            pipe.delete(key)
            moved += 1
        pipe.execute()
    return moved


def _move_tokens(store: CampaignStore, layout: Layout) -> None:
    connection = store.connection
    old = _legacy_key(layout.campaign_id, "enrollment")
    for digests in _chunks(connection.sscan_iter(old, count=CHUNK), CHUNK):
        pipe = connection.pipeline(transaction=False)
        for digest in digests:
            pipe.sadd(layout.tokens_key(layout.token_shard(digest.decode())), digest)
        pipe.execute()
        connection.srem(old, *digests)


def _copy_stream(store: CampaignStore, layout: Layout) -> int:
    """Copy the old stream's entries after shard 0's last one; the last entry's time (ms)."""
    connection = store.connection
    old = _legacy_key(layout.campaign_id, "reports")
    target = layout.stream_key(0)
    last = cast(list, connection.xrevrange(target, count=1))
    start = "(" + last[0][0].decode() if last else "-"
    while True:
        entries = cast(list, connection.xrange(old, min=start, max="+", count=CHUNK))
        if not entries:
            break
        pipe = connection.pipeline(transaction=False)
        for entry_id, fields in entries:
            pipe.xadd(target, fields, id=entry_id)
        pipe.execute()
        start = "(" + entries[-1][0].decode()
    newest = cast(list, connection.xrevrange(target, count=1))
    return int(newest[0][0].split(b"-")[0]) if newest else 0


def _finish(store: CampaignStore, layout: Layout, n_reports: int, last_ms: int, now: float) -> None:
    """Counts, hourly counts and total into shard 0, the version set (counted per period from
    ``now`` on), the old keys deleted."""
    connection = store.connection
    campaign_id = layout.campaign_id
    counts: dict[Any, Any] = connection.hgetall(_legacy_key(campaign_id, "counts"))
    hourly: dict[Any, Any] = connection.hgetall(_legacy_key(campaign_id, "hourly"))
    pipe = connection.pipeline(transaction=False)
    if counts:
        pipe.hset(layout.counts_key(0), mapping=counts)
    if hourly:
        pipe.hset(layout.hourly_key(0), mapping=hourly)
    state: dict[Any, Any] = {"n_reports": n_reports}
    if last_ms:
        state["last_ms"] = last_ms
    pipe.hset(layout.state_key(0), mapping=state)
    pipe.execute()
    record = _legacy_key(campaign_id, "campaign")
    connection.hsetnx(record, "periods_from", repr(now))
    connection.hset(record, "layout", layouts.LAYOUT)
    connection.hdel(record, "n_reports")
    connection.delete(
        *(_legacy_key(campaign_id, name) for name in ("counts", "hourly", "reports", "enrollment"))
    )


def _glob(text: str) -> str:
    """``text`` with the glob pattern characters escaped."""
    return "".join("\\" + char if char in "*?[]\\" else char for char in text)


def _chunks(items: Iterable[bytes], size: int) -> Iterable[list[bytes]]:
    chunk: list[bytes] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
