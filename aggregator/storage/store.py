"""The store: one object that the aggregator's other layers reach Redis through.

:class:`CampaignStore` composes the storage modules, each of one concern, and gives them
one face:

- :mod:`~aggregator.storage.campaigns`: the campaigns' records and this process's copies;
- :mod:`~aggregator.storage.ingest`: a submission's way into its campaign's shards, each
  admitting and storing its part in one atomic script;
- :mod:`~aggregator.storage.counts`, :mod:`~aggregator.storage.enrollment`,
  :mod:`~aggregator.storage.raw_reports`: what the shards hold, read back;
- :mod:`~aggregator.storage.request_counter`, :mod:`~aggregator.storage.sessions`,
  :mod:`~aggregator.storage.estimate_cache`: counters, sessions and cached estimates
  outside the campaigns' shards.

Every key's name comes from :mod:`~aggregator.storage.keys`, where a campaign's keys and
their hash tags live is :mod:`~aggregator.storage.layout`. A report goes down one way:
:meth:`CampaignStore.ingest` takes the campaign's layout and spec from this process's
copy, :class:`~aggregator.storage.ingest.Ingestion` groups the reports by shard, and
:class:`~aggregator.storage.cluster.NodeWriter` sends each node its shards' scripts in one
round trip; nothing on the way reads the campaign's record. The connection and the clock
are passed in; nothing here is global.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

from aggregator.storage import counts, enrollment, raw_reports, retention
from aggregator.storage import layout as layouts
from aggregator.storage.campaigns import CLOSED, OPEN, STATUSES, Campaign, Campaigns
from aggregator.storage.cluster import Connection, NodeWriter
from aggregator.storage.errors import CampaignNotFound, SpecChanged
from aggregator.storage.estimate_cache import EstimateCache
from aggregator.storage.ingest import (
    Admission,
    Ingestion,
    IngestResult,
    RateLimit,
    ReportBudget,
    StoredReport,
    Submission,
)
from aggregator.storage.layout import Layout
from aggregator.storage.raw_reports import EXPORT_CHUNK
from aggregator.storage.request_counter import RequestCounter, WindowCount
from aggregator.storage.sessions import SessionStore
from shared.errors import ValidationError
from shared.spec import CampaignSpec

# Also what callers import from here: the store's face.
__all__ = [
    "CLOSED",
    "DEFAULT_CAMPAIGN_MAX_REPORTS",
    "DEFAULT_REPORT_ID_TTL_S",
    "OPEN",
    "RAW_REPORTS_KEEP",
    "RAW_REPORTS_MODES",
    "RAW_REPORTS_OFF",
    "STATUSES",
    "Campaign",
    "CampaignStore",
    "StoredReport",
    "WindowCount",
]

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
# Refusals of a submission checked against this process's copy of its campaign after which
# the campaign is read again: the copy may be of a campaign since replaced under its id.
STALE_COPY_REFUSALS = (ValidationError, SpecChanged, CampaignNotFound)


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
    estimates : EstimateCache, optional
        The cache of estimates (default: one with the default budget and no memory mark).
    """

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
        estimates: EstimateCache | None = None,
    ) -> None:
        if retention_s is not None and not retention_s > 0:
            raise ValueError(f"retention_s must be > 0 or None, got {retention_s!r}")
        if period_retention_s is not None and not period_retention_s > 0:
            raise ValueError(f"period_retention_s must be > 0 or None, got {period_retention_s!r}")
        if raw_reports not in RAW_REPORTS_MODES:
            raise ValueError(f"raw_reports must be one of {RAW_REPORTS_MODES}, got {raw_reports!r}")
        if not 1 <= shards <= layouts.MAX_SHARDS:
            raise ValueError(f"shards must be 1 to {layouts.MAX_SHARDS}, got {shards!r}")
        self.connection = connection
        self.clock = clock
        self.report_id_ttl_s = int(report_id_ttl_s)
        self.shards = shards
        self.max_reports = int(max_reports)
        self._campaigns = Campaigns(connection)
        self._ingestion = Ingestion(
            connection,
            ack_replicas=ack_replicas,
            ack_timeout_ms=ack_timeout_ms,
            keeps_raw_reports=raw_reports == RAW_REPORTS_KEEP,
            retention_s=retention_s,
            period_retention_s=period_retention_s,
            on_under_replicated=on_under_replicated,
        )
        self._requests = RequestCounter(connection)
        self.sessions = SessionStore(connection)
        self.estimates = EstimateCache(connection) if estimates is None else estimates

    @property
    def retention_s(self) -> float | None:
        """Raw reports older than this are trimmed from the stream (counts stay); None keeps
        all."""
        return self._ingestion.retention_s

    @property
    def period_retention_s(self) -> float | None:
        return self._ingestion.period_retention_s

    @property
    def keeps_raw_reports(self) -> bool:
        return self._ingestion.keeps_raw_reports

    @property
    def writer(self) -> NodeWriter:
        """What writes reports to the masters (and waits for their replicas)."""
        return self._ingestion.writer

    def ping(self) -> None:
        """Raise ``redis.RedisError`` unless the server answers."""
        self.connection.ping()

    def close(self) -> None:
        """Close the store's connections."""
        self.connection.close()

    # -- campaigns (:mod:`aggregator.storage.campaigns`) -------------------------------------

    def new_layout(self, campaign_id: str) -> Layout:
        """The layout a campaign created now gets (shards, buckets sized for its quota)."""
        return self._campaigns.new_layout(
            campaign_id,
            shards=self.shards,
            max_reports=self.max_reports,
            report_id_ttl_s=self.report_id_ttl_s,
        )

    def create_campaign(
        self, spec: CampaignSpec, *, now: float | None = None
    ) -> tuple[Campaign, bool]:
        """Store a new campaign; return it and whether it was created now (see
        :meth:`Campaigns.create <aggregator.storage.campaigns.Campaigns.create>`)."""
        created_at = self.clock() if now is None else now
        return self._campaigns.create(spec, self.new_layout(spec.id), created_at=created_at)

    def layout(self, campaign_id: str) -> Layout:
        """Where a campaign's data lives (fixed at its creation; read once per process)."""
        return self._campaigns.layout(campaign_id)

    def get_campaign(self, campaign_id: str) -> Campaign:
        """The campaign as stored now (:class:`CampaignNotFound` if there is none)."""
        return self._campaigns.get(campaign_id)

    def campaign_for_reports(self, campaign_id: str) -> Campaign:
        """The campaign as this process last read it, for validating reports without a read
        (its status and report count may be out of date; its spec never is)."""
        return self._campaigns.for_reports(campaign_id)

    def forget_campaign(self, campaign_id: str) -> None:
        """Drop the process's copy kept by :meth:`campaign_for_reports`."""
        self._campaigns.forget(campaign_id)

    def campaign_ids(self) -> list[str]:
        """Every campaign's id, oldest first."""
        return self._campaigns.ids()

    def list_campaigns(self) -> list[Campaign]:
        """All campaigns, oldest first."""
        return self._campaigns.read_all()

    def set_status(self, campaign_id: str, status: str) -> Campaign:
        """Open or close a campaign; a closed campaign refuses reports (every shard's copy is
        written before this returns)."""
        return self._campaigns.set_status(campaign_id, status)

    # -- reports (:mod:`aggregator.storage.ingest`) ------------------------------------------

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
        # The process's copy: a spec and a layout never change, and ingest must cost no
        # extra read (nor read the record, whose master may be failing over).
        campaign = self._campaigns.for_reports(campaign_id)
        return self._ingest(
            campaign, reports, enrollment_required, spec_hash, rate_limit, report_budget, now
        )

    def _ingest(
        self,
        campaign: Campaign,
        reports: Sequence[StoredReport],
        enrollment_required: bool,
        spec_hash: str | None,
        rate_limit: RateLimit | None,
        report_budget: ReportBudget | None,
        now: float | None,
    ) -> IngestResult:
        moment = self.clock() if now is None else now
        return self._ingestion.run(
            Submission(
                layout=self._campaigns.layout(campaign.spec.id),
                reports=reports,
                enrollment_required=enrollment_required,
                spec_hash=spec_hash,
                admission=Admission(rate_limit, report_budget, self.max_reports),
                period=self._ingestion.period_args(
                    campaign.unit, campaign.mechanism.n_outputs, moment
                ),
                moment=moment,
            )
        )

    def ingest_checked(
        self,
        campaign_id: str,
        check: Callable[[Campaign], Sequence[StoredReport]],
        *,
        rate_limit: RateLimit | None = None,
        report_budget: ReportBudget | None = None,
        now: float | None = None,
    ) -> IngestResult:
        """Check a submission against its campaign with ``check``, then :meth:`ingest` it.

        ``check(campaign)`` validates the submission against ``campaign`` and returns its
        reports (raising :class:`~shared.errors.ValidationError`, or whatever else refuses
        it). The campaign is this process's copy (:meth:`campaign_for_reports`), and
        :meth:`ingest` verifies its spec hash in the same call that stores. If the copy
        refuses the reports, or the store refuses the copy (:class:`SpecChanged`,
        :class:`CampaignNotFound`: a campaign deleted, perhaps created again under its id),
        the copy is dropped and the campaign read again; only if its spec changed are the
        reports checked and stored once more, else the refusal stands.
        """
        campaign = self._campaigns.for_reports(campaign_id)
        for attempt in (1, 2):
            try:
                return self._ingest(
                    campaign,
                    check(campaign),
                    campaign.spec.enrollment_required,
                    campaign.spec_hash,
                    rate_limit,
                    report_budget,
                    now,
                )
            except STALE_COPY_REFUSALS:
                self._campaigns.forget(campaign_id)
                if attempt == 2:
                    raise
                fresh = self._campaigns.for_reports(campaign_id)
                if fresh.spec_hash == campaign.spec_hash:
                    raise
                campaign = fresh
        raise AssertionError("unreachable: the second attempt returns or raises")

    # -- what the shards hold (:mod:`~aggregator.storage.counts` and others) ----------------

    def counts(self, campaign_id: str) -> dict[int, int]:
        """Reports per output index (indices with no report are absent)."""
        return counts.all_time(self.connection, self.layout(campaign_id))

    def period_counts(self, campaign_id: str, keys: Sequence[str]) -> list[dict[int, int]]:
        """Reports per output index received in each period of ``keys`` (its key in
        :mod:`aggregator.storage.periods`), in that order: one pipelined read.

        A period whose counts expired, or from before the campaign was counted by period
        (:attr:`Campaign.periods_from`), reads as empty.
        """
        return counts.per_period(self.connection, self.layout(campaign_id), keys)

    def window_counts(self, campaign_id: str, keys: Sequence[str]) -> dict[int, int]:
        """Reports per output index received in the periods of ``keys``, summed."""
        return counts.in_window(self.connection, self.layout(campaign_id), keys)

    def hourly_counts(self, campaign_id: str) -> list[tuple[int, int]]:
        """Accepted reports per hour, as (hour start in unix seconds, count), oldest first."""
        return counts.hourly(self.connection, self.layout(campaign_id))

    def last_report_times(self, campaign_ids: Sequence[str]) -> dict[str, float | None]:
        """When each campaign last accepted a report (unix seconds; None: never)."""
        found = [self.layout(campaign_id) for campaign_id in campaign_ids]
        return counts.last_report_times(self.connection, found)

    def add_enrollment_tokens(self, campaign_id: str, tokens: Sequence[str]) -> int:
        """Make ``tokens`` valid for one report each; return how many unused tokens there are."""
        layout = self.layout(campaign_id)
        enrollment.add(self.connection, layout, tokens)
        return enrollment.unused(self.connection, layout)

    def unused_enrollment_tokens(self, campaign_id: str) -> int:
        return enrollment.unused(self.connection, self.layout(campaign_id))

    def trim_reports(self, campaign_id: str, *, older_than: float) -> int:
        """Drop raw reports received before ``older_than`` (unix s); counts stay."""
        return raw_reports.trim(self.connection, self.layout(campaign_id), older_than=older_than)

    def iter_reports(self, campaign_id: str, *, chunk: int = EXPORT_CHUNK) -> Iterator[dict]:
        """Every kept raw report, oldest first: ``report_id``, ``value``, ``received_at``."""
        return raw_reports.oldest_first(self.connection, self.layout(campaign_id), chunk=chunk)

    def has_raw_reports(self, campaign_id: str) -> bool:
        """Whether any raw report of the campaign is stored."""
        return raw_reports.any_kept(self.connection, self.layout(campaign_id))

    # -- requests to public views (:mod:`aggregator.storage.request_counter`) ---------------

    def count_request(
        self, view: str, limit: RateLimit, *, now: float | None = None
    ) -> WindowCount:
        """Count one request of ``limit.client`` to ``view`` in its fixed window: one Redis call.

        The caller compares ``hits`` with ``limit.amount``. Raises the connection's errors
        (e.g. Redis at its memory limit refuses the write).
        """
        return self._requests.count(view, limit, self.clock() if now is None else now)

    def requests_counted(self, view: str, limit: RateLimit, *, now: float | None = None) -> int:
        """What :meth:`count_request` has counted so far in this window (a read only)."""
        return self._requests.counted(view, limit, self.clock() if now is None else now)
