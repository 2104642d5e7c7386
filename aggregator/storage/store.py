"""The Redis store: campaigns, deduplicated report ingestion, counts and raw reports.

A campaign's per-report state is split into shards that spread over a Redis
Cluster's masters (:mod:`aggregator.storage.layout`). A submission's reports are
grouped by shard and each group is admitted and stored by one atomic script in its
shard's slot (:mod:`aggregator.storage.ingest`: the client's rate limit and report
budget and the campaign's quota, the deduplication sets, enrollment tokens, the
counts in all and in the period the report is received in, the raw report if
asked). Reads sum the shards, and a window's periods. The counts
are the estimators' sufficient statistics. The connection and the clock are
passed in; nothing here is global.
"""

from __future__ import annotations

import heapq
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from importlib import resources
from typing import Any, NamedTuple, cast

import numpy as np

from aggregator.storage import layout as layouts
from aggregator.storage import periods, retention
from aggregator.storage.cluster import (
    Connection,
    NodeWriter,
    config_value,
    is_cluster,
    slot_owners,
)
from aggregator.storage.errors import (
    CampaignExists,
    CampaignNotFound,
    LayoutOutdated,
)
from aggregator.storage.estimate_cache import EstimateCache
from aggregator.storage.ingest import (
    Admission,
    Ingestion,
    IngestResult,
    PeriodArgs,
    RateLimit,
    ReportBudget,
    StoredReport,
    Submission,
    token_digest,
)
from aggregator.storage.layout import Layout
from aggregator.storage.sessions import SessionStore
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

OPEN = "open"
CLOSED = "closed"
STATUSES = (OPEN, CLOSED)
# How long a report id is remembered for deduplication: retries come within minutes,
# a queued report on an offline device may come weeks later.
DEFAULT_REPORT_ID_TTL_S = 90 * 24 * 3600
# Most reports one campaign may hold (CAMPAIGN_MAX_REPORTS; 0: no quota): one campaign
# cannot take the whole store. Deduplication buckets are sized for it.
DEFAULT_CAMPAIGN_MAX_REPORTS = 10_000_000
# What is kept of each report besides its count: nothing, or the raw report in a stream.
RAW_REPORTS_OFF = "off"
RAW_REPORTS_KEEP = "keep"
RAW_REPORTS_MODES = (RAW_REPORTS_OFF, RAW_REPORTS_KEEP)
EXPORT_CHUNK = 1000
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

logger = logging.getLogger(__name__)


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


class WindowCount(NamedTuple):
    """A fixed window's requests so far (the one just counted included) and its seconds left."""

    hits: int
    ttl_s: int


