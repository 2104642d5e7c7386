"""A submission's way into its campaign's shards: admitted and stored in each shard's own slot.

The reports of a submission are grouped by shard (:meth:`Layout.route`) and each group
goes to one atomic script (``lua/ingest.lua``) in its shard's slot, which checks the
shard's copy of the campaign's status and spec hash, admits the submission (the client's
rate limit and report budget, the campaign's quota), drops the report ids it has seen,
spends enrollment tokens and counts the output symbols. Nothing on this path reads the
campaign's record, so while the master holding it fails over, shards on the other
masters keep taking reports; a shard on the failed master answers 503 until its replica
is promoted.

Admission is counted per shard: each of a campaign's ``S`` shards admits
``ceil(amount / S)`` of a limit (:func:`share`). Report ids spread evenly over the
shards, so none gets more than the limit rounded up to a multiple of ``S`` in all, and
a client near a limit may be refused a little before reaching it (docs/aggregator.md,
Storage, gives the odds). A submission that spans shards is first checked on all of
them (:meth:`Ingestion._check`), then stored: one refusal refuses it whole.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, NamedTuple

from aggregator.storage import layout as layouts
from aggregator.storage import periods, retention
from aggregator.storage.cluster import (
    Call,
    Connection,
    NodeWriter,
    config_value,
    is_cluster,
    lua_script,
)
from aggregator.storage.enrollment import token_digest
from aggregator.storage.errors import (
    CampaignClosed,
    CampaignFull,
    CampaignNotFound,
    EnrollmentRefused,
    RateLimited,
    ReportBudgetExceeded,
    SpecChanged,
)
from aggregator.storage.layout import Layout, Route

# What an ingest.lua call does (its ARGV[1]): store, check without storing, or check only the
# batch's size against the shares.
STORE, CHECK, SIZE = "0", "1", "2"


class IngestStatus(IntEnum):
    """What ``lua/ingest.lua`` answered (the script defines the same names and values)."""

    STORED = 0
    NO_CAMPAIGN = 1
    CLOSED = 2
    NO_TOKEN = 3
    SPEC_CHANGED = 4
    RATE_LIMITED = 5
    OVER_BUDGET = 6
    OVER_QUOTA = 7


def share(amount: int, shards: int) -> int:
    """One shard's part of a limit of ``amount`` (0: no limit): at least 1, the parts >= it."""
    return math.ceil(amount / shards) if amount else 0


class StoredReport(NamedTuple):
    """A validated report ready to store: its id, output index, wire value, enrollment token.

    A named tuple rather than a frozen dataclass: a batch makes a thousand of them per
    request, and a tuple is built in a third of the time.
    """

    report_id: str
    output: int
    value: Any
    enrollment_token: str | None = None


@dataclass(frozen=True)
class RateLimit:
    """A fixed-window limit on one client's submissions to one campaign.

    Checked and counted inside the ingestion script, so it costs no round trip
    of its own; ``client`` is the client's address (or another stable name).
    """

    amount: int
    window_s: int
    client: str


class ReportBudget(RateLimit):
    """A fixed-window budget of new reports (``amount``) one client may store in one campaign.

    Counts reports, not submissions, in the ingestion script: a submission whose
    new reports would overdraw it is refused whole (:class:`ReportBudgetExceeded`);
    duplicates cost nothing.
    """


@dataclass(frozen=True)
class IngestResult:
    accepted: int
    duplicates: int
    # What the rate limit has left in its window, and the window's seconds left (0: no
    # limit): the share left in the shard that counted the submission, times the shards.
    window_remaining: int = 0
    window_ttl_s: int = 0


class PeriodArgs(NamedTuple):
    """What ingest.lua needs of the period a batch is counted in (ARGV[9..11] and its keys)."""

    key: str
    ttl_s: int
    dense_from: int
    last_output: int


@dataclass(frozen=True)
class Admission:
    """The limits a submission is admitted under: whole amounts, split per shard on the way."""

    rate_limit: RateLimit | None
    report_budget: ReportBudget | None
    quota: int

    @property
    def needed(self) -> bool:
        return bool(self.rate_limit or self.report_budget or self.quota)


