"""The on-device reporter: fetch and pin the spec, enforce the policy, perturb, queue, send.

The order of :meth:`Reporter.report` is what makes the guarantees hold:

1. fetch the campaign spec and check it (hash, status); if the server cannot
   be reached, fall back to the spec pinned at first use, or stop;
2. refuse, before anything is spent or sent, a campaign above the
   per-report cap, a value outside the campaign's domain or region, a spec
   that differs from the pinned one, another answer in a period the device
   already reported in, a report that would exceed the budget
   (:mod:`client.ledger`);
3. derive the memoized noisy report and the period's ``report_id``
   (:mod:`client.memo`);
4. in one atomic write of the state (:mod:`client.state`): pin the spec,
   charge the ledger, keep the payload as the campaign's report for the
   period and put it on the queue;
5. send it; take it off the queue when the server acknowledges it (accepted
   or duplicate), keep it queued with a backoff if the server is unavailable,
   move it to the rejected list if the server refuses it for good
   (:mod:`client.outbox`).

A crash between 4 and 5 loses nothing: the next :meth:`Reporter.flush` sends
the queued payload with its original ``report_id``, and the server counts a
report id once however often it arrives.

A campaign counts a device at most once per period (its spec's ``period``:
``once``, ``day`` or ``week``, computed in UTC from :attr:`Reporter.clock`).
The same answer again within the period is the period's report again: sent
again, same ``report_id``, while it waits on the device, and not sent at all
once the server has acknowledged it. Another answer within the period is
refused (:class:`client.errors.AlreadyReported`). A new period makes a new
report with a new ``report_id``; its noisy value is still memoized per true
value, so an unchanged answer costs no budget.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import requests

from client.errors import ClientError, ServerError, ServerUnavailable
from client.ledger import Charge, Ledger, pinned_spec
from client.memo import memo_rng, report_id, value_tag
from client.outbox import IN_FLIGHT_S, FlushResult, Outbox
from client.policy import Policy
from client.state import (
    PeriodReport,
    QueuedReport,
    State,
    StateStore,
    campaign_key,
    default_state_dir,
)
from client.transport import DEFAULT_TIMEOUT, AggregatorAPI, check_campaign_id, normalize_server_url
from shared.errors import ReportError, ValidationError
from shared.mechanisms import Geometric, Mechanism
from shared.periods import ONCE, period_key
from shared.spec import CampaignSpec

# Enrollment tokens as the aggregator accepts them.
TOKEN_PATTERN = re.compile(r"[A-Za-z0-9_-]{16,128}")
_LABELS_SHOWN = 20
# An integer as typed: optional sign, decimal digits (at most 13: the spec's bounds are +-10^12).
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]{1,13}")

DELIVERED = "delivered"
DUPLICATE = "duplicate"
QUEUED = "queued"
DRY_RUN = "dry_run"
ALREADY_REPORTED = "already_reported"


@dataclass(frozen=True)
class ReportResult:
    """What :meth:`Reporter.report` did. It holds the noisy payload, never the true value.

    ``outcome`` is ``"delivered"``, ``"duplicate"`` (the server had it
    already), ``"queued"`` (kept on disk; ``detail`` says why),
    ``"already_reported"`` (the same answer in a period whose report the
    server has acknowledged: nothing sent) or ``"dry_run"`` (nothing written,
    nothing sent). ``period`` is the campaign's (``once``, ``day``, ``week``)
    and ``period_key`` the current one's key (``once``, ``2025-01-15``,
    ``2025-W03``); ``repeat`` says the payload is the report this device had
    already made in the period, with the same answer.
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
    period: str = ONCE
    period_key: str = ONCE
    repeat: bool = False

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
            "period": self.period,
            "period_key": self.period_key,
            "repeat": self.repeat,
        }


@dataclass
class _Prepared:
    key: str
    spec: CampaignSpec
    online: bool
    offline_reason: str | None
    offline_retry_after: float | None
    cost: float
    tag: str
    period_key: str
    payload: dict[str, Any]


