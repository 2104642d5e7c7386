"""The outbox: noisy reports waiting on the device, and their delivery with retries.

A report enters the queue (:meth:`Outbox.put`) in the same state transaction that pays for it
(:mod:`client.ledger`), exactly as it will be sent and with its ``report_id``. Then:

- the server acknowledges it (accepted, or a duplicate of a report id it has): it leaves the
  queue;
- the server cannot be reached, is overloaded or answers unreadably: it stays queued, and its
  next attempt waits an exponential backoff with jitter (:func:`backoff_delay`), never less
  than the server's ``Retry-After``;
- the server refuses it for good (a closed campaign, say): it moves to the rejected list, kept
  for the record (the last :data:`MAX_REJECTED_KEPT`). If it was its campaign's report for
  the period, the campaign no longer holds it as such: the server did not count it, so the
  device may report in that period again (with another enrollment token, say).

A report being sent by one process is not due for another process's periodic flush for
:data:`IN_FLIGHT_S`; a process that dies while sending leaves the report queued, and a later
flush sends it again with the same ``report_id``, which the server counts once.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from client.errors import ServerError, ServerUnavailable, StateError
from client.state import QueuedReport, RejectedReport, State, StateStore, campaign_key
from client.transport import AggregatorAPI, Delivery, normalize_server_url

MAX_QUEUE = 10_000
MAX_REJECTED_KEPT = 1_000
MAX_BATCH = 100
BACKOFF_BASE_S = 30.0
BACKOFF_MAX_S = 6 * 3600.0
# A report being sent is not due for a periodic flush (another process's) before this.
IN_FLIGHT_S = 60.0


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


class Outbox:
    """The queue in the state directory, and the delivery of what it holds.

    Parameters
    ----------
    store : StateStore
        The state directory that holds the queue.
    api_for : callable
        The :class:`client.transport.AggregatorAPI` for a server's base URL.
    clock : callable
        Seconds since the epoch.
    """

    def __init__(
        self,
        store: StateStore,
        api_for: Callable[[str], AggregatorAPI],
        clock: Callable[[], float],
    ):
        self.store = store
        self.api_for = api_for
        self.clock = clock

    @staticmethod
    def put(
        state: State,
        server: str,
        campaign_id: str,
        payload: dict[str, Any],
        *,
        now: float,
        sending: bool,
        retry_after: float | None = None,
    ) -> QueuedReport:
        """Queue ``payload`` inside the caller's transaction and return its entry.

        ``sending`` marks a report this process sends at once: it is in flight, not due for
        another flush, for :data:`IN_FLIGHT_S`. Otherwise it is due after ``retry_after``
        seconds (the server's ``Retry-After``), or at once.

        Raises
        ------
        StateError
            :data:`MAX_QUEUE` reports are already waiting.
        """
        if len(state.queue) >= MAX_QUEUE:
            raise StateError(
                f"{MAX_QUEUE} reports are already waiting; run `ldp-client flush` first "
                "(nothing was spent or sent)"
            )
        entry = QueuedReport(
            server=server,
            campaign_id=campaign_id,
            payload=payload,
            created_at=now,
            next_attempt_at=now + (IN_FLIGHT_S if sending else retry_after or 0.0),
        )
        state.queue.append(entry)
        return entry

    def send(self, entry: QueuedReport) -> Delivery:
        """Send one queued report now, and settle its place in the queue by the answer.

        Raises
        ------
        ServerUnavailable
            It stays queued with a backoff.
        ServerError
            It moved to the rejected list.
        """
        api = self.api_for(entry.server)
        try:
            delivery = api.post_reports(entry.campaign_id, [entry.payload])
        except ServerUnavailable as exc:
            self._retry_later([entry.report_id], exc)
            raise
        except ServerError as exc:
            self._reject([entry.report_id], exc)
            raise
        self._remove([entry.report_id])
        return delivery

    def has_due(self, server: str, now: float) -> bool:
        """Whether a report for ``server`` is due an attempt at ``now``."""
        return any(q.next_attempt_at <= now and q.server == server for q in self.store.read().queue)

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
            api = self.api_for(server)
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

    @staticmethod
    def summary(state: State) -> dict[str, Any]:
        """The queue as ``status`` shows it: how many wait, the next attempt, the last errors."""
        return {
            "pending": len(state.queue),
            "next_attempt_at": min((e.next_attempt_at for e in state.queue), default=None),
            "last_errors": sorted({e.last_error for e in state.queue if e.last_error}),
        }

    @staticmethod
    def rejected(state: State) -> list[dict[str, Any]]:
        """The reports the servers refused for good, oldest first, with the servers' errors."""
        return [
            {
                "campaign": r.report.campaign_id,
                "server": r.report.server,
                "report_id": r.report.report_id,
                "error": r.error,
                "rejected_at": r.rejected_at,
            }
            for r in state.rejected
        ]

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
                    # Not counted by the server: no longer the campaign's report for the period.
                    record = state.campaigns.get(campaign_key(entry.server, entry.campaign_id))
                    reported = None if record is None else record.period_report
                    if (
                        record is not None
                        and reported is not None
                        and reported.payload == entry.payload
                    ):
                        record.period_report = None
                else:
                    keep.append(entry)
            state.queue = keep
            del state.rejected[:-MAX_REJECTED_KEPT]


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
