"""The outbox's own contract: queueing, settling by the server's answer, batches, backoff."""

from __future__ import annotations

import statistics

import pytest

from client import CampaignClosed, ServerRejected, ServerUnavailable, StateError
from client import outbox as outbox_module
from client.outbox import (
    BACKOFF_BASE_S,
    BACKOFF_MAX_S,
    IN_FLIGHT_S,
    MAX_BATCH,
    Outbox,
    backoff_delay,
)
from client.state import StateStore
from client.transport import Delivery

NOW = 1_000_000.0
A, B = "http://a.test", "http://b.test"


class ScriptedAPI:
    """Answers ``post_reports`` as told: ``down``, or refusing some report ids."""

    def __init__(self) -> None:
        self.down = False
        self.refused: set[str] = set()
        self.calls: list[tuple[str, list[str]]] = []

    def post_reports(self, campaign_id: str, payloads: list[dict]) -> Delivery:
        ids = [p["report_id"] for p in payloads]
        self.calls.append((campaign_id, ids))
        if self.down:
            raise ServerUnavailable("connection refused", retry_after=None)
        if self.refused & set(ids):
            raise ServerRejected("bad report", status=422, code="invalid_report")
        return Delivery(accepted=len(ids), duplicates=0)


@pytest.fixture
def apis():
    return {A: ScriptedAPI(), B: ScriptedAPI()}


@pytest.fixture
def outbox(tmp_path, apis):
    return Outbox(StateStore(tmp_path / "state"), apis.__getitem__, lambda: NOW)


def fill(outbox: Outbox, server: str, campaign: str, n: int, *, sending: bool = False) -> list:
    """Queue ``n`` reports with ids ``{campaign}-{i}`` (``{campaign}-{i}@b`` on server ``B``)."""
    suffix = "@b" if server == B else ""
    with outbox.store.transaction() as state:
        return [
            outbox.put(
                state,
                server,
                campaign,
                {"report_id": f"{campaign}-{i}{suffix}"},
                now=NOW,
                sending=sending,
            )
            for i in range(n)
        ]


def queued_ids(outbox: Outbox) -> list[str]:
    return [e.report_id for e in outbox.store.read().queue]


def test_put_marks_a_report_in_flight_or_due_after_retry_after(outbox):
    with outbox.store.transaction() as state:
        sending = outbox.put(state, A, "c", {"report_id": "x"}, now=NOW, sending=True)
        waiting = outbox.put(
            state, A, "c", {"report_id": "y"}, now=NOW, sending=False, retry_after=120.0
        )
        due = outbox.put(state, A, "c", {"report_id": "z"}, now=NOW, sending=False)
    assert sending.next_attempt_at == NOW + IN_FLIGHT_S
    assert waiting.next_attempt_at == NOW + 120.0 and due.next_attempt_at == NOW
    assert queued_ids(outbox) == ["x", "y", "z"]
    assert outbox.has_due(A, NOW) and not outbox.has_due(B, NOW)


def test_a_full_queue_takes_nothing_more(outbox, monkeypatch):
    monkeypatch.setattr(outbox_module, "MAX_QUEUE", 2)
    fill(outbox, A, "c", 2)
    with pytest.raises(StateError, match="2 reports are already waiting"):
        fill(outbox, A, "d", 1)
    assert queued_ids(outbox) == ["c-0", "c-1"]


def test_send_settles_the_report_by_the_answer(outbox, apis):
    first, second, third = fill(outbox, A, "c", 3, sending=True)
    assert outbox.send(first) == Delivery(accepted=1, duplicates=0)
    assert queued_ids(outbox) == ["c-1", "c-2"]

    apis[A].down = True
    with pytest.raises(ServerUnavailable):
        outbox.send(second)
    kept = outbox.store.read().queue[0]
    assert (kept.report_id, kept.attempts, kept.last_error) == ("c-1", 1, "connection refused")
    assert NOW + BACKOFF_BASE_S / 2 <= kept.next_attempt_at <= NOW + BACKOFF_BASE_S

    apis[A].down = False
    apis[A].refused.add("c-2")
    with pytest.raises(ServerRejected):
        outbox.send(third)
    state = outbox.store.read()
    assert [e.report_id for e in state.queue] == ["c-1"]
    [rejected] = outbox.rejected(state)
    assert rejected["report_id"] == "c-2" and rejected["error"]["status"] == 422


