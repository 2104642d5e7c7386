"""Campaigns' records: created, read, listed, opened and closed; kept parsed per process.

A campaign's record (:func:`aggregator.storage.keys.record`) holds its canonical spec,
the spec's hash, its status, its creation time and its layout
(:mod:`aggregator.storage.layout`); ``lua/create.lua`` writes it whole or not at all.
Every shard keeps a copy of the status and the spec hash, which the ingestion script
checks without leaving its slot, and the index (:data:`aggregator.storage.keys.CAMPAIGNS`)
lists the campaigns by creation time.

A spec never changes while its campaign exists, and a layout is fixed when it is
created, so a process keeps what it read: parsed specs by hash (parsing a large domain
costs about 0.1 s for 100,000 labels), each campaign's layout, and the campaign as last
read for validating reports (:meth:`Campaigns.for_reports`), each bounded.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, cast

from aggregator.storage import counts, keys, periods
from aggregator.storage import layout as layouts
from aggregator.storage.cluster import Connection, config_value, lua_script, slot_owners
from aggregator.storage.errors import CampaignExists, CampaignNotFound, LayoutOutdated
from aggregator.storage.layout import Layout
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

OPEN = "open"
CLOSED = "closed"
STATUSES = (OPEN, CLOSED)
# Parsed specs kept per store: a spec never changes, and parsing a large domain on
# every request would dominate it (about 0.1 s for 100,000 labels).
SPEC_CACHE_SIZE = 256
_META_FIELDS = (
    "spec_hash",
    "status",
    "created_at",
    "layout",
    "shards",
    "buckets",
    "window_s",
    "periods_from",
    "placement",
)
# A reply of HMGET: the connection runs with decode_responses off, so values are bytes.
_Fields = list[bytes | None]


class CreateStatus(IntEnum):
    """What ``lua/create.lua`` answered (the script defines the same names and values)."""

    TAKEN = 0
    CREATED = 1


@dataclass(frozen=True)
class Campaign:
    """A stored campaign: its immutable spec and mechanism, and the server's fields."""

    spec: CampaignSpec
    status: str
    created_at: float
    n_reports: int
    mechanism: Mechanism = field(compare=False, repr=False)
    # Each shard's n_reports when the campaign was read.
    shard_reports: tuple[int, ...] = field(default=(), compare=False, repr=False)
    # Since when (unix seconds) its reports are counted per period: its creation, or for a
    # campaign stored by an earlier version, its migration; None if not known yet.
    periods_from: float | None = field(default=None, compare=False, repr=False)

    @property
    def unit(self) -> str:
        """The unit its counts per period are kept by (:mod:`aggregator.storage.periods`)."""
        return periods.unit_of(self.spec.period)

    @property
    def spec_hash(self) -> str:
        return self.spec.spec_hash

    @property
    def reports_seen(self) -> str:
        """What the campaign had accepted when it was read, shard by shard: a shard's counts
        change only when it accepts a new report (one script adds the report to its count and
        to the shard's ``n_reports``), so an equal value means equal counts."""
        shards = ",".join(map(str, self.shard_reports))
        return f"{self.spec_hash}:{self.created_at!r}:{self.n_reports}:{shards}"

    def to_wire(self) -> dict[str, Any]:
        """The spec as served: spec fields plus ``status``, ``spec_hash`` and ``created_at``."""
        return {
            **self.spec.to_dict(),
            "status": self.status,
            "spec_hash": self.spec_hash,
            "created_at": self.created_at,
        }