class CampaignStore:
    """Campaigns and their reports in one Redis or a Redis Cluster.

    Parameters
    ----------
    connection : redis.Redis or RedisCluster
        The store's client (:func:`aggregator.storage.cluster.open_connection`).
    report_id_ttl_s : int
        How long a new campaign remembers a report id, at least.
    retention_s : float, optional
        Raw reports older than this are trimmed as new ones arrive (None: kept).
    period_retention_s : float, optional
        Counts per period expire this long after their period ends (None: kept).
    raw_reports : {"off", "keep"}
        Whether the raw reports are kept in a stream besides their counts.
    shards : int
        Shards of a new campaign.
    max_reports : int
        Most reports a campaign may hold (0: no quota); sizes its deduplication sets.
    ack_replicas : int or None
        Replicas an acknowledged write must have reached. None: 1 on a Redis Cluster
        (at most the replicas the master has at the time), none on a single server.
    ack_timeout_ms : int
        How long to wait for them.
    clock : callable
        The time (unix seconds) a report is received at when ingest is given none, and the
        "now" of windows; tests set it to place reports in periods.
    on_under_replicated : callable, optional
        Called as ``on_under_replicated(node, reports)`` when a master acknowledged
        ``reports`` new reports with fewer replicas than ``ack_replicas`` (None: a master
        with none yet, as after a failover); it must not raise.
    """

    INDEX_KEY = "ldp:campaigns"
    # Requests to one rate-limited view outside a campaign (no hash tag: one key per call).
    REQUEST_RATE_KEY = "ldp:ratelimit:{view}:{client}:{window}"

    def __init__(
        self,
        connection: Connection,
        *,
        report_id_ttl_s: int = DEFAULT_REPORT_ID_TTL_S,
        retention_s: float | None = None,
        period_retention_s: float | None = retention.DEFAULT_PERIOD_RETENTION_DAYS
        * retention.DAY_S,
        raw_reports: str = RAW_REPORTS_OFF,
        shards: int = layouts.DEFAULT_SHARDS,
        max_reports: int = DEFAULT_CAMPAIGN_MAX_REPORTS,
        ack_replicas: int | None = 0,
        ack_timeout_ms: int = 1000,
        clock: Callable[[], float] = time.time,
        on_under_replicated: Callable[[str, int], None] | None = None,
    ) -> None:
        self.connection = connection
        self.clock = clock
        self.report_id_ttl_s = int(report_id_ttl_s)
        if retention_s is not None and not retention_s > 0:
            raise ValueError(f"retention_s must be > 0 or None, got {retention_s!r}")
        if raw_reports not in RAW_REPORTS_MODES:
            raise ValueError(f"raw_reports must be one of {RAW_REPORTS_MODES}, got {raw_reports!r}")
        if not 1 <= shards <= layouts.MAX_SHARDS:
            raise ValueError(f"shards must be 1 to {layouts.MAX_SHARDS}, got {shards!r}")
        # Raw reports older than this are trimmed from the stream (counts stay); None keeps all.
        self.retention_s = retention_s
        if period_retention_s is not None and not period_retention_s > 0:
            raise ValueError(f"period_retention_s must be > 0 or None, got {period_retention_s!r}")
        self.period_retention_s = period_retention_s
        self.keeps_raw_reports = raw_reports == RAW_REPORTS_KEEP
        self.shards = shards
        self.max_reports = int(max_reports)
        self.writer = NodeWriter(
            connection,
            ack_replicas=(1 if is_cluster(connection) else 0)
            if ack_replicas is None
            else ack_replicas,
            ack_timeout_ms=ack_timeout_ms,
            only_present=ack_replicas is None,
            on_under_replicated=self._acknowledged_under_replicated,
        )
        self._on_under_replicated = on_under_replicated
        lua = resources.files("aggregator.storage") / "lua"
        self._create = connection.register_script((lua / "create.lua").read_text("utf-8"))
        self._ingestion = Ingestion(
            self.writer,
            connection.register_script((lua / "ingest.lua").read_text("utf-8")),
            keeps_raw_reports=self.keeps_raw_reports,
            retention_s=retention_s,
        )
        self._count_request = connection.register_script((lua / "ratelimit.lua").read_text("utf-8"))
        self._parsed: OrderedDict[str, tuple[CampaignSpec, Mechanism]] = OrderedDict()
        self._known: OrderedDict[str, Campaign] = OrderedDict()
        self._layouts: dict[str, Layout] = {}
        self._intset_entries: int | None = None
        self._hash_entries: int | None = None
        self.sessions = SessionStore(connection)
        self.estimates = EstimateCache(connection)

    def _acknowledged_under_replicated(self, node: str, replies: list[Any]) -> None:
        """Pass on the new reports ``node`` acknowledged with fewer replicas than asked for.

        The writer waits only for ``lua/ingest.lua`` calls that store: element 1 of each
        reply is the reports it stored (0 for a refusal).
        """
        reports = sum(int(reply[1]) for reply in replies)
        if reports and self._on_under_replicated is not None:
            self._on_under_replicated(node, reports)

    def ping(self) -> None:
        """Raise ``redis.RedisError`` unless the server answers."""
        self.connection.ping()

    def close(self) -> None:
        """Close the store's connections."""
        self.connection.close()

    # -- campaigns ---------------------------------------------------------------------

    def new_layout(self, campaign_id: str) -> Layout:
        """The layout a campaign created now gets (shards, buckets sized for its quota)."""
        if self._intset_entries is None:
            value = config_value(self.connection, "set-max-intset-entries")
            self._intset_entries = int(value) if value else layouts.REDIS_DEFAULT_INTSET_ENTRIES
        expected = self.max_reports or layouts.UNBOUNDED_CAMPAIGN_REPORTS
        return Layout(
            campaign_id,
            shards=self.shards,
            buckets=layouts.buckets_for(expected, self.shards, self._intset_entries),
            window_s=layouts.window_for(self.report_id_ttl_s),
            salts=layouts.placement(campaign_id, self.shards, slot_owners(self.connection)),
        )

    def create_campaign(
        self, spec: CampaignSpec, *, now: float | None = None
    ) -> tuple[Campaign, bool]:
        """Store a new campaign; return it and whether it was created now.

        Creating the very same spec again is not an error (``created`` is False),
        so an admin script can be re-run; :class:`CampaignExists` if the id holds
        another spec.
        """
        created_at = self.clock() if now is None else now
        layout = self.new_layout(spec.id)
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
        campaign = self.get_campaign(spec.id)
        if not created and campaign.spec_hash != spec.spec_hash:
            raise CampaignExists(
                f"campaign {spec.id!r} already exists with another spec", campaign_id=spec.id
            )
        # Outside the script (other slots); idempotent, so a re-run repairs a lost write.
        self._layouts.pop(spec.id, None)
        self._open_shards(self.layout(spec.id), spec.spec_hash, fresh=created)
        self.connection.zadd(self.INDEX_KEY, {spec.id: created_at}, nx=True)
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

    def layout(self, campaign_id: str) -> Layout:
        """Where a campaign's data lives (fixed at its creation; read once per process)."""
        found = self._layouts.get(campaign_id)
        if found is None:
            record = f"ldp:{{c:{campaign_id}}}:campaign"
            meta = cast(_Fields, self.connection.hmget(record, _META_FIELDS))
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

    def get_campaign(self, campaign_id: str) -> Campaign:
        found = self._read_campaigns([campaign_id])
        if not found:
            raise CampaignNotFound(f"no campaign {campaign_id!r}", campaign_id=campaign_id)
        return found[0]

    def campaign_for_reports(self, campaign_id: str) -> Campaign:
        """The campaign as this process last read it, for validating reports without a read.

        Its spec is what :meth:`ingest` verifies by hash (a spec never changes while the
        campaign exists); its status and report count may be out of date. Reads the
        store only for a campaign not seen yet (:class:`CampaignNotFound` if unknown).
        """
        campaign = self._known.get(campaign_id)
        if campaign is None:
            campaign = self.get_campaign(campaign_id)
            self._known[campaign_id] = campaign
            if len(self._known) > SPEC_CACHE_SIZE:
                self._known.popitem(last=False)
        return campaign

    def forget_campaign(self, campaign_id: str) -> None:
        """Drop the process's copy kept by :meth:`campaign_for_reports`."""
        self._known.pop(campaign_id, None)

    def list_campaigns(self) -> list[Campaign]:
        """All campaigns, oldest first."""
        ids = [
            raw.decode() for raw in cast(list[bytes], self.connection.zrange(self.INDEX_KEY, 0, -1))
        ]
        return self._read_campaigns(ids)

    def _read_campaigns(self, campaign_ids: Sequence[str]) -> list[Campaign]:
        """The campaigns that exist among ``campaign_ids``: two pipelined reads."""
        pipe = self.connection.pipeline(transaction=False)
        for campaign_id in campaign_ids:
            pipe.hmget(f"ldp:{{c:{campaign_id}}}:campaign", _META_FIELDS)
        metas = [
            (campaign_id, meta)
            for campaign_id, meta in zip(campaign_ids, pipe.execute(), strict=True)
            if meta[0] is not None
        ]
        layouts_read = [self._layout_of(campaign_id, meta) for campaign_id, meta in metas]
        totals = self._sum_shards(
            layouts_read, lambda pipe, lay, s: pipe.hget(lay.state_key(s), "n_reports")
        )
        campaigns = []
        for (_, meta), layout, parts in zip(metas, layouts_read, totals, strict=True):
            shard_reports = tuple(int(part or 0) for part in parts)
            spec_hash, status, created_at, version = meta[:4]
            # create.lua writes the fields together: a campaign with a hash has all of them.
            assert status is not None and created_at is not None
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

    def _sum_shards(self, layouts_read: Sequence[Layout], command) -> list[list[Any]]:
        """One command per shard of each layout, pipelined (per node on a cluster)."""
        pipe = self.connection.pipeline(transaction=False)
        for layout in layouts_read:
            for shard in range(layout.shards):
                command(pipe, layout, shard)
        replies = iter(pipe.execute() if layouts_read else [])
        return [[next(replies) for _ in range(layout.shards)] for layout in layouts_read]

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
        return self.get_campaign(campaign_id)

    # -- reports -----------------------------------------------------------------------

    def ingest(
        self,
        campaign_id: str,
        reports: Sequence[StoredReport],
        *,
        enrollment_required: bool = False,
        spec_hash: str | None = None,
        rate_limit: RateLimit | None = None,
        report_budget: ReportBudget | None = None,
        now: float | None = None,
    ) -> IngestResult:
        """Store reports not seen before; count the duplicates.

        Each shard the reports belong to admits and stores its part atomically
        (:mod:`aggregator.storage.ingest`): ``rate_limit`` counts the submission against
        the client's window (:class:`RateLimited` once the shard's share is used up),
        ``report_budget`` and the store's quota are charged with its new reports only
        (:class:`ReportBudgetExceeded`, :class:`CampaignFull`), so a retried batch costs
        nothing. With ``enrollment_required`` each new report spends its unused enrollment
        token in the same step (a retried report id is a duplicate, not refused). A batch
        that spans shards is checked on all of them before any is written, so that one
        refusal refuses the whole batch. ``spec_hash``, if given, must be the stored spec's
        (else :class:`SpecChanged`). Raises :class:`CampaignNotFound`,
        :class:`CampaignClosed` or :class:`EnrollmentRefused` too; then nothing is
        stored, unless the campaign was closed, a token spent or a share used up by a
        concurrent request while the batch's shards were being written. Connection errors
        and :class:`~aggregator.storage.cluster.NotAcknowledged` mean the reports may or
        may not be stored: sending them again is safe.
        """
        moment = self.clock() if now is None else now
        return self._ingestion.run(
            Submission(
                layout=self.layout(campaign_id),
                reports=reports,
                enrollment_required=enrollment_required,
                spec_hash=spec_hash,
                admission=Admission(rate_limit, report_budget, self.max_reports),
                period=self._period_args(campaign_id, moment),
                moment=moment,
            )
        )

    def _period_args(self, campaign_id: str, moment: float) -> PeriodArgs:
        """The period a report received at ``moment`` is counted in, and how."""
        # The process's copy: a spec never changes, and ingest must cost no extra read.
        campaign = self.campaign_for_reports(campaign_id)
        unit = campaign.unit
        key = periods.key_at(unit, moment)
        if self._hash_entries is None:
            value = config_value(self.connection, "hash-max-ziplist-entries")
            self._hash_entries = int(value) if value else layouts.REDIS_DEFAULT_HASH_ENTRIES
        n_outputs = campaign.mechanism.n_outputs
        return PeriodArgs(
            key=key,
            ttl_s=retention.period_ttl_s(unit, key, self.period_retention_s, moment),
            dense_from=layouts.dense_from(n_outputs, self._hash_entries),
            last_output=n_outputs - 1,
        )

    def count_request(
        self, view: str, limit: RateLimit, *, now: float | None = None
    ) -> WindowCount:
        """Count one request of ``limit.client`` to ``view`` in its fixed window: one Redis call.

        The counter is the ingestion script's kind (a key per client and window, expiring
        with it); the caller compares ``hits`` with ``limit.amount``. Raises the
        connection's errors (e.g. Redis at its memory limit refuses the write).
        """
        moment = self.clock() if now is None else now
        key = self.REQUEST_RATE_KEY.format(
            view=view, client=limit.client, window=int(moment // limit.window_s)
        )
        hits, ttl_s = self._count_request(keys=[key], args=[limit.window_s])
        return WindowCount(int(hits), int(ttl_s))

    def requests_counted(self, view: str, limit: RateLimit, *, now: float | None = None) -> int:
        """What :meth:`count_request` has counted so far in this window (a read only)."""
        moment = time.time() if now is None else now
        key = self.REQUEST_RATE_KEY.format(
            view=view, client=limit.client, window=int(moment // limit.window_s)
        )
        return int(self.connection.get(key) or 0)

    # -- enrollment ----------------------------------------------------------------------

    def add_enrollment_tokens(self, campaign_id: str, tokens: Sequence[str]) -> int:
        """Make ``tokens`` valid for one report each; return how many unused tokens there are."""
        layout = self.layout(campaign_id)
        by_shard: dict[int, list[str]] = {}
        for token in tokens:
            digest = token_digest(token)
            by_shard.setdefault(layout.token_shard(digest), []).append(digest)
        pipe = self.connection.pipeline(transaction=False)
        for shard, digests in by_shard.items():
            pipe.sadd(layout.tokens_key(shard), *digests)
        pipe.execute()
        return self.unused_enrollment_tokens(campaign_id)

    def unused_enrollment_tokens(self, campaign_id: str) -> int:
        layout = self.layout(campaign_id)
        (sizes,) = self._sum_shards([layout], lambda pipe, lay, s: pipe.scard(lay.tokens_key(s)))
        return sum(int(size) for size in sizes)

    # -- retention -----------------------------------------------------------------------

    def trim_reports(self, campaign_id: str, *, older_than: float) -> int:
        """Drop raw reports received before ``older_than`` (unix s); counts stay."""
        min_id = max(int(older_than * 1000), 1)
        layout = self.layout(campaign_id)
        (trimmed,) = self._sum_shards(
            [layout],
            lambda pipe, lay, s: pipe.xtrim(lay.stream_key(s), minid=min_id, approximate=False),
        )
        return sum(int(count) for count in trimmed)

    def counts(self, campaign_id: str) -> dict[int, int]:
        """Reports per output index (indices with no report are absent)."""
        return self._summed_hash(campaign_id, Layout.counts_key)

    def period_counts(self, campaign_id: str, keys: Sequence[str]) -> list[dict[int, int]]:
        """Reports per output index received in each period of ``keys`` (its key in
        :mod:`aggregator.storage.periods`), in that order: one pipelined read.

        A period whose counts expired, or from before the campaign was counted by period
        (:attr:`Campaign.periods_from`), reads as empty.
        """
        layout = self.layout(campaign_id)
        pipe = self.connection.pipeline(transaction=False)
        for key in keys:
            for shard in range(layout.shards):
                pipe.hgetall(layout.period_key(shard, key))
                pipe.get(layout.period_dense_key(shard, key))
        replies = iter(pipe.execute() if keys else [])
        out = []
        for _ in keys:
            dense: list[np.ndarray] = []
            total: dict[int, int] = {}
            for _ in range(layout.shards):
                part, raw = next(replies), next(replies)
                for name, count in part.items():
                    total[int(name)] = total.get(int(name), 0) + int(count)
                if raw:
                    dense.append(np.frombuffer(raw, dtype=">u4"))
            if dense:
                summed = np.zeros(max(len(array) for array in dense), dtype=np.int64)
                for array in dense:
                    summed[: len(array)] += array
                nonzero = np.flatnonzero(summed)
                for index, count in zip(nonzero.tolist(), summed[nonzero].tolist(), strict=True):
                    total[index] = total.get(index, 0) + count
            out.append(total)
        return out

    def window_counts(self, campaign_id: str, keys: Sequence[str]) -> dict[int, int]:
        """Reports per output index received in the periods of ``keys``, summed."""
        total: dict[int, int] = {}
        for part in self.period_counts(campaign_id, keys):
            for index, count in part.items():
                total[index] = total.get(index, 0) + count
        return total

    def hourly_counts(self, campaign_id: str) -> list[tuple[int, int]]:
        """Accepted reports per hour, as (hour start in unix seconds, count), oldest first."""
        return sorted(self._summed_hash(campaign_id, Layout.hourly_key).items())

    def _summed_hash(self, campaign_id: str, key_of) -> dict[int, int]:
        layout = self.layout(campaign_id)
        (parts,) = self._sum_shards([layout], lambda pipe, lay, s: pipe.hgetall(key_of(lay, s)))
        total: dict[int, int] = {}
        for part in parts:
            for name, count in part.items():
                total[int(name)] = total.get(int(name), 0) + int(count)
        return total

    def last_report_times(self, campaign_ids: Sequence[str]) -> dict[str, float | None]:
        """When each campaign last accepted a report (unix seconds; None: never)."""
        found = [self.layout(campaign_id) for campaign_id in campaign_ids]
        parts = self._sum_shards(found, lambda pipe, lay, s: pipe.hget(lay.state_key(s), "last_ms"))
        return {
            layout.campaign_id: max((int(ms) / 1000 for ms in shard_times if ms), default=None)
            for layout, shard_times in zip(found, parts, strict=True)
        }

    def iter_reports(self, campaign_id: str, *, chunk: int = EXPORT_CHUNK) -> Iterator[dict]:
        """Every kept raw report, oldest first: ``report_id``, ``value``, ``received_at``."""
        layout = self.layout(campaign_id)
        streams = [
            self._iter_stream(layout.stream_key(shard), chunk) for shard in range(layout.shards)
        ]
        for _, report in heapq.merge(*streams, key=lambda entry: entry[0]):
            yield report

    def _iter_stream(self, key: str, chunk: int) -> Iterable[tuple[tuple[int, int], dict]]:
        start = "-"
        while True:
            entries = cast(
                list[tuple[bytes, dict[bytes, bytes]]],
                self.connection.xrange(key, min=start, max="+", count=chunk),
            )
            for entry_id, fields in entries:
                ms, sequence = entry_id.split(b"-")
                yield (
                    (int(ms), int(sequence)),
                    {
                        "report_id": fields[b"report_id"].decode(),
                        "value": json.loads(fields[b"value"]),
                        "received_at": int(ms) / 1000,
                    },
                )
            if len(entries) < chunk:
                return
            start = "(" + entries[-1][0].decode()

    def has_raw_reports(self, campaign_id: str) -> bool:
        """Whether any raw report of the campaign is stored."""
        layout = self.layout(campaign_id)
        (lengths,) = self._sum_shards([layout], lambda pipe, lay, s: pipe.xlen(lay.stream_key(s)))
        return any(lengths)