class Reporter:
    """The user's guardian: reports to an aggregator under the user's policy.

    It ties the parts together: the transport (:mod:`client.transport`), the
    ledger that keeps the budget (:mod:`client.ledger`), the memoized noise
    (:mod:`client.memo`) and the outbox that delivers (:mod:`client.outbox`),
    all over one state directory (:mod:`client.state`).

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
        Seconds since the epoch: the backoff's, and the reporting period's (in UTC);
        injectable for tests.
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
        self.ledger = Ledger(self.policy)
        self.outbox = Outbox(self.store, self._api, clock)
        self._session = session
        self._owns_session = session is None

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def session(self) -> requests.Session:
        """The HTTP session (created on first use unless one was given)."""
        if self._session is None:
            self._session = requests.Session()
        return self._session

    def close(self) -> None:
        """Close the HTTP session if this reporter created it."""
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

        ``value`` is a label for ``rr``/``krr`` campaigns (and ``olh`` or
        ``hadamard_response`` ones with a domain of labels), an integer of the
        range (or its decimal text, as typed on a command line) for ``geometric``
        ones and of ``0 .. domain_size - 1`` for ``olh`` or ``hadamard_response``
        ones with a domain size, and ``{"lat", "lon"}`` (or a ``(lat, lon)`` pair)
        for location campaigns: ``planar_laplace`` and ``exponential_grid``, and
        ``krr``, ``olh`` or ``hadamard_response`` over a region's cells, whose
        location is snapped to its cell on the device before the mechanism runs.
        With ``dry_run`` every check runs and the exact payload is returned, but
        nothing is written (beyond creating the user secret) and nothing is sent.

        The campaign counts this device once per period: the same answer again
        in the period is the period's report again (``repeat``), sent again with
        its ``report_id`` only while it waits on the device; once the server has
        acknowledged it the outcome is ``"already_reported"`` and nothing is sent.

        Raises
        ------
        ReportError
            The value does not fit the campaign; nothing spent or sent.
        PolicyError
            Refused by the user's policy; nothing spent or sent.
        AlreadyReported
            Another answer in a period this device already reported in; nothing
            spent or sent.
        ServerError
            The server refused, or served something untrustworthy.
        ServerUnavailable
            The server cannot be reached and the campaign was never pinned.
        """
        campaign_id = check_campaign_id(campaign_id)
        now = self.clock()
        prepared = self._prepare(campaign_id, value, now)
        url = self._api(self.server).reports_url(campaign_id)
        if dry_run:
            state = self.store.read()
            charge = self._charge(state, prepared)
            detail = None
            if charge.repeat is not None:
                prepared.payload = dict(charge.repeat.payload)
                if self._waiting(state, charge.repeat) is None:
                    detail = "the server has it, so a real report sends nothing"
                else:
                    detail = "it still waits on this device, so a real report sends it again"
            elif prepared.spec.enrollment_required:
                prepared.payload["enrollment_token"] = self._next_token(state, prepared)
            spent = state.total_spent + charge.epsilon
            return self._result(prepared, url, DRY_RUN, charge, spent, detail)

        entry: QueuedReport | None
        sending = prepared.online
        detail = prepared.offline_reason
        with self.store.transaction() as state:
            charge = self._charge(state, prepared)
            if charge.repeat is not None:
                # The period's report again: no new report, no new id.
                prepared.payload = dict(charge.repeat.payload)
                entry = self._waiting(state, charge.repeat)
                if entry is not None and sending:
                    if entry.next_attempt_at > now:
                        sending = False  # another process sends it, or the server asked to wait
                        detail = f"its next attempt is due at {_utc_text(entry.next_attempt_at)}"
                    else:
                        entry.next_attempt_at = now + IN_FLIGHT_S
            else:
                if prepared.spec.enrollment_required:
                    prepared.payload["enrollment_token"] = self._take_token(state, prepared)
                # Pay and queue in one write: a crash after it loses nothing, before it spends
                # nothing.
                self.ledger.record(
                    state,
                    prepared.key,
                    self.server,
                    prepared.spec,
                    charge,
                    now,
                    PeriodReport(prepared.period_key, prepared.tag, dict(prepared.payload)),
                )
                entry = self.outbox.put(
                    state,
                    self.server,
                    campaign_id,
                    prepared.payload,
                    now=now,
                    sending=sending,
                    retry_after=prepared.offline_retry_after,
                )
            spent = state.total_spent

        if entry is None:
            if prepared.online and self.outbox.has_due(self.server, now):
                self.flush(due_only=True, servers=[self.server])  # the server is reachable
            return self._result(prepared, url, ALREADY_REPORTED, charge, spent)
        if not sending:
            return self._result(prepared, url, QUEUED, charge, spent, detail)
        try:
            delivery = self.outbox.send(entry)
        except ServerUnavailable as exc:
            return self._result(prepared, url, QUEUED, charge, spent, exc.message)
        except ServerError as exc:
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
        outcome = DUPLICATE if delivery.duplicates and not delivery.accepted else DELIVERED
        # The server is reachable: a good moment for reports that are due a retry.
        if self.outbox.has_due(self.server, now):
            self.flush(due_only=True, servers=[self.server])
        return self._result(prepared, url, outcome, charge, spent)

    def _waiting(self, state: State, reported: PeriodReport) -> QueuedReport | None:
        """The queued entry of a period's report, or None once the server acknowledged it."""
        for entry in state.queue:
            if entry.server == self.server and entry.report_id == reported.report_id:
                return entry
        return None

    def _prepare(self, campaign_id: str, value: Any, now: float) -> _Prepared:
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
            spec = pinned_spec(record)
            online, offline_reason = False, f"{exc.message}; reported with the pinned spec"
            retry_after = exc.retry_after

        cost = self.ledger.cost(spec)
        mechanism = Mechanism.from_spec(spec)
        integers = isinstance(mechanism, Geometric) or spec.domain_size is not None
        if integers and isinstance(value, str):
            value = _integer_text(value)
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
        period = period_key(spec.period, now)
        payload = {
            "report_id": report_id(secret, spec.id, spec.spec_hash, period),
            "value": noisy,
            "spec_hash": spec.spec_hash,
        }
        return _Prepared(
            key=key,
            spec=spec,
            online=online,
            offline_reason=offline_reason,
            offline_retry_after=retry_after,
            cost=cost,
            tag=value_tag(secret, spec.id, spec.spec_hash, index),
            period_key=period,
            payload=payload,
        )

    def _charge(self, state: State, prepared: _Prepared) -> Charge:
        return self.ledger.charge(
            state, prepared.key, prepared.spec, prepared.tag, prepared.cost, prepared.period_key
        )

    def _result(
        self,
        prepared: _Prepared,
        url: str,
        outcome: str,
        charge: Charge,
        spent: float,
        detail: str | None = None,
    ) -> ReportResult:
        return ReportResult(
            campaign_id=prepared.spec.id,
            server=self.server,
            url=url,
            payload=prepared.payload,
            outcome=outcome,
            charged=charge.epsilon,
            memoized=charge.memoized,
            total_spent=spent,
            budget_left=self.ledger.left(spent),
            detail=detail,
            period=prepared.spec.period,
            period_key=prepared.period_key,
            repeat=charge.repeat is not None,
        )

    @staticmethod
    def _domain_hint(spec: CampaignSpec) -> str:
        if spec.region is not None:
            r = spec.region
            return (
                f"(region: lat {r.lat_min:g} to {r.lat_max:g}, lon {r.lon_min:g} to {r.lon_max:g})"
            )
        if spec.lo is not None:
            return f"(range: the integers {spec.lo} to {spec.hi})"
        if spec.domain_size is not None:
            return f"(values: the integers 0 to {spec.domain_size - 1})"
        labels = spec.domain or ()
        shown = ", ".join(labels[:_LABELS_SHOWN])
        more = f", ... ({len(labels)} labels)" if len(labels) > _LABELS_SHOWN else ""
        return f"(labels: {shown}{more})"

    # -- enrollment ----------------------------------------------------------------------------

    def _next_token(self, state: State, prepared: _Prepared) -> str:
        """The enrollment token a new report would carry (a dry run shows it); none is refused.

        The real report takes whichever is next when it is queued (:meth:`_take_token`).
        """
        tokens = state.enrollments.get(prepared.key)
        if not tokens:
            raise ClientError(self._no_token_message(prepared.spec.id), code="enrollment_needed")
        return tokens[0]

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

    # -- the queue -----------------------------------------------------------------------------

    def flush(self, *, due_only: bool = False, servers: Iterable[str] | None = None) -> FlushResult:
        """Send queued reports, in batches per campaign, with their original report ids.

        ``due_only`` skips reports whose backoff has not expired (for periodic
        runs); ``servers`` limits the flush to some servers. A server that is
        unavailable is not tried again in the same flush. See :meth:`Outbox.flush`.
        """
        return self.outbox.flush(due_only=due_only, servers=servers)

    # -- status and forgetting -----------------------------------------------------------------

    def status(self) -> dict[str, Any]:
        """Budget spent and left, per campaign and in total, and the queue; no network."""
        state = self.store.read()
        queued: dict[str, int] = {}
        for entry in state.queue:
            key = campaign_key(entry.server, entry.campaign_id)
            queued[key] = queued.get(key, 0) + 1
        campaigns = [
            {**row, "queued": queued.get(campaign_key(row["server"], row["campaign"]), 0)}
            for row in self.ledger.campaigns(state)
        ]
        return {
            "server": self.server,
            "state_dir": str(self.store.directory),
            "policy": self.policy.to_dict(),
            "budget": self.ledger.budget(state),
            "campaigns": campaigns,
            "queue": self.outbox.summary(state),
            "rejected": self.outbox.rejected(state),
        }

    def forget(self, campaign_id: str) -> float:
        """Drop a campaign's pin and its record of reported values; return what it had spent.

        The epsilon already spent stays counted in the total budget (the
        server keeps the reports). Afterwards the campaign is pinned afresh
        at the next report, whatever spec the server then serves, and a value
        reported again is charged again. The record of the period's report goes
        too: the next report is a new one, but under the same spec it carries
        the same ``report_id`` in the same period, so the server still counts it
        once. Queued reports are still delivered.
        """
        campaign_id = check_campaign_id(campaign_id)
        key = campaign_key(self.server, campaign_id)
        with self.store.transaction() as state:
            return self.ledger.forget(state, key, self.server, campaign_id)


def _integer_text(value: str) -> int | str:
    """``value`` as an integer when it is one written in decimal, else unchanged (and refused
    by the mechanism, which names the field without repeating the value)."""
    text = value.strip()
    return int(text) if _INTEGER_TEXT.fullmatch(text) else value


def _utc_text(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(timestamp))
