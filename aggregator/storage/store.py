"""The Redis store: campaigns, deduplicated report ingestion, counts and the audit stream.

Every key of a campaign carries the hash tag ``{c:<id>}`` so that they share a
cluster slot and one Lua script can, atomically, check each report id
(``SET NX EX``), increment the count of its output symbol (``HINCRBY``) and
append the report to the campaign's stream (``XADD``). The counts are the
estimators' sufficient statistics; the stream keeps every accepted report for
audit and re-analysis. The connection is passed in; nothing here is global.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from importlib import resources
from typing import Any, NamedTuple, cast

import redis

from aggregator.storage.errors import is_out_of_memory
from aggregator.storage.locks import Lock
from aggregator.storage.sessions import SessionStore
from shared.errors import LDPError
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec

OPEN = "open"
CLOSED = "closed"
STATUSES = (OPEN, CLOSED)
# How long a report id is remembered for deduplication: retries come within minutes,
# a queued report on an offline device may come weeks later.
DEFAULT_REPORT_ID_TTL_S = 90 * 24 * 3600
# Most reports one campaign may hold (CAMPAIGN_MAX_REPORTS; 0: no quota), about 2 GB of
# Redis memory at today's 200 bytes a report: one campaign cannot take the whole store.
DEFAULT_CAMPAIGN_MAX_REPORTS = 10_000_000
EXPORT_CHUNK = 1000
# Parsed specs kept per store: a spec never changes, and parsing a large domain on
# every request would dominate it (about 0.1 s for 100,000 labels).
SPEC_CACHE_SIZE = 256
# A cached estimate is kept this long after it was last computed (it is recomputed anyway
# as soon as the counts change; the expiry only bounds the keys of unused methods and levels).
ESTIMATE_CACHE_TTL_S = 24 * 3600
_META_FIELDS = ("spec_hash", "status", "created_at", "n_reports")
# A reply of HMGET: the connection runs with decode_responses off, so values are bytes.
_Fields = list[bytes | None]

logger = logging.getLogger(__name__)


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


class CreateStatus(IntEnum):
    """What ``lua/create.lua`` answered (the script defines the same names and values)."""

    TAKEN = 0
    CREATED = 1


class StoreError(LDPError):
    """A store operation refused by the state of the data (not by bad input)."""

    code = "store_error"

    def __init__(self, message: str, *, campaign_id: str):
        super().__init__(message)
        self.campaign_id = campaign_id


class CampaignNotFound(StoreError):
    code = "campaign_not_found"


class CampaignClosed(StoreError):
    code = "campaign_closed"


class CampaignExists(StoreError):
    code = "campaign_exists"


class EnrollmentRefused(StoreError):
    """A report's enrollment token was never issued for the campaign, or is spent."""

    code = "enrollment_refused"


def token_digest(token: str) -> str:
    """What the store keeps of an enrollment token: its SHA-256, so a leak spends nothing."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Campaign:
    """A stored campaign: its immutable spec and mechanism, and the server's fields."""

    spec: CampaignSpec
    status: str
    created_at: float
    n_reports: int
    mechanism: Mechanism = field(compare=False, repr=False)

    @property
    def spec_hash(self) -> str:
        return self.spec.spec_hash

    def to_wire(self) -> dict[str, Any]:
        """The spec as served: spec fields plus ``status``, ``spec_hash`` and ``created_at``."""
        return {
            **self.spec.to_dict(),
            "status": self.status,
            "spec_hash": self.spec_hash,
            "created_at": self.created_at,
        }


class SpecChanged(StoreError):
    """The stored spec is not the one the reports were validated against (nothing stored)."""

    code = "spec_changed"


class RetryLater(StoreError):
    """A refusal that lifts with time; ``retry_after_s`` says when to try again."""

    def __init__(self, message: str, *, campaign_id: str, retry_after_s: int) -> None:
        super().__init__(message, campaign_id=campaign_id)
        self.retry_after_s = retry_after_s


class RateLimited(RetryLater):
    """The client has used up its submissions for the current window (nothing stored)."""

    code = "rate_limited"


class ReportBudgetExceeded(RateLimited):
    """The client's address has sent its reports for the current window (nothing stored)."""

    code = "report_budget_exceeded"