def test_flush_sends_batches_per_campaign_and_finds_the_refused_one(outbox, apis):
    fill(outbox, A, "c", MAX_BATCH + 1)
    fill(outbox, A, "d", 2)
    apis[A].refused.add("d-1")
    result = outbox.flush()
    assert [(campaign, len(ids)) for campaign, ids in apis[A].calls] == [
        ("c", MAX_BATCH),
        ("c", 1),
        ("d", 2),  # refused as a batch, then sent one by one
        ("d", 1),
        ("d", 1),
    ]
    assert (result.attempted, result.accepted, result.remaining) == (
        MAX_BATCH + 3,
        MAX_BATCH + 2,
        0,
    )
    assert [r["report_id"] for r in result.rejected] == ["d-1"]


def test_a_server_that_is_down_is_tried_once_per_flush(outbox, apis):
    fill(outbox, A, "c", 1)
    fill(outbox, A, "d", 1)
    fill(outbox, B, "c", 1)
    apis[A].down = True
    result = outbox.flush()
    assert len(apis[A].calls) == 1 and len(apis[B].calls) == 1
    assert result.errors == [f"{A}: connection refused"] and result.remaining == 2
    summary = outbox.summary(outbox.store.read())
    assert summary["pending"] == 2 and summary["last_errors"] == ["connection refused"]


def test_flush_can_be_limited_to_due_reports_and_to_servers(outbox, apis):
    fill(outbox, A, "c", 1, sending=True)  # in flight: not due
    fill(outbox, B, "c", 1)
    assert outbox.flush(due_only=True, servers=[A + "/"]).attempted == 0
    assert outbox.flush(due_only=True).attempted == 1 and apis[B].calls
    assert outbox.flush().accepted == 1


def test_only_the_latest_rejected_reports_are_kept(outbox, apis, monkeypatch):
    monkeypatch.setattr(outbox_module, "MAX_REJECTED_KEPT", 2)
    fill(outbox, A, "c", 3)
    apis[A].refused.update({"c-0", "c-1", "c-2"})
    outbox.flush()
    assert [r["report_id"] for r in outbox.rejected(outbox.store.read())] == ["c-1", "c-2"]


def test_a_closed_campaign_is_kept_with_its_code(outbox, apis):
    [entry] = fill(outbox, A, "c", 1)

    def closed(campaign_id, payloads):
        raise CampaignClosed("campaign 'c' is closed", status=409)

    apis[A].post_reports = closed
    with pytest.raises(CampaignClosed):
        outbox.send(entry)
    [rejected] = outbox.rejected(outbox.store.read())
    assert rejected["error"]["code"] == "campaign_closed"


def test_backoff_doubles_with_jitter_is_capped_and_honours_retry_after():
    for attempts in (1, 2, 5):
        full = BACKOFF_BASE_S * 2 ** (attempts - 1)
        delays = [backoff_delay(attempts) for _ in range(200)]
        assert all(full / 2 <= d <= full for d in delays)
        # Jitter spreads the devices out: not all in step (a fixed factor would fail this).
        assert statistics.pstdev(delays) > full / 50
    assert all(BACKOFF_MAX_S / 2 <= backoff_delay(n) <= BACKOFF_MAX_S for n in (20, 40, 10**6))
    assert backoff_delay(1, retry_after=3600.0) == 3600.0
    assert backoff_delay(0) <= BACKOFF_BASE_S
