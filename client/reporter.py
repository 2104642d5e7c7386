"""The on-device reporter: fetch and pin the spec, enforce the policy, perturb, queue, send.

The order of :meth:`Reporter.report` is what makes the guarantees hold:

1. fetch the campaign spec and check it (hash, status); if the server cannot
   be reached, fall back to the spec pinned at first use, or stop;
2. refuse, before anything is spent or sent, a campaign above the
   per-report cap, a value outside the campaign's domain or region, a spec
   that differs from the pinned one, a report that would exceed the budget;
3. derive the memoized noisy report (:mod:`client.memo`);
4. in one atomic write of the state: pin the spec, charge the ledger, put the
   payload on the queue with a fresh ``report_id``;
5. send it; take it off the queue when the server acknowledges it (accepted
   or duplicate), keep it queued with a backoff if the server is unavailable,
   move it to the rejected list if the server refuses it for good.

A crash between 4 and 5 loses nothing: the next :meth:`Reporter.flush` sends
the queued payload with its original ``report_id``, and the server counts a
report id once however often it arrives.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import requests

from client.errors import (
    BudgetExceeded,
    ClientError,
    EpsilonCapExceeded,
    ServerError,
    ServerUnavailable,
    SpecChanged,
    StateError,
)
from client.memo import memo_rng, value_tag
from client.policy import Policy
from client.state import (
    CampaignRecord,
    QueuedReport,
    RejectedReport,
    State,
    StateStore,
    campaign_key,
    default_state_dir,
)
from client.transport import DEFAULT_TIMEOUT, AggregatorAPI, check_campaign_id, normalize_server_url
from shared.errors import ReportError, ValidationError
from shared.mechanisms import Mechanism
from shared.spec import PLANAR_LAPLACE, CampaignSpec

MAX_QUEUE = 10_000
MAX_REJECTED_KEPT = 1_000
MAX_BATCH = 100
BACKOFF_BASE_S = 30.0
BACKOFF_MAX_S = 6 * 3600.0
# A report being sent is not due for a periodic flush (another process's) before this.
IN_FLIGHT_S = 60.0
# Enrollment tokens as the aggregator accepts them.
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,128}")
# Relative slack for float sums when comparing with the budget and the cap.
_SLACK = 1e-9
_LABELS_SHOWN = 20

DELIVERED = "delivered"
DUPLICATE = "duplicate"
QUEUED = "queued"
DRY_RUN = "dry_run"


@dataclass(frozen=True)
class ReportResult:
    """What :meth:`Reporter.report` did. It holds the noisy payload, never the true value.

    ``outcome`` is ``"delivered"``, ``"duplicate"`` (the server had it
    already), ``"queued"`` (kept on disk; ``detail`` says why) or
    ``"dry_run"`` (nothing written, nothing sent).
    """

    campaign_id: str
    server: str
    url: str
    payload: dict[str, Any]
    outcome: str
    charged: float
    memoized: bool
    total_spent: float
    budget_left: float
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "campaign": self.campaign_id,
            "server": self.server,
            "url": self.url,
            "payload": self.payload,
            "outcome": self.outcome,
            "charged": self.charged,
            "memoized": self.memoized,
            "total_spent": self.total_spent,
            "budget_left": self.budget_left,
            "detail": self.detail,
        }


@dataclass(frozen=True)
class FlushResult:
    """What :meth:`Reporter.flush` did: counts as the servers acknowledged them."""

    attempted: int
    accepted: int
    duplicates: int
    rejected: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    remaining: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "attempted": self.attempted,
            "accepted": self.accepted,
            "duplicates": self.duplicates,
            "rejected": self.rejected,
            "errors": self.errors,
            "remaining": self.remaining,
        }


@dataclass
class _Tally:
    attempted: int = 0
    accepted: int = 0
    duplicates: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class _Prepared:
    key: str
    spec: CampaignSpec
    online: bool
    offline_reason: str | None
    offline_retry_after: float | None
    cost: float
    tag: str
    payload: dict[str, Any]


class Reporter:
    """The user's guardian: reports to an aggregator under the user's policy.

    Parameters
    ----------
    server : str
        The aggregator's base URL, e.g. ``https://ldp.example.org``.
    state_dir : path, optional
        Where the secret, pins, ledger and queue live; default
        :func:`client.state.default_state_dir` (``$LDP_CLIENT_HOME`` or the
        XDG state directory).
    policy : Policy, optional
        The limits the device enforces; :class:`client.policy.Policy` defaults.
    session : requests.Session, optional
        For connection reuse and tests; one is created (and closed) otherwise.
    timeout : float or (connect, read)
        Applied to every request.
    clock : callable
        Seconds since the epoch; injectable for tests of the backoff.
    lock_timeout : float
        Seconds to wait for another process holding the state directory's lock.
    """

    def __init__(
        self,
        server: str,
        *,
        state_dir: str | os.PathLike[str] | None = None,
        policy: Policy | None = None,
        session: requests.Session | None = None,
        timeout: float | tuple[float, float] = DEFAULT_TIMEOUT,
        clock: Callable[[], float] = time.time,
        lock_timeout: float = 30.0,
    ):
        self.server = normalize_server_url(server)
        if policy is not None and not isinstance(policy, Policy):
            raise TypeError("policy must be a client.Policy")
        self.policy = policy if policy is not None else Policy()
        self.store = StateStore(
            state_dir if state_dir is not None else default_state_dir(), lock_timeout=lock_timeout
        )
        self.timeout = timeout
        self.clock = clock
        self._session = session
        self._owns_session = session is None

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def session(self) -> requests.Session:
        if self._session is None:
            self._session = requests.Session()
        return self._session

    def close(self) -> None:
        if self._owns_session and self._session is not None:
            self._session.close()
            self._session = None

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _api(self, server: str) -> AggregatorAPI:
        return AggregatorAPI(server, self.session, timeout=self.timeout)

    # -- reporting -----------------------------------------------------------------------------

    def report(self, campaign_id: str, value: Any, *, dry_run: bool = False) -> ReportResult:
        """Perturb ``value`` on the device and send the noisy report.

        ``value`` is a label for ``rr``/``krr`` campaigns and ``{"lat", "lon"}``
        (or a ``(lat, lon)`` pair) for location campaigns. With ``dry_run``
        every check runs and the exact payload is returned, but nothing is
        written (beyond creating the user secret) and nothing is sent; the
        real report carries a fresh ``report_id``.

        Raises
        ------
        ReportError
            The value does not fit the campaign; nothing spent or sent.
        PolicyError
            Refused by the user's policy; nothing spent or sent.
        ServerError
            The server refused, or served something untrustworthy.
        ServerUnavailable
            The server cannot be reached and the campaign was never pinned.
        """
        campaign_id = check_campaign_id(campaign_id)
        prepared = self._prepare(campaign_id, value)
        api = self._api(self.server)
        url = api.reports_url(campaign_id)
        if dry_run:
            state = self.store.read()
            charge, memoized = self._charge(state, prepared)
            spent = state.total_spent + charge
            return self._result(prepared, url, DRY_RUN, charge, memoized, spent)

        now = self.clock()
        with self.store.transaction() as state:
            charge, memoized = self._charge(state, prepared)
            if len(state.queue) >= MAX_QUEUE:
                raise StateError(
                    f"{MAX_QUEUE} reports are already waiting; run `ldp-client flush` first "
                    "(nothing was spent or sent)"
                )
            record = state.campaigns.get(prepared.key)
            if record is None:
                record = CampaignRecord(
                    server=self.server,
                    campaign_id=campaign_id,
                    spec=prepared.spec.to_dict(),
                    spec_hash=prepared.spec.spec_hash,
                    pinned_at=now,
                )
                state.campaigns[prepared.key] = record
            if not memoized:
                record.charges[prepared.tag] = charge
            if prepared.spec.enrollment_required:
                prepared.payload["enrollment_token"] = self._take_token(state, prepared)
            entry = QueuedReport(
                server=self.server,
                campaign_id=campaign_id,
                payload=prepared.payload,
                created_at=now,
                # In flight: not due for another process's flush until this send is over.
                next_attempt_at=now
                + (IN_FLIGHT_S if prepared.online else prepared.offline_retry_after or 0.0),
            )
            state.queue.append(entry)
            spent = state.total_spent

        if not prepared.online:
            return self._result(
                prepared, url, QUEUED, charge, memoized, spent, prepared.offline_reason
            )
        try:
            delivery = api.post_reports(campaign_id, [prepared.payload])
        except ServerUnavailable as exc:
            self._retry_later([entry.report_id], exc)
            return self._result(prepared, url, QUEUED, charge, memoized, spent, exc.message)
        except ServerError as exc:
            self._reject([entry.report_id], exc)
            hint = ""
            if exc.code == "enrollment_refused":
                hint = (
                    f"; the token is spent or was never issued: `ldp-client enroll {campaign_id} "
                    "TOKEN` with another one and report again (the same answer costs no more)"
                )
            raise type(exc)(
                f"{exc.message} (the report was made and its budget spent{hint})",
                status=exc.status,
                field=exc.field,
                code=exc.code,
            ) from exc
        self._remove([entry.report_id])
        outcome = DUPLICATE if delivery.duplicates and not delivery.accepted else DELIVERED
        # The server is reachable: a good moment for reports that are due a retry.
        if any(
            q.next_attempt_at <= now and q.server == self.server for q in self.store.read().queue
        ):
            self.flush(due_only=True, servers=[self.server])
        return self._result(prepared, url, outcome, charge, memoized, spent)

    def _prepare(self, campaign_id: str, value: Any) -> _Prepared:
        key = campaign_key(self.server, campaign_id)
        online, offline_reason, retry_after = True, None, None
        try:
            spec, _meta = self._api(self.server).get_campaign(campaign_id)
        except ServerUnavailable as exc:
            record = self.store.read().campaigns.get(key)
            if record is None:
                raise ServerUnavailable(
                    f"{exc.message}; campaign {campaign_id!r} has never been fetched, so it "
                    "cannot be reported offline (nothing was spent or sent)",
                    retry_after=exc.retry_after,
                ) from exc
            spec = self._pinned_spec(record)
            online, offline_reason = False, f"{exc.message}; reported with the pinned spec"
            retry_after = exc.retry_after

        cost = self.policy.cost(spec)
        if cost > self.policy.max_epsilon * (1 + _SLACK):
            raise EpsilonCapExceeded(
                f"campaign {campaign_id!r} costs epsilon {cost:.4g} per report"
                f"{self._cost_basis(spec)}, above your cap of {self.policy.max_epsilon:.4g}: "
                "refused, nothing was spent or sent",
                field="epsilon",
            )
        extra = self._extra_fields(spec)
        mechanism = Mechanism.from_spec(spec)
        try:
            index = mechanism.encode(value)
        except ReportError as exc:
            raise ReportError(
                f"{exc.message} {self._domain_hint(spec)}; nothing was spent or sent",
                field=exc.field,
                code=exc.code,
            ) from None
        secret = self.store.secret()
        rng = memo_rng(secret, spec.id, spec.spec_hash, index)
        noisy = mechanism.report_value(mechanism.perturb_index(index, rng))
        payload = {"report_id": str(uuid.uuid4()), "value": noisy, "spec_hash": spec.spec_hash}
        payload.update(extra)
        return _Prepared(
            key=key,
            spec=spec,
            online=online,
            offline_reason=offline_reason,
            offline_retry_after=retry_after,
            cost=cost,
            tag=value_tag(secret, spec.id, spec.spec_hash, index),
            payload=payload,
        )

    def _extra_fields(self, spec: CampaignSpec) -> dict[str, Any]:
        """Fields a report carries besides ``report_id``, ``value`` and ``spec_hash``.

        For a campaign that requires enrollment: the next unused token (the one
        a dry run shows; the real report takes whichever is next when it is
        queued). Without one the report is refused before anything is spent.
        """
        if not spec.enrollment_required:
            return {}
        tokens = self.store.read().enrollments.get(campaign_key(self.server, spec.id))
        if not tokens:
            raise ClientError(self._no_token_message(spec.id), code="enrollment_needed")
        return {"enrollment_token": tokens[0]}

    @staticmethod
    def _no_token_message(campaign_id: str) -> str:
        return (
            f"campaign {campaign_id!r} takes reports only with an enrollment token, and none is "
            f"left on this device: get one from the campaign's organiser and run `ldp-client "
            f"enroll {campaign_id} TOKEN` (nothing was spent or sent)"
        )

    def _take_token(self, state: State, prepared: _Prepared) -> str:
        """Spend the next enrollment token of the campaign (inside the state transaction)."""
        tokens = state.enrollments.get(prepared.key)
        if not tokens:
            raise ClientError(self._no_token_message(prepared.spec.id), code="enrollment_needed")
        token = tokens.pop(0)
        if not tokens:
            del state.enrollments[prepared.key]
        return token

    def enroll(self, campaign_id: str, token: str) -> int:
        """Keep an enrollment token for ``campaign_id`` on this server; return how many are kept.

        Each token admits one report. The token is stored as given (it is a
        credential for this campaign, not a secret about the user); no network.
        """
        campaign_id = check_campaign_id(campaign_id)
        if not isinstance(token, str) or not TOKEN_PATTERN.fullmatch(token.strip()):
            raise ValidationError(
                "an enrollment token is 16 to 128 characters of A-Z, a-z, 0-9, '_' or '-'",
                field="token",
                code="invalid_token",
            )
        token = token.strip()
        key = campaign_key(self.server, campaign_id)
        with self.store.transaction() as state:
            tokens = state.enrollments.setdefault(key, [])
            if token not in tokens:
                tokens.append(token)
            return len(tokens)

    def _charge(self, state: State, prepared: _Prepared) -> tuple[float, bool]:
        """(epsilon to charge, whether this value was reported before); raises if refused."""
        record = state.campaigns.get(prepared.key)
        if record is not None and record.spec_hash != prepared.spec.spec_hash:
            raise SpecChanged(
                f"the server now serves a different spec for campaign {record.campaign_id!r} "
                f"(hash {prepared.spec.spec_hash[:12]}..., pinned {record.spec_hash[:12]}... at "
                f"first use): refused, nothing was spent or sent. If you trust the change, "
                f"`ldp-client forget {record.campaign_id}` (weakens longitudinal protection)",
                field="spec_hash",
            )
        if record is not None and prepared.tag in record.charges:
            return 0.0, True
        spent = state.total_spent
        if spent + prepared.cost > self.policy.total_budget * (1 + _SLACK):
            left = max(self.policy.total_budget - spent, 0.0)
            raise BudgetExceeded(
                f"this report would spend epsilon {prepared.cost:.4g}, but only {left:.4g} of your "
                f"budget of {self.policy.total_budget:.4g} is left: refused, nothing was spent "
                "or sent",
                field="epsilon",
            )
        return prepared.cost, False

    def _result(
        self,
        prepared: _Prepared,
        url: str,
        outcome: str,
        charge: float,
        memoized: bool,
        spent: float,
        detail: str | None = None,
    ) -> ReportResult:
        return ReportResult(
            campaign_id=prepared.spec.id,
            server=self.server,
            url=url,
            payload=prepared.payload,
            outcome=outcome,
            charged=charge,
            memoized=memoized,
            total_spent=spent,
            budget_left=max(self.policy.total_budget - spent, 0.0),
            detail=detail,
        )

    @staticmethod
    def _pinned_spec(record: CampaignRecord) -> CampaignSpec:
        try:
            spec = CampaignSpec.from_dict(record.spec)
        except ValueError as exc:
            raise StateError(
                f"the pinned spec of {record.campaign_id!r} is damaged: {exc}"
            ) from exc
        if spec.spec_hash != record.spec_hash:
            raise StateError(f"the pinned spec of {record.campaign_id!r} does not match its hash")
        return spec

    def _cost_basis(self, spec: CampaignSpec) -> str:
        if spec.mechanism != PLANAR_LAPLACE:
            return ""
        return (
            f" (epsilon {spec.epsilon:.4g}/m over {self.policy.location_radius_m:g} m and "
            f"{spec.cell_size_m:g} m cells)"
        )

    @staticmethod
    def _domain_hint(spec: CampaignSpec) -> str:
        if spec.region is not None:
            r = spec.region
            return (
                f"(region: lat {r.lat_min:g} to {r.lat_max:g}, lon {r.lon_min:g} to {r.lon_max:g})"
            )
        labels = spec.domain or ()
        shown = ", ".join(labels[:_LABELS_SHOWN])
        more = f", ... ({len(labels)} labels)" if len(labels) > _LABELS_SHOWN else ""
        return f"(labels: {shown}{more})"

    # -- the queue -----------------------------------------------------------------------------

    def flush(self, *, due_only: bool = False, servers: Iterable[str] | None = None) -> FlushResult:
        """Send queued reports, in batches per campaign, with their original report ids.

        ``due_only`` skips reports whose backoff has not expired (for periodic
        runs); ``servers`` limits the flush to some servers. A server that is
        unavailable is not tried again in the same flush.
        """
        wanted = None if servers is None else {normalize_server_url(s) for s in servers}
        now = self.clock()
        groups: dict[tuple[str, str], list[QueuedReport]] = {}
        for entry in self.store.read().queue:
            if wanted is not None and entry.server not in wanted:
                continue
            if due_only and entry.next_attempt_at > now:
                continue
            groups.setdefault((entry.server, entry.campaign_id), []).append(entry)

        tally = _Tally()
        down: set[str] = set()
        for (server, campaign_id), entries in groups.items():
            if server in down:
                continue
            api = self._api(server)
            for start in range(0, len(entries), MAX_BATCH):
                chunk = entries[start : start + MAX_BATCH]
                tally.attempted += len(chunk)
                try:
                    self._deliver(api, campaign_id, chunk, tally)
                except ServerUnavailable as exc:
                    self._retry_later([e.report_id for e in chunk], exc)
                    tally.errors.append(f"{server}: {exc.message}")
                    down.add(server)
                    break
        return FlushResult(
            attempted=tally.attempted,
            accepted=tally.accepted,
            duplicates=tally.duplicates,
            rejected=tally.rejected,
            errors=tally.errors,
            remaining=len(self.store.read().queue),
        )

    def _deliver(
        self, api: AggregatorAPI, campaign_id: str, chunk: list[QueuedReport], tally: _Tally
    ) -> None:
        """Send a chunk; a chunk the server refuses is sent again one by one to find the culprit."""
        try:
            delivery = api.post_reports(campaign_id, [e.payload for e in chunk])
        except ServerError as exc:
            if len(chunk) > 1:
                for entry in chunk:
                    self._deliver(api, campaign_id, [entry], tally)
                return
            self._reject([chunk[0].report_id], exc)
            tally.rejected.append(
                {"campaign": campaign_id, "report_id": chunk[0].report_id, **exc.to_dict()}
            )
            return
        self._remove([e.report_id for e in chunk])
        tally.accepted += delivery.accepted
        tally.duplicates += delivery.duplicates

    def _remove(self, report_ids: list[str]) -> None:
        gone = set(report_ids)
        with self.store.transaction(durable=False) as state:
            state.queue = [e for e in state.queue if e.report_id not in gone]

    def _retry_later(self, report_ids: list[str], exc: ServerUnavailable) -> None:
        now = self.clock()
        ids = set(report_ids)
        with self.store.transaction(durable=False) as state:
            for entry in state.queue:
                if entry.report_id in ids:
                    entry.attempts += 1
                    entry.next_attempt_at = now + backoff_delay(entry.attempts, exc.retry_after)
                    entry.last_error = exc.message

    def _reject(self, report_ids: list[str], exc: ServerError) -> None:
        now = self.clock()
        ids = set(report_ids)
        error = {**exc.to_dict(), "status": exc.status}
        with self.store.transaction(durable=False) as state:
            keep = []
            for entry in state.queue:
                if entry.report_id in ids:
                    state.rejected.append(
                        RejectedReport(report=entry, error=error, rejected_at=now)
                    )
                else:
                    keep.append(entry)
            state.queue = keep
            del state.rejected[:-MAX_REJECTED_KEPT]

    # -- status and forgetting -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Budget spent and left, per campaign and in total, and the queue; no network."""
        state = self.store.read()
        queued: dict[str, int] = {}
        for entry in state.queue:
            key = campaign_key(entry.server, entry.campaign_id)
            queued[key] = queued.get(key, 0) + 1
        campaigns = []
        for key, record in sorted(state.campaigns.items()):
            spec = self._pinned_spec(record)
            campaigns.append(
                {
                    "campaign": record.campaign_id,
                    "server": record.server,
                    "mechanism": spec.mechanism,
                    "epsilon": spec.epsilon,
                    "cost_per_value": self.policy.cost(spec),
                    "values_reported": len(record.charges),
                    "spent": record.spent,
                    "spec_hash": record.spec_hash,
                    "pinned_at": record.pinned_at,
                    "queued": queued.get(key, 0),
                }
            )
        spent = state.total_spent
        next_attempt = min((e.next_attempt_at for e in state.queue), default=None)
        return {
            "server": self.server,
            "state_dir": str(self.store.directory),
            "policy": self.policy.to_dict(),
            "budget": {
                "total": self.policy.total_budget,
                "spent": spent,
                "left": max(self.policy.total_budget - spent, 0.0),
                "forgotten": state.forgotten_spent,
            },
            "campaigns": campaigns,
            "queue": {
                "pending": len(state.queue),
                "next_attempt_at": next_attempt,
                "last_errors": sorted({e.last_error for e in state.queue if e.last_error}),
            },
            "rejected": [
                {
                    "campaign": r.report.campaign_id,
                    "server": r.report.server,
                    "report_id": r.report.report_id,
                    "error": r.error,
                    "rejected_at": r.rejected_at,
                }
                for r in state.rejected
            ],
        }

    def forget(self, campaign_id: str) -> float:
        """Drop a campaign's pin and its record of reported values; return what it had spent.

        The epsilon already spent stays counted in the total budget (the
        server keeps the reports). Afterwards the campaign is pinned afresh
        at the next report, whatever spec the server then serves, and a value
        reported again is charged again. Queued reports are still delivered.
        """
        campaign_id = check_campaign_id(campaign_id)
        key = campaign_key(self.server, campaign_id)
        with self.store.transaction() as state:
            record = state.campaigns.pop(key, None)
            if record is None:
                raise ClientError(
                    f"campaign {campaign_id!r} on {self.server} is not in the state",
                    field="campaign",
                    code="not_pinned",
                )
            spent = record.spent
            state.forgotten_spent = math.fsum([state.forgotten_spent, spent])
        return spent


def backoff_delay(attempts: int, retry_after: float | None = None) -> float:
    """Seconds before retry number ``attempts + 1``: exponential, capped, with jitter.

    ``BACKOFF_BASE_S * 2**(attempts - 1)``, at most ``BACKOFF_MAX_S``, times a
    factor in [0.5, 1] so that many devices do not retry in step; never less
    than the server's ``Retry-After``.
    """
    exponent = max(attempts - 1, 0)
    delay = BACKOFF_MAX_S if exponent >= 32 else min(BACKOFF_BASE_S * 2.0**exponent, BACKOFF_MAX_S)
    delay *= 0.5 + secrets.randbelow(1 << 20) / (1 << 21)
    return max(delay, retry_after or 0.0)