class CampaignFull(StoreError):
    """The campaign holds its quota of reports (nothing stored)."""

    code = "campaign_full"


class StorageFull(RetryLater):
    """The store is near its memory limit and takes no new reports for now (nothing stored)."""

    code = "storage_full"


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
class IngestResult:
    accepted: int
    duplicates: int
    # Submissions counted in the rate-limit window so far, and its seconds left (0: no limit).
    window_hits: int = 0
    window_ttl_s: int = 0


class WindowCount(NamedTuple):
    """A fixed window's requests so far (the one just counted included) and its seconds left."""

    hits: int
    ttl_s: int


class CampaignStore:
    """Campaigns and their reports in one Redis (or Redis Cluster, by the key scheme)."""

    INDEX_KEY = "ldp:campaigns"
    CAMPAIGN_KEY = "ldp:{{c:{id}}}:campaign"
    COUNTS_KEY = "ldp:{{c:{id}}}:counts"
    HOURLY_KEY = "ldp:{{c:{id}}}:hourly"
    STREAM_KEY = "ldp:{{c:{id}}}:reports"
    SEEN_KEY = "ldp:{{c:{id}}}:seen:{report_id}"
    ESTIMATE_KEY = "ldp:{{c:{id}}}:estimate:{variant}"
    TOKENS_KEY = "ldp:{{c:{id}}}:enrollment"
    RATE_KEY = "ldp:{{c:{id}}}:ratelimit:{client}:{window}"
    BUDGET_KEY = "ldp:{{c:{id}}}:ratelimit-reports:{client}:{window}"
    # Requests to one rate-limited view outside a campaign (no hash tag: one key per call).
    REQUEST_RATE_KEY = "ldp:ratelimit:{view}:{client}:{window}"
    ESTIMATE_LOCK_KEY = "ldp:{{c:{id}}}:estimate-lock:{variant}:{digest}"

    def __init__(
        self,
        connection: redis.Redis,
        *,
        report_id_ttl_s: int = DEFAULT_REPORT_ID_TTL_S,
        retention_s: float | None = None,
    ) -> None:
        self.connection = connection
        self.report_id_ttl_s = int(report_id_ttl_s)
        if retention_s is not None and not retention_s > 0:
            raise ValueError(f"retention_s must be > 0 or None, got {retention_s!r}")
        # Raw reports older than this are trimmed from the stream (counts stay); None keeps all.
        self.retention_s = retention_s
        lua = resources.files("aggregator.storage") / "lua"
        self._create = connection.register_script((lua / "create.lua").read_text("utf-8"))
        self._ingest = connection.register_script((lua / "ingest.lua").read_text("utf-8"))
        self._count_request = connection.register_script((lua / "ratelimit.lua").read_text("utf-8"))
        self._parsed: OrderedDict[str, tuple[CampaignSpec, Mechanism]] = OrderedDict()
        self._known: OrderedDict[str, Campaign] = OrderedDict()
        self.sessions = SessionStore(connection)

    def ping(self) -> None:
        """Raise ``redis.RedisError`` unless the server answers."""
        self.connection.ping()

    # -- campaigns ---------------------------------------------------------------------

    def create_campaign(
        self, spec: CampaignSpec, *, now: float | None = None
    ) -> tuple[Campaign, bool]:
        """Store a new campaign; return it and whether it was created now.

        Creating the very same spec again is not an error (``created`` is False),
        so an admin script can be re-run; :class:`CampaignExists` if the id holds
        another spec.
        """
        created_at = time.time() if now is None else now
        key = self.CAMPAIGN_KEY.format(id=spec.id)
        answer = self._create(
            keys=[key], args=[spec.canonical_json(), spec.spec_hash, repr(created_at)]
        )
        created = answer == CreateStatus.CREATED
        # Outside the script (another slot); idempotent, so a retry repairs a lost write.
        self.connection.zadd(self.INDEX_KEY, {spec.id: created_at}, nx=True)
        campaign = self.get_campaign(spec.id)
        if not created and campaign.spec_hash != spec.spec_hash:
            raise CampaignExists(
                f"campaign {spec.id!r} already exists with another spec", campaign_id=spec.id
            )
        return campaign, created

    def get_campaign(self, campaign_id: str) -> Campaign:
        key = self.CAMPAIGN_KEY.format(id=campaign_id)
        meta = cast(_Fields, self.connection.hmget(key, _META_FIELDS))
        campaign = self._campaign(key, meta)
        if campaign is None:
            raise CampaignNotFound(f"no campaign {campaign_id!r}", campaign_id=campaign_id)
        return campaign

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
        keys = [self.CAMPAIGN_KEY.format(id=campaign_id) for campaign_id in ids]
        pipe = self.connection.pipeline(transaction=False)
        for key in keys:
            pipe.hmget(key, _META_FIELDS)
        found = (self._campaign(key, meta) for key, meta in zip(keys, pipe.execute(), strict=True))
        return [campaign for campaign in found if campaign is not None]

    def _campaign(self, key: str, meta: _Fields) -> Campaign | None:
        """A campaign from its server fields; the spec is read and parsed only on a cache miss."""
        spec_hash, status, created_at, n_reports = meta
        if spec_hash is None:
            return None
        # create.lua writes the fields together: a campaign with a hash has all of them.
        assert status is not None and created_at is not None
        spec, mechanism = self._spec(key, spec_hash.decode())
        return Campaign(
            spec=spec,
            status=status.decode(),
            created_at=float(created_at),
            n_reports=int(n_reports or 0),
            mechanism=mechanism,
        )

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
        """Open or close a campaign; a closed campaign refuses reports."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
        key = self.CAMPAIGN_KEY.format(id=campaign_id)
        # HSET only if the record exists: a status alone must not create a campaign.
        with self.connection.pipeline() as pipe:
            while True:
                try:
                    pipe.watch(key)
                    if not pipe.exists(key):
                        raise CampaignNotFound(
                            f"no campaign {campaign_id!r}", campaign_id=campaign_id
                        )
                    pipe.multi()
                    pipe.hset(key, "status", status)
                    pipe.execute()
                    break
                except redis.WatchError:
                    continue
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
        max_reports: int = 0,
        now: float | None = None,
    ) -> IngestResult:
        """Store reports not seen before, atomically; count the duplicates.

        With ``enrollment_required`` each new report spends its unused enrollment
        token in the same step (a retried report id is a duplicate, not refused).
        ``spec_hash``, if given, must be the stored spec's (else :class:`SpecChanged`);
        ``rate_limit`` counts this submission against the client's window in the same
        step (:class:`RateLimited` once it is used up); ``report_budget`` counts the
        new reports (:class:`ReportBudgetExceeded` if they would overdraw it);
        ``max_reports`` > 0 caps the campaign's stored reports (:class:`CampaignFull`).
        Raises :class:`CampaignNotFound`, :class:`CampaignClosed` or
        :class:`EnrollmentRefused` too; in every case nothing is stored. Raw reports
        older than ``retention_s`` are trimmed from the stream as new ones arrive.
        """
        moment = time.time() if now is None else now
        hour = int(moment // 3600 * 3600)
        min_id = 0 if self.retention_s is None else max(int((moment - self.retention_s) * 1000), 1)
        limit, window_s, rate_key = self._window(self.RATE_KEY, campaign_id, rate_limit, moment)
        budget, budget_window_s, budget_key = self._window(
            self.BUDGET_KEY, campaign_id, report_budget, moment
        )
        keys = [
            self.CAMPAIGN_KEY.format(id=campaign_id),
            self.COUNTS_KEY.format(id=campaign_id),
            self.HOURLY_KEY.format(id=campaign_id),
            self.STREAM_KEY.format(id=campaign_id),
            self.TOKENS_KEY.format(id=campaign_id),
            rate_key,
            budget_key,
        ]
        args: list[Any] = [
            self.report_id_ttl_s,
            hour,
            int(enrollment_required),
            min_id,
            spec_hash or "",
            limit,
            window_s,
            budget,
            budget_window_s,
            int(max_reports),
        ]
        seen_prefix = self.SEEN_KEY.format(id=campaign_id, report_id="")
        args.append(len(seen_prefix.encode()))
        # The wire value is a function of the output index: each distinct one is sent once.
        encoded: dict[int, str] = {}
        per_report: list[Any] = []
        for report in reports:
            keys.append(seen_prefix + report.report_id)
            output = report.output
            if output not in encoded:
                encoded[output] = json.dumps(
                    report.value, separators=(",", ":"), ensure_ascii=False
                )
            per_report.append(output)
            if enrollment_required:
                token = report.enrollment_token
                per_report.append(token_digest(token) if token is not None else "")
        args.append(len(encoded))
        for output, value in encoded.items():
            args.append(output)
            args.append(value)
        args.extend(per_report)
        status, accepted, duplicates, index, hits, window_ttl = self._ingest(keys=keys, args=args)
        if status == IngestStatus.NO_CAMPAIGN:
            raise CampaignNotFound(f"no campaign {campaign_id!r}", campaign_id=campaign_id)
        if status == IngestStatus.CLOSED:
            raise CampaignClosed(f"campaign {campaign_id!r} is closed", campaign_id=campaign_id)
        if status == IngestStatus.NO_TOKEN:
            which = f"report {index - 1} of the batch" if len(reports) > 1 else "the report"
            raise EnrollmentRefused(
                f"{which} has no valid enrollment token for campaign {campaign_id!r} (never "
                "issued, or already used by another report); nothing was stored",
                campaign_id=campaign_id,
            )
        if status == IngestStatus.SPEC_CHANGED:
            raise SpecChanged(
                f"campaign {campaign_id!r} no longer has the spec the reports were checked "
                "against; nothing was stored",
                campaign_id=campaign_id,
            )
        if status == IngestStatus.RATE_LIMITED:
            raise RateLimited(
                f"rate limit exceeded ({limit} submissions per {window_s} s to this campaign); "
                "retry later",
                campaign_id=campaign_id,
                retry_after_s=max(int(window_ttl), 1),
            )
        if status == IngestStatus.OVER_BUDGET:
            raise ReportBudgetExceeded(
                f"report budget exceeded ({budget} new reports per {budget_window_s} s from "
                "one address to this campaign); nothing was stored, retry later",
                campaign_id=campaign_id,
                retry_after_s=max(int(window_ttl), 1),
            )
        if status == IngestStatus.OVER_QUOTA:
            raise CampaignFull(
                f"campaign {campaign_id!r} holds its quota of {max_reports} reports; nothing "
                "was stored",
                campaign_id=campaign_id,
            )
        return IngestResult(
            accepted=int(accepted),
            duplicates=int(duplicates),
            window_hits=int(hits),
            window_ttl_s=int(window_ttl),
        )

    def count_request(
        self, view: str, limit: RateLimit, *, now: float | None = None
    ) -> WindowCount:
        """Count one request of ``limit.client`` to ``view`` in its fixed window: one Redis call.

        The counter is the ingestion script's kind (a key per client and window, expiring
        with it); the caller compares ``hits`` with ``limit.amount``. Raises the
        connection's errors (e.g. Redis at its memory limit refuses the write).
        """
        moment = time.time() if now is None else now
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

    def _window(
        self, template: str, campaign_id: str, limit: RateLimit | ReportBudget | None, moment: float
    ) -> tuple[int, int, str]:
        """(amount, window seconds, counter key) of a fixed-window limit; amount 0: none."""
        if limit is None:
            return 0, 0, template.format(id=campaign_id, client="", window=0)
        window = int(moment // limit.window_s)
        return (
            limit.amount,
            limit.window_s,
            template.format(id=campaign_id, client=limit.client, window=window),
        )

    # -- enrollment ----------------------------------------------------------------------

    def add_enrollment_tokens(self, campaign_id: str, tokens: Sequence[str]) -> int:
        """Make ``tokens`` valid for one report each; return how many unused tokens there are."""
        key = self.TOKENS_KEY.format(id=campaign_id)
        pipe = self.connection.pipeline(transaction=True)
        pipe.sadd(key, *(token_digest(token) for token in tokens))
        pipe.scard(key)
        return int(pipe.execute()[-1])

    def unused_enrollment_tokens(self, campaign_id: str) -> int:
        return int(self.connection.scard(self.TOKENS_KEY.format(id=campaign_id)))

    # -- retention -----------------------------------------------------------------------

    def trim_reports(self, campaign_id: str, *, older_than: float) -> int:
        """Drop stream entries received before ``older_than`` (unix s); counts stay."""
        min_id = max(int(older_than * 1000), 1)
        return int(
            self.connection.xtrim(
                self.STREAM_KEY.format(id=campaign_id), minid=min_id, approximate=False
            )
        )

    def counts(self, campaign_id: str) -> dict[int, int]:
        """Reports per output index (indices with no report are absent)."""
        raw = self.connection.hgetall(self.COUNTS_KEY.format(id=campaign_id))
        return {int(output): int(count) for output, count in raw.items()}

    def last_report_times(self, campaign_ids: Sequence[str]) -> dict[str, float | None]:
        """When each campaign last accepted a report (unix seconds), from its report stream."""
        pipe = self.connection.pipeline(transaction=False)
        for campaign_id in campaign_ids:
            pipe.xrevrange(self.STREAM_KEY.format(id=campaign_id), count=1)
        times: dict[str, float | None] = {}
        for campaign_id, entries in zip(campaign_ids, pipe.execute(), strict=True):
            # Stream ids are "<milliseconds>-<sequence>", stamped by Redis on XADD.
            times[campaign_id] = int(entries[0][0].split(b"-")[0]) / 1000 if entries else None
        return times

    def hourly_counts(self, campaign_id: str) -> list[tuple[int, int]]:
        """Accepted reports per hour, as (hour start in unix seconds, count), oldest first."""
        raw = self.connection.hgetall(self.HOURLY_KEY.format(id=campaign_id))
        return sorted((int(hour), int(count)) for hour, count in raw.items())

    # -- estimate cache ----------------------------------------------------------------

    def estimate_lock(self, campaign_id: str, variant: str, digest: str, ttl_ms: int) -> Lock:
        """The lock on computing one estimate (campaign, variant, counts digest)."""
        key = self.ESTIMATE_LOCK_KEY.format(id=campaign_id, variant=variant, digest=digest)
        return Lock(self.connection, key, ttl_ms)

    def cached_estimate(self, campaign_id: str, variant: str, counts_digest: str) -> bytes | None:
        """The estimate body cached for ``variant`` if it was made from these very counts."""
        key = self.ESTIMATE_KEY.format(id=campaign_id, variant=variant)
        digest, body = cast(_Fields, self.connection.hmget(key, ("counts_digest", "body")))
        if digest is None or digest.decode() != counts_digest:
            return None
        return body

    def cache_estimate(
        self, campaign_id: str, variant: str, counts_digest: str, body: bytes | str
    ) -> None:
        """Keep an estimate body with the digest of the counts it was made from.

        A cache, not a record: when Redis is at its memory limit the body is not
        kept (and the next request computes it again), rather than failing a read.
        """
        key = self.ESTIMATE_KEY.format(id=campaign_id, variant=variant)
        try:
            with self.connection.pipeline(transaction=True) as pipe:
                pipe.hset(key, mapping={"counts_digest": counts_digest, "body": body})
                pipe.expire(key, ESTIMATE_CACHE_TTL_S)
                pipe.execute()
        except redis.ResponseError as exc:
            if not is_out_of_memory(exc):
                raise
            logger.warning(
                "estimate of campaign %r not cached: Redis is at its memory limit", campaign_id
            )

    def iter_reports(self, campaign_id: str, *, chunk: int = EXPORT_CHUNK) -> Iterator[dict]:
        """Every stored report, oldest first: ``report_id``, ``value``, ``received_at``."""
        key = self.STREAM_KEY.format(id=campaign_id)
        start = "-"
        while True:
            entries = cast(
                list[tuple[bytes, dict[bytes, bytes]]],
                self.connection.xrange(key, min=start, max="+", count=chunk),
            )
            for entry_id, fields in entries:
                yield {
                    "report_id": fields[b"report_id"].decode(),
                    "value": json.loads(fields[b"value"]),
                    "received_at": int(entry_id.split(b"-")[0]) / 1000,
                }
            if len(entries) < chunk:
                return
            start = "(" + entries[-1][0].decode()