class Campaigns:
    """The campaigns' records in one Redis or a Redis Cluster, and this process's copies.

    Parameters
    ----------
    connection : redis.Redis or RedisCluster
        The store's connection.
    """

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self._create = lua_script(connection, "create.lua")
        self._parsed: OrderedDict[str, tuple[CampaignSpec, Mechanism]] = OrderedDict()
        self._known: OrderedDict[str, Campaign] = OrderedDict()
        self._layouts: dict[str, Layout] = {}
        self._intset_entries: int | None = None

    # -- creating ----------------------------------------------------------------------

    def new_layout(
        self, campaign_id: str, *, shards: int, max_reports: int, report_id_ttl_s: int
    ) -> Layout:
        """The layout of a campaign created now with ``shards`` shards, its buckets sized for
        its quota ``max_reports`` (0: none), remembering report ids ``report_id_ttl_s``."""
        if self._intset_entries is None:
            value = config_value(self.connection, "set-max-intset-entries")
            self._intset_entries = int(value) if value else layouts.REDIS_DEFAULT_INTSET_ENTRIES
        expected = max_reports or layouts.UNBOUNDED_CAMPAIGN_REPORTS
        return Layout(
            campaign_id,
            shards=shards,
            buckets=layouts.buckets_for(expected, shards, self._intset_entries),
            window_s=layouts.window_for(report_id_ttl_s),
            salts=layouts.placement(campaign_id, shards, slot_owners(self.connection)),
        )

    def create(
        self, spec: CampaignSpec, layout: Layout, *, created_at: float
    ) -> tuple[Campaign, bool]:
        """Store a new campaign in ``layout`` (:meth:`new_layout`); return it and whether it
        was created now.

        Creating the very same spec again is not an error (``created`` is False, and the
        campaign keeps its layout), so an admin script can be re-run;
        :class:`CampaignExists` if the id holds another spec.
        """
        answer = self._create(
            keys=[layout.record_key],
            args=[
                spec.canonical_json(),
                spec.spec_hash,
                repr(created_at),
                layouts.LAYOUT,
                layout.shards,
                layout.buckets,
                layout.window_s,
                layout.placement_field,
            ],
        )
        created = answer == CreateStatus.CREATED
        campaign = self.get(spec.id)
        if not created and campaign.spec_hash != spec.spec_hash:
            raise CampaignExists(
                f"campaign {spec.id!r} already exists with another spec", campaign_id=spec.id
            )
        # Outside the script (other slots); idempotent, so a re-run repairs a lost write.
        self._open_shards(self.layout(spec.id), spec.spec_hash, fresh=created)
        self.connection.zadd(keys.CAMPAIGNS, {spec.id: created_at}, nx=True)
        return campaign, created

    def _open_shards(self, layout: Layout, spec_hash: str, *, fresh: bool) -> None:
        """Give every shard the campaign's status and spec hash.

        A campaign created just now sets them (a shard left from a campaign deleted by
        hand under the same id must not keep its old spec); a re-run of the creation
        only fills in what is missing.
        """
        pipe = self.connection.pipeline(transaction=False)
        for shard in range(layout.shards):
            if fresh:
                pipe.hset(layout.state_key(shard), mapping={"spec_hash": spec_hash, "status": OPEN})
            else:
                pipe.hsetnx(layout.state_key(shard), "spec_hash", spec_hash)
                pipe.hsetnx(layout.state_key(shard), "status", OPEN)
        pipe.execute()

    def set_status(self, campaign_id: str, status: str) -> Campaign:
        """Open or close a campaign; a closed campaign refuses reports.

        The record is written first, then every shard's copy: once this returns, no
        shard stores another report of a closed campaign.
        """
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        layout = self.layout(campaign_id)
        pipe = self.connection.pipeline(transaction=False)
        # HSET only on existing hashes (XX semantics): a status alone must not create one.
        pipe.hset(layout.record_key, "status", status)
        for shard in range(layout.shards):
            pipe.hset(layout.state_key(shard), "status", status)
        pipe.execute()
        return self.get(campaign_id)

    # -- reading -----------------------------------------------------------------------

    def layout(self, campaign_id: str) -> Layout:
        """Where a campaign's data lives (fixed at its creation; read once per process)."""
        found = self._layouts.get(campaign_id)
        if found is None:
            meta = cast(_Fields, self.connection.hmget(keys.record(campaign_id), _META_FIELDS))
            found = self._layout_of(campaign_id, meta)
        return found

    def _layout_of(self, campaign_id: str, meta: _Fields) -> Layout:
        spec_hash, _, _, version, shards, buckets, window_s = meta[:7]
        if spec_hash is None:
            raise CampaignNotFound(f"no campaign {campaign_id!r}", campaign_id=campaign_id)
        if version is None or shards is None or buckets is None or window_s is None:
            raise LayoutOutdated(
                f"campaign {campaign_id!r} is stored in an older layout and has not been "
                "migrated yet: `ldp-aggregator serve` (and every other command) migrates "
                "campaigns when it opens the store",
                campaign_id=campaign_id,
                retry_after_s=60,
            )
        placed = meta[8]
        salts = tuple(int(salt) for salt in placed.split(b",")) if placed else ()
        found = Layout(campaign_id, int(shards), int(buckets), int(window_s), salts)
        self._layouts[campaign_id] = found
        return found

    def get(self, campaign_id: str) -> Campaign:
        """The campaign as stored now (:class:`CampaignNotFound` if there is none)."""
        found = self._read([campaign_id])
        if not found:
            raise CampaignNotFound(f"no campaign {campaign_id!r}", campaign_id=campaign_id)
        return found[0]

    def for_reports(self, campaign_id: str) -> Campaign:
        """The campaign as this process last read it, for validating reports without a read.

        Its spec is what ingestion verifies by hash (a spec never changes while the
        campaign exists); its status and report count may be out of date. Reads the
        store only for a campaign not seen yet (:class:`CampaignNotFound` if unknown).
        """
        campaign = self._known.get(campaign_id)
        if campaign is None:
            campaign = self.get(campaign_id)
            self._known[campaign_id] = campaign
            if len(self._known) > SPEC_CACHE_SIZE:
                self._known.popitem(last=False)
        return campaign

    def forget(self, campaign_id: str) -> None:
        """Drop the process's copy kept by :meth:`for_reports`."""
        self._known.pop(campaign_id, None)

    def ids(self) -> list[str]:
        """Every campaign's id, oldest first (from the index: one read)."""
        return [
            raw.decode() for raw in cast(list[bytes], self.connection.zrange(keys.CAMPAIGNS, 0, -1))
        ]

    def read_all(self) -> list[Campaign]:
        """All campaigns, oldest first."""
        return self._read(self.ids())

    def _read(self, campaign_ids: Sequence[str]) -> list[Campaign]:
        """The campaigns that exist among ``campaign_ids``: two pipelined reads."""
        pipe = self.connection.pipeline(transaction=False)
        for campaign_id in campaign_ids:
            pipe.hmget(keys.record(campaign_id), _META_FIELDS)
        metas = [
            (campaign_id, meta)
            for campaign_id, meta in zip(campaign_ids, pipe.execute(), strict=True)
            if meta[0] is not None
        ]
        layouts_read = [self._layout_of(campaign_id, meta) for campaign_id, meta in metas]
        totals = counts.shard_reports(self.connection, layouts_read)
        campaigns = []
        for (_, meta), layout, shard_reports in zip(metas, layouts_read, totals, strict=True):
            spec_hash, status, created_at, version = meta[:4]
            # create.lua writes the fields together: a campaign with a hash has all of them.
            assert spec_hash is not None and status is not None and created_at is not None
            spec, mechanism = self._spec(layout.record_key, spec_hash.decode())
            periods_from = meta[7]
            if periods_from is None and version is not None and int(version) >= 3:
                periods_from = created_at
            campaigns.append(
                Campaign(
                    spec=spec,
                    status=status.decode(),
                    created_at=float(created_at),
                    n_reports=sum(shard_reports),
                    mechanism=mechanism,
                    shard_reports=shard_reports,
                    periods_from=None if periods_from is None else float(periods_from),
                )
            )
        return campaigns

    def _spec(self, key: str, spec_hash: str) -> tuple[CampaignSpec, Mechanism]:
        if spec_hash in self._parsed:
            self._parsed.move_to_end(spec_hash)
            return self._parsed[spec_hash]
        raw = cast(bytes, self.connection.hget(key, "spec"))
        spec = CampaignSpec.from_dict(json.loads(raw), stored=True)
        self._parsed[spec_hash] = spec, Mechanism.from_spec(spec)
        if len(self._parsed) > SPEC_CACHE_SIZE:
            self._parsed.popitem(last=False)
        return self._parsed[spec_hash]