@dataclass(frozen=True)
class Submission:
    """One submission to one campaign, as the store has prepared it."""

    layout: Layout
    reports: Sequence[StoredReport]
    enrollment_required: bool
    spec_hash: str | None
    admission: Admission
    period: PeriodArgs
    moment: float


# (index in the batch, report, route, token digest): one report on its way to its shard.
_Routed = tuple[int, StoredReport, Route, str]


def _window_key(
    key_of: Callable[[int, str, int], str], shard: int, limit: RateLimit | None, moment: float
) -> str:
    """The counter of ``limit``'s current window in ``shard`` (a key unused when no limit)."""
    if limit is None:
        return key_of(shard, "", 0)
    return key_of(shard, limit.client, int(moment // limit.window_s))


class Ingestion:
    """Runs submissions through ``lua/ingest.lua``, one call per shard they touch.

    Parameters
    ----------
    connection : redis.Redis or RedisCluster
        The store's connection.
    ack_replicas : int or None
        Replicas an acknowledged write must have reached. None: 1 on a Redis Cluster
        (at most the replicas the master has at the time), none on a single server.
    ack_timeout_ms : int
        How long to wait for them.
    keeps_raw_reports : bool
        Whether raw reports are kept in each shard's stream.
    retention_s : float, optional
        Raw reports older than this are trimmed as new ones arrive.
    period_retention_s : float, optional
        Counts per period expire this long after their period ends (None: kept).
    on_under_replicated : callable, optional
        Called as ``on_under_replicated(node, reports)`` when a master acknowledged
        ``reports`` new reports with fewer replicas than ``ack_replicas``; must not raise.
    """

    def __init__(
        self,
        connection: Connection,
        *,
        ack_replicas: int | None,
        ack_timeout_ms: int,
        keeps_raw_reports: bool,
        retention_s: float | None,
        period_retention_s: float | None,
        on_under_replicated: Callable[[str, int], None] | None = None,
    ) -> None:
        self.connection = connection
        # Sends the calls to the masters of their shards (and waits for replicas).
        self.writer = NodeWriter(
            connection,
            ack_replicas=(1 if is_cluster(connection) else 0)
            if ack_replicas is None
            else ack_replicas,
            ack_timeout_ms=ack_timeout_ms,
            only_present=ack_replicas is None,
            on_under_replicated=self._acknowledged_under_replicated,
        )
        self.script = lua_script(connection, "ingest.lua")
        self.keeps_raw_reports = keeps_raw_reports
        self.retention_s = retention_s
        self.period_retention_s = period_retention_s
        self._on_under_replicated = on_under_replicated
        self._hash_entries: int | None = None

    def _acknowledged_under_replicated(self, node: str, replies: list[Any]) -> None:
        """Pass on the new reports ``node`` acknowledged with fewer replicas than asked for.

        The writer waits only for calls that store: element 1 of each reply is the reports
        it stored (0 for a refusal).
        """
        reports = sum(int(reply[1]) for reply in replies)
        if reports and self._on_under_replicated is not None:
            self._on_under_replicated(node, reports)

    def period_args(self, unit: str, n_outputs: int, moment: float) -> PeriodArgs:
        """The period a report received at ``moment`` is counted in, and how: by ``unit``
        (:mod:`aggregator.storage.periods`), over ``n_outputs`` outputs."""
        key = periods.key_at(unit, moment)
        if self._hash_entries is None:
            value = config_value(self.connection, "hash-max-ziplist-entries")
            self._hash_entries = int(value) if value else layouts.REDIS_DEFAULT_HASH_ENTRIES
        return PeriodArgs(
            key=key,
            ttl_s=retention.period_ttl_s(unit, key, self.period_retention_s, moment),
            dense_from=layouts.dense_from(n_outputs, self._hash_entries),
            last_output=n_outputs - 1,
        )

    def run(self, submission: Submission) -> IngestResult:
        """Store the submission's reports not seen before; count the duplicates.

        See :meth:`aggregator.storage.store.CampaignStore.ingest` for what is raised.
        """
        layout = submission.layout
        groups = self._group(layout, submission.reports, submission.enrollment_required)
        lead = next(iter(groups), 0)
        admission = submission.admission
        # A submission over several shards is checked on all of them before any is written
        # when something could refuse it: one bad token, or one shard's share, refuses it whole.
        checked = len(groups) > 1 and (submission.enrollment_required or admission.needed)
        counted = self._check(submission, groups, lead) if checked else None
        calls = [
            self._call(submission, shard, items, mode=STORE, counted=not checked and shard == lead)
            for shard, items in groups.items()
        ]
        replies = self.writer.run(calls)
        # Shards that stored count even if another refused (a close racing the batch).
        accepted = sum(int(reply[1]) for reply in replies)
        self._raise_first(submission, groups, replies, lead)
        window = self._window(submission, counted or replies[0])
        return IngestResult(
            accepted=accepted,
            duplicates=len(submission.reports) - accepted,
            window_remaining=window[0],
            window_ttl_s=window[1],
        )

    def _check(self, submission: Submission, groups: dict[int, list[_Routed]], lead: int) -> Any:
        """Check every shard's part of a submission without storing it; the reply of the call
        that counted it against the rate limit (the lead shard's).

        The tokens of an enrollment campaign are checked report by report. Otherwise each
        shard is asked whether the batch's size fits its shares, and only if one says no,
        which of its reports are new: duplicates cost nothing, and the usual check sends
        no report.
        """
        mode = CHECK if submission.enrollment_required else SIZE
        calls = [
            self._call(submission, shard, items, mode=mode, counted=shard == lead)
            for shard, items in groups.items()
        ]
        replies = self.writer.run(calls, wait=False)
        try:
            self._raise_first(submission, groups, replies, lead)
        except (ReportBudgetExceeded, CampaignFull):
            if mode == CHECK:
                raise
            calls = [
                self._call(submission, shard, items, mode=CHECK, counted=False)
                for shard, items in groups.items()
            ]
            self._raise_first(submission, groups, self.writer.run(calls, wait=False), lead)
        return replies[0]

    @staticmethod
    def _group(
        layout: Layout, reports: Sequence[StoredReport], enrollment_required: bool
    ) -> dict[int, list[_Routed]]:
        """The batch's reports by shard, the shard of its first report first."""
        groups: dict[int, list[_Routed]] = {}
        for index, report in enumerate(reports):
            digest = ""
            if enrollment_required and report.enrollment_token is not None:
                digest = token_digest(report.enrollment_token)
            route = layout.route(report.report_id, digest or None)
            groups.setdefault(route.shard, []).append((index, report, route, digest))
        return groups

    def _call(
        self,
        submission: Submission,
        shard: int,
        items: Sequence[_Routed],
        *,
        mode: str,
        counted: bool,
    ) -> Call:
        """The ingest.lua call for one shard's reports (``mode``: :data:`STORE`, :data:`CHECK`
        or :data:`SIZE`); ``counted``: the rate limit counts here."""
        layout, moment, period = submission.layout, submission.moment, submission.period
        admission = submission.admission
        windows = layout.windows(moment)
        limit, budget = admission.rate_limit, admission.report_budget
        keys = [
            layout.state_key(shard),
            layout.counts_key(shard),
            layout.hourly_key(shard),
            layout.stream_key(shard),
            layout.tokens_key(shard),
            layout.period_key(shard, period.key),
            layout.period_dense_key(shard, period.key),
            _window_key(layout.rate_key, shard, limit, moment),
            _window_key(layout.budget_key, shard, budget, moment),
        ]
        slots: dict[int, int] = {}
        per_report: list[Any] = [len(items)] if mode == SIZE else []
        # The wire value is a function of the output index: each distinct one is sent once.
        encoded: dict[int, str] = {}
        keep = self.keeps_raw_reports
        for _, report, route, digest in items if mode != SIZE else ():
            slot = slots.get(route.bucket)
            if slot is None:
                slot = slots[route.bucket] = len(slots)
                keys.extend(layout.seen_key(shard, window, route.bucket) for window in windows)
            per_report.extend((slot, route.member, report.output))
            if submission.enrollment_required:
                per_report.append(digest)
            if keep:
                per_report.append(report.report_id)
                if report.output not in encoded:
                    encoded[report.output] = json.dumps(
                        report.value, separators=(",", ":"), ensure_ascii=False
                    )
        min_id = 0
        if self.retention_s is not None:
            min_id = max(int((moment - self.retention_s) * 1000), 1)
        args: list[Any] = [
            mode,
            submission.spec_hash or "",
            int(moment // 3600 * 3600),
            int(moment * 1000),
            int(submission.enrollment_required),
            int(keep),
            min_id,
            max(math.ceil(layout.expires_at(windows[0]) - moment), 1),
            period.ttl_s,
            period.dense_from,
            period.last_output,
            share(limit.amount, layout.shards) if limit is not None and counted else 0,
            limit.window_s if limit is not None else 0,
            share(budget.amount, layout.shards) if budget is not None else 0,
            budget.window_s if budget is not None else 0,
            share(admission.quota, layout.shards),
            len(encoded),
        ]
        for output, value in encoded.items():
            args.extend((output, value))
        args.extend(per_report)
        return Call(self.script, keys, args)

    def _raise_first(
        self,
        submission: Submission,
        groups: dict[int, list[_Routed]],
        replies: Sequence[Any],
        lead: int,
    ) -> None:
        """Raise the first refusal among ``replies`` (one per group, in order).

        The rate limit's refusal comes first: a client over it learns nothing else.
        """
        answers = {
            shard: [int(part) for part in reply]
            for shard, reply in zip(groups, replies, strict=True)
        }
        if answers[lead][0] == IngestStatus.RATE_LIMITED:
            self._raise_for(submission, groups[lead], answers[lead])
        for shard, answer in answers.items():
            self._raise_for(submission, groups[shard], answer)

    @staticmethod
    def _window(submission: Submission, counted: Any) -> tuple[int, int]:
        """(What the rate limit has left, its window's seconds left) from the reply of the call
        that counted the submission: the shard's share left, times the shards."""
        limit = submission.admission.rate_limit
        if limit is None:
            return 0, 0
        hits, ttl = int(counted[4]), int(counted[5])
        shards = submission.layout.shards
        left = max(share(limit.amount, shards) - hits, 0) * shards
        return min(left, limit.amount), ttl

    @staticmethod
    def _raise_for(submission: Submission, items: Sequence[_Routed], answer: list[int]) -> None:
        status, index, ttl = answer[0], answer[3], answer[5]
        campaign_id = submission.layout.campaign_id
        admission = submission.admission
        if status == IngestStatus.STORED:
            return
        if status == IngestStatus.NO_CAMPAIGN:
            raise CampaignNotFound(f"no campaign {campaign_id!r}", campaign_id=campaign_id)
        if status == IngestStatus.CLOSED:
            raise CampaignClosed(f"campaign {campaign_id!r} is closed", campaign_id=campaign_id)
        if status == IngestStatus.NO_TOKEN:
            position = items[index - 1][0]
            raise EnrollmentRefused(
                f"report {position} of the batch has no valid enrollment token for campaign "
                f"{campaign_id!r} (never issued, or already used by another report); nothing "
                "was stored",
                campaign_id=campaign_id,
            )
        if status == IngestStatus.SPEC_CHANGED:
            raise SpecChanged(
                f"campaign {campaign_id!r} no longer has the spec the reports were checked "
                "against; nothing was stored",
                campaign_id=campaign_id,
            )
        if status == IngestStatus.RATE_LIMITED:
            assert admission.rate_limit is not None
            raise RateLimited(
                f"rate limit exceeded ({admission.rate_limit.amount} submissions per "
                f"{admission.rate_limit.window_s} s to this campaign); retry later",
                campaign_id=campaign_id,
                retry_after_s=max(ttl, 1),
            )
        if status == IngestStatus.OVER_BUDGET:
            assert admission.report_budget is not None
            raise ReportBudgetExceeded(
                f"report budget exceeded ({admission.report_budget.amount} new reports per "
                f"{admission.report_budget.window_s} s from one address to this campaign); "
                "nothing was stored, retry later",
                campaign_id=campaign_id,
                retry_after_s=max(ttl, 1),
            )
        if status == IngestStatus.OVER_QUOTA:
            raise CampaignFull(
                f"campaign {campaign_id!r} holds its quota of {admission.quota} reports; "
                "nothing was stored",
                campaign_id=campaign_id,
            )
        raise AssertionError(f"ingest.lua answered an unknown status {status}")
