"""The Reporter against an in-process fake aggregator: policy, memoization, queue, bad servers."""

from __future__ import annotations

import json
import math
import uuid

import pytest
from client_fakes import DAILY_SPEC, KRR_SPEC, PLANAR_SPEC, SERVER, Crash

from client import (
    AlreadyReported,
    BudgetExceeded,
    CampaignClosed,
    CampaignNotFound,
    ClientError,
    EpsilonCapExceeded,
    Policy,
    ServerRejected,
    ServerUnavailable,
    SpecChanged,
    UntrustedSpec,
)
from client.memo import report_id
from client.outbox import BACKOFF_BASE_S, IN_FLIGHT_S
from client.state import STATE_FILE, StateStore
from shared.errors import ReportError
from shared.mechanisms import Mechanism
from shared.spec import CampaignSpec


def state_json(state_dir) -> dict:
    return json.loads((state_dir / STATE_FILE).read_text())


def state_bytes(state_dir) -> bytes | None:
    path = state_dir / STATE_FILE
    return path.read_bytes() if path.exists() else None


# -- the happy path ------------------------------------------------------------------------


def test_report_sends_only_a_valid_noisy_report(fake, make_reporter):
    result = make_reporter().report("fruit", "banana")
    assert result.outcome == "delivered"
    [body] = fake.posts()
    assert set(body) == {"report_id", "value", "spec_hash"}
    assert str(uuid.UUID(body["report_id"])) == body["report_id"]
    assert body["spec_hash"] == CampaignSpec.from_dict(KRR_SPEC).spec_hash
    assert body["value"] in KRR_SPEC["domain"]
    assert result.payload == body
    assert fake.count("fruit") == 1
    assert result.charged == KRR_SPEC["epsilon"] and not result.memoized


def test_same_value_twice_in_a_period_is_one_report_and_spends_once(fake, make_reporter):
    """A campaign counts a device once per period (``once``: its whole life)."""
    first = make_reporter().report("fruit", "cherry")
    second = make_reporter().report("fruit", "cherry")
    assert (first.outcome, second.outcome) == ("delivered", "already_reported")
    assert (first.repeat, second.repeat) == (False, True)
    assert second.payload == first.payload
    assert second.memoized and second.charged == 0
    assert second.total_spent == first.total_spent == KRR_SPEC["epsilon"]
    # The server has it: the repeat sends nothing, and the device is counted once.
    assert len(fake.posts()) == 1 and fake.count("fruit") == 1


def test_a_new_period_sends_a_new_report_with_the_memoized_value(fake, make_reporter, clock):
    reporter = make_reporter(clock=clock)
    monday = reporter.report("daily", "cherry")
    again = reporter.report("daily", "cherry")
    clock.next_day()
    tuesday = reporter.report("daily", "cherry")
    assert (monday.period_key, tuesday.period_key) == ("2025-01-15", "2025-01-16")
    assert again.repeat and again.payload == monday.payload
    assert not tuesday.repeat and tuesday.outcome == "delivered"
    assert tuesday.payload["report_id"] != monday.payload["report_id"]
    assert tuesday.payload["value"] == monday.payload["value"]
    assert tuesday.memoized and tuesday.charged == 0 and tuesday.total_spent == 1.0
    assert fake.count("daily") == 2


def test_the_report_id_is_derived_from_the_secret_and_the_period(make_reporter, state_dir, clock):
    spec = CampaignSpec.from_dict(DAILY_SPEC)
    result = make_reporter(clock=clock).report("daily", "apple")
    secret = StateStore(state_dir).secret()
    assert result.payload["report_id"] == report_id(secret, "daily", spec.spec_hash, "2025-01-15")
    assert str(uuid.UUID(result.payload["report_id"])) == result.payload["report_id"]


def test_another_answer_in_the_period_is_refused_and_nothing_is_spent_or_sent(
    fake, make_reporter, state_dir, clock
):
    reporter = make_reporter(clock=clock)
    reporter.report("fruit", "apple")
    reporter.report("daily", "apple")
    before = state_bytes(state_dir)
    with pytest.raises(AlreadyReported, match="a changed answer is not sent") as info:
        reporter.report("fruit", "banana")
    assert "nothing was spent or sent" in str(info.value) and "banana" not in str(info.value)
    with pytest.raises(AlreadyReported, match="from 2025-01-16 00:00 UTC"):
        reporter.report("daily", "banana")
    with pytest.raises(AlreadyReported):
        reporter.report("daily", "banana", dry_run=True)
    assert state_bytes(state_dir) == before
    assert (fake.count("fruit"), fake.count("daily"), len(fake.posts())) == (1, 1, 2)
    clock.next_day()
    assert reporter.report("daily", "banana").charged == KRR_SPEC["epsilon"]
    assert fake.count("daily") == 2


def test_every_value_keeps_its_own_report(make_reporter, clock):
    """Fresh noise would make some of these repeats differ (each differs with p > 0.5)."""
    reporter = make_reporter(Policy(total_budget=4.0), clock=clock)
    for label in KRR_SPEC["domain"]:
        values = set()
        for _ in range(6):
            clock.next_day()
            values.add(reporter.report("daily", label).payload["value"])
        assert len(values) == 1


def test_a_new_value_spends_again(make_reporter, clock):
    reporter = make_reporter(clock=clock)
    reporter.report("daily", "apple")
    clock.next_day()
    result = reporter.report("daily", "durian")
    assert result.charged == KRR_SPEC["epsilon"] and not result.memoized
    assert result.total_spent == pytest.approx(2 * KRR_SPEC["epsilon"])
    assert reporter.status()["campaigns"][0]["values_reported"] == 2


def test_locations_are_memoized_on_the_true_cell(fake, make_reporter):
    spec = CampaignSpec.from_dict(PLANAR_SPEC)
    reporter = make_reporter()
    a = reporter.report("where", {"lat": 48.1201, "lon": 11.5501})
    # Another point of the same cell: same report, no new spending.
    grid = spec.grid
    index = grid.cell_of(48.1201, 11.5501)
    lat, lon = grid.centre(index)
    assert grid.cell_of(lat, lon) == index
    b = reporter.report("where", (lat, lon))
    assert b.payload["value"] == a.payload["value"] and b.memoized and b.charged == 0
    assert b.repeat and b.payload == a.payload  # the same answer: the same report
    assert Mechanism.from_spec(spec).parse_report_value(a.payload["value"]) >= 0
    assert fake.count("where") == 1


def test_the_state_never_holds_the_true_value(make_reporter, state_dir):
    make_reporter().report("where", {"lat": 48.123456789, "lon": 11.587654321})
    make_reporter().report("fruit", "banana")
    text = "".join(p.read_text(errors="replace") for p in state_dir.iterdir() if p.is_file())
    assert "48.123456789" not in text and "11.587654321" not in text
    state = state_json(state_dir)
    for record in state["campaigns"].values():
        record.pop("spec")  # the campaign's own labels, not the user's answer
        record["period_report"].pop("payload")  # the noisy report, as sent
    for entry in state["queue"]:
        entry.pop("payload")
    assert "banana" not in json.dumps(state)


def test_dry_run_shows_the_payload_and_writes_or_sends_nothing(fake, make_reporter, state_dir):
    reporter = make_reporter()
    dry = reporter.report("fruit", "apple", dry_run=True)
    assert dry.outcome == "dry_run" and dry.charged == KRR_SPEC["epsilon"] and not dry.repeat
    assert fake.posts() == [] and state_bytes(state_dir) is None
    real = reporter.report("fruit", "apple")
    assert real.payload == dry.payload  # the report id too: the period's
    again = reporter.report("fruit", "apple", dry_run=True)
    assert again.repeat and again.payload == real.payload and again.charged == 0
    assert again.detail == "the server has it, so a real report sends nothing"
    assert len(fake.posts()) == 1


# -- the policy ----------------------------------------------------------------------------


def test_a_campaign_above_the_cap_is_refused_before_anything_happens(
    fake, make_reporter, state_dir
):
    reporter = make_reporter(Policy(max_epsilon=0.9))
    with pytest.raises(EpsilonCapExceeded, match="above your cap"):
        reporter.report("fruit", "apple")
    assert fake.posts() == [] and state_bytes(state_dir) is None


def test_location_cost_uses_the_policy_radius(make_reporter):
    spec = CampaignSpec.from_dict(PLANAR_SPEC)
    policy = Policy(location_radius_m=200.0)
    with pytest.raises(EpsilonCapExceeded):
        make_reporter(Policy(max_epsilon=policy.cost(spec) * 0.99)).report(
            "where", {"lat": 48.12, "lon": 11.55}
        )
    result = make_reporter(policy).report("where", {"lat": 48.12, "lon": 11.55})
    assert result.charged == pytest.approx(policy.cost(spec))


def test_over_budget_is_refused_and_nothing_is_spent_or_sent(fake, make_reporter, state_dir, clock):
    reporter = make_reporter(Policy(total_budget=1.5), clock=clock)
    reporter.report("daily", "apple")
    clock.next_day()
    before = state_bytes(state_dir)
    with pytest.raises(BudgetExceeded, match=r"0\.5 of your budget"):
        reporter.report("daily", "banana")
    assert state_bytes(state_dir) == before
    assert fake.count("daily") == 1
    # A memoized answer costs nothing, so it is still allowed.
    assert reporter.report("daily", "apple").memoized
    # And a cheaper campaign that fits is allowed.
    assert reporter.report("smoker", "yes").charged == 0.5


def test_budget_exactly_used_up_is_allowed(make_reporter, clock):
    reporter = make_reporter(Policy(total_budget=2.0), clock=clock)
    reporter.report("fruit", "apple")
    assert reporter.report("daily", "banana").budget_left == 0
    with pytest.raises(BudgetExceeded):
        reporter.report("smoker", "no")


def test_a_changed_spec_is_refused(fake, make_reporter, state_dir):
    make_reporter().report("fruit", "apple")
    before = state_bytes(state_dir)
    fake.add({**KRR_SPEC, "epsilon": 5.0})
    with pytest.raises(SpecChanged, match="different spec"):
        make_reporter(Policy(max_epsilon=10)).report("fruit", "apple")
    fake.add({**KRR_SPEC, "title": "Same campaign, another title"})
    with pytest.raises(SpecChanged):
        make_reporter().report("fruit", "banana")
    assert state_bytes(state_dir) == before
    assert fake.count("fruit") == 1


def test_forget_unpins_but_keeps_the_spending(fake, make_reporter):
    reporter = make_reporter()
    reporter.report("fruit", "apple")
    fake.add({**KRR_SPEC, "title": "Renamed"})
    assert reporter.forget("fruit") == KRR_SPEC["epsilon"]
    result = reporter.report("fruit", "apple")
    assert not result.memoized and result.total_spent == pytest.approx(2 * KRR_SPEC["epsilon"])
    status = reporter.status()
    assert status["budget"]["forgotten"] == KRR_SPEC["epsilon"]
    assert status["budget"]["spent"] == pytest.approx(2 * KRR_SPEC["epsilon"])
    with pytest.raises(ClientError, match="not in the state"):
        reporter.forget("smoker")


def test_after_forget_the_device_is_still_counted_once_in_the_period(fake, make_reporter):
    reporter = make_reporter()
    first = reporter.report("fruit", "apple")
    reporter.forget("fruit")
    again = reporter.report("fruit", "apple")  # the same spec: the same period's report id
    assert again.outcome == "duplicate" and not again.repeat
    assert again.payload["report_id"] == first.payload["report_id"]
    assert fake.count("fruit") == 1


# -- bad input and bad servers -------------------------------------------------------------


@pytest.mark.parametrize(
    ("campaign", "value", "match"),
    [
        ("fruit", "kiwi", "labels: apple, banana"),
        ("fruit", 3, "labels"),
        ("where", {"lat": 48.2, "lon": 11.55}, "outside the campaign region"),
        ("where", {"lat": math.nan, "lon": 11.55}, "finite"),
        ("where", "home", "location"),
    ],
)
def test_bad_values_are_refused_before_anything_is_spent(
    fake, make_reporter, state_dir, campaign, value, match
):
    with pytest.raises(ReportError, match=match) as info:
        make_reporter().report(campaign, value)
    assert "nothing was spent or sent" in str(info.value)
    assert fake.posts() == [] and state_bytes(state_dir) is None


def test_a_malformed_campaign_id_never_reaches_the_server(fake, make_reporter):
    with pytest.raises(ValueError, match="campaign id"):
        make_reporter().report("../admin", "x")
    assert fake.requests == []


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        (b'{"id": "fruit", "title": "t", "mechanism": "krr", "epsilon": NaN}', "invalid|JSON"),
        (b'{"id": "fruit", "title": "t", "mechanism": "krr", "epsilon": 1e999}', "finite"),
        (b"<html>not json</html>", "JSON object"),
        (b"[1, 2]", "JSON object"),
    ],
)
def test_malformed_specs_are_refused(fake, make_reporter, state_dir, raw, match):
    fake.raw_spec["fruit"] = raw
    with pytest.raises(UntrustedSpec, match=match):
        make_reporter().report("fruit", "apple")
    assert fake.posts() == [] and state_bytes(state_dir) is None


def test_a_spec_hash_that_does_not_match_is_refused(fake, make_reporter):
    spec = CampaignSpec.from_dict(KRR_SPEC)
    wire = {**spec.to_dict(), "status": "open", "spec_hash": "0" * 64}
    fake.raw_spec["fruit"] = json.dumps(wire).encode()
    with pytest.raises(UntrustedSpec, match="does not match"):
        make_reporter().report("fruit", "apple")
    fake.raw_spec["fruit"] = json.dumps(
        {**wire, "spec_hash": spec.spec_hash, "id": "smoker"}
    ).encode()
    with pytest.raises(UntrustedSpec, match="asked for campaign"):
        make_reporter().report("fruit", "apple")
    assert fake.posts() == []


def test_closed_unknown_and_enrollment_campaigns_are_refused(fake, make_reporter, state_dir):
    fake.status["fruit"] = "closed"
    with pytest.raises(CampaignClosed):
        make_reporter().report("fruit", "apple")
    with pytest.raises(CampaignNotFound):
        make_reporter().report("nope", "apple")
    fake.add({**KRR_SPEC, "id": "enrolled", "enrollment_required": True})
    with pytest.raises(ClientError, match="enrollment") as info:
        make_reporter().report("enrolled", "apple")
    assert info.value.code == "enrollment_needed"
    assert fake.posts() == [] and state_bytes(state_dir) is None


@pytest.mark.parametrize("mode", ["down", "timeout", "503", "429"])
def test_an_unreachable_server_for_a_new_campaign_spends_nothing(
    fake, make_reporter, state_dir, mode
):
    fake.mode = mode
    with pytest.raises(ServerUnavailable, match="nothing was spent or sent"):
        make_reporter().report("fruit", "apple")
    assert state_bytes(state_dir) is None


# -- the queue -----------------------------------------------------------------------------


def test_offline_reports_use_the_pinned_spec_and_flush_delivers_each_once(
    fake, make_reporter, clock
):
    reporter = make_reporter(clock=clock)
    reporter.report("daily", "apple")
    fake.mode = "down"
    queued = []
    for value in ("apple", "banana", "apple"):
        clock.next_day()
        queued.append(reporter.report("daily", value))
    # A repeat within a period while its report still waits: the same report, not queued twice.
    again = reporter.report("daily", "apple")
    assert again.outcome == "queued" and again.repeat and again.payload == queued[2].payload
    assert {r.outcome for r in queued} == {"queued"}
    assert queued[0].payload["value"] == queued[2].payload["value"]
    assert reporter.status()["queue"]["pending"] == 3
    assert reporter.flush().remaining == 3  # still down: kept
    fake.mode = "up"
    result = reporter.flush()
    assert (result.accepted, result.duplicates, result.remaining) == (3, 0, 0)
    assert fake.count("daily") == 4
    assert reporter.flush().attempted == 0
    # The flush sent one batch per campaign with the original report ids.
    ids = {r.payload["report_id"] for r in queued}
    assert set(fake.received["daily"]) >= ids


def test_a_repeat_resends_the_period_report_while_it_waits(fake, make_reporter, clock):
    """The acknowledgement was lost: the same answer again re-sends that report, counted once."""
    reporter = make_reporter(clock=clock)
    fake.post_mode = "lose_ack"
    first = reporter.report("fruit", "apple")
    assert first.outcome == "queued" and fake.count("fruit") == 1
    fake.post_mode = "up"
    clock.now += BACKOFF_BASE_S  # past the retry's backoff
    again = reporter.report("fruit", "apple")
    assert (again.outcome, again.repeat, again.charged) == ("duplicate", True, 0)
    assert again.payload == first.payload and fake.posts()[-1] == first.payload
    assert fake.count("fruit") == 1 and reporter.status()["queue"]["pending"] == 0
    assert reporter.report("fruit", "apple").outcome == "already_reported"
    assert len(fake.posts()) == 2


def test_a_lost_acknowledgement_is_retried_and_counted_once(fake, make_reporter):
    reporter = make_reporter()
    fake.post_mode = "lose_ack"
    result = reporter.report("fruit", "apple")
    assert result.outcome == "queued" and fake.count("fruit") == 1
    fake.post_mode = "up"
    flushed = reporter.flush()
    assert (flushed.accepted, flushed.duplicates, flushed.remaining) == (0, 1, 0)
    assert fake.count("fruit") == 1


def test_a_crash_while_sending_loses_nothing(fake, make_reporter):
    fake.post_mode = "crash"
    with pytest.raises(Crash):
        make_reporter().report("fruit", "banana")
    assert fake.count("fruit") == 0
    fake.post_mode = "up"
    # A later run (another process, say) finds the report on disk, already paid for.
    reporter = make_reporter()
    assert reporter.status()["budget"]["spent"] == KRR_SPEC["epsilon"]
    assert reporter.flush().accepted == 1
    assert fake.count("fruit") == 1
    assert reporter.report("fruit", "banana").memoized


def test_backoff_and_retry_after(fake, make_reporter):
    now = [1_000_000.0]
    reporter = make_reporter(clock=lambda: now[0])
    fake.post_mode = "429"
    fake.retry_after = "600"
    assert reporter.report("fruit", "apple").outcome == "queued"
    [entry] = reporter.store.read().queue
    assert entry.attempts == 1 and entry.next_attempt_at >= now[0] + 600
    assert reporter.flush(due_only=True).attempted == 0
    # The same answer again waits for the server's Retry-After too.
    again = reporter.report("fruit", "apple")
    assert again.outcome == "queued" and again.repeat and "next attempt" in again.detail
    assert len(fake.posts()) == 1
    fake.post_mode = "503"
    now[0] += 601
    assert reporter.flush(due_only=True).attempted == 1
    [entry] = reporter.store.read().queue
    assert entry.attempts == 2
    assert now[0] + BACKOFF_BASE_S <= entry.next_attempt_at <= now[0] + 2 * BACKOFF_BASE_S
    assert "503" in entry.last_error
    fake.post_mode = "up"
    assert reporter.flush(due_only=True).attempted == 0  # not due yet
    now[0] += 2 * BACKOFF_BASE_S
    assert reporter.flush(due_only=True).accepted == 1


def test_a_successful_report_also_sends_due_queued_reports(fake, make_reporter, clock):
    reporter = make_reporter(clock=clock)
    reporter.report("daily", "apple")
    clock.next_day()
    fake.mode = "down"
    reporter.report("daily", "banana")
    fake.mode = "up"
    reporter.report("smoker", "yes")
    assert reporter.status()["queue"]["pending"] == 0
    assert fake.count("daily") == 2


def test_a_refused_report_is_kept_as_rejected(fake, make_reporter, clock):
    reporter = make_reporter(clock=clock)
    reporter.report("daily", "apple")
    fake.mode = "down"
    for value in ("apple", "banana", "cherry"):
        clock.next_day()
        reporter.report("daily", value)
    bad = reporter.store.read().queue[1].report_id
    fake.mode = "up"
    fake.reject_ids.add(bad)
    result = reporter.flush()
    assert result.accepted == 2 and result.remaining == 0
    assert [r["report_id"] for r in result.rejected] == [bad]
    status = reporter.status()
    assert [r["report_id"] for r in status["rejected"]] == [bad]
    assert status["rejected"][0]["error"]["status"] == 422


def test_a_refused_period_report_leaves_the_period_open(fake, make_reporter, state_dir):
    """The server did not count a refused report: the device may report in that period again."""
    spec = CampaignSpec.from_dict(KRR_SPEC)
    fake.reject_ids.add(report_id(StateStore(state_dir).secret(), "fruit", spec.spec_hash, "once"))
    reporter = make_reporter()
    with pytest.raises(ServerRejected, match="budget spent"):
        reporter.report("fruit", "apple")
    assert state_json(state_dir)["campaigns"][f"fruit@{SERVER}"]["period_report"] is None
    fake.reject_ids.clear()
    result = reporter.report("fruit", "banana")
    assert result.outcome == "delivered" and not result.repeat
    assert fake.count("fruit") == 1 and result.total_spent == 2 * KRR_SPEC["epsilon"]


def test_a_campaign_closed_after_the_spec_was_read(fake, make_reporter, clock):
    reporter = make_reporter(clock=clock)
    reporter.report("daily", "apple")
    clock.next_day()
    fake.mode = "down"
    reporter.report("daily", "banana")
    fake.mode = "up"
    fake.status["daily"] = "closed"
    result = reporter.flush()
    assert result.rejected[0]["code"] == "campaign_closed"
    with pytest.raises(CampaignClosed):
        reporter.report("daily", "apple")


def test_a_report_rejected_at_send_time_says_budget_was_spent(
    fake, make_reporter, monkeypatch, clock
):
    reporter = make_reporter(clock=clock)
    reporter.report("daily", "apple")
    clock.next_day()
    fake.add({**DAILY_SPEC, "title": "changed under our feet"})
    # Simulate the change landing between reading the spec and posting the report.
    original = fake.send

    def serve_old_spec_once(request, **kwargs):
        if request.method == "GET":
            old = CampaignSpec.from_dict(DAILY_SPEC)
            return fake._raw(
                request,
                200,
                json.dumps(
                    {**old.to_dict(), "status": "open", "spec_hash": old.spec_hash}
                ).encode(),
            )
        return original(request, **kwargs)

    monkeypatch.setattr(fake, "send", serve_old_spec_once)
    with pytest.raises(ServerRejected, match="budget spent") as info:
        reporter.report("daily", "banana")
    assert info.value.code == "spec_mismatch" and info.value.status == 409
    assert len(reporter.status()["rejected"]) == 1


def test_servers_are_kept_apart(fake, make_reporter, state_dir):
    from client import Reporter

    make_reporter().report("fruit", "apple")
    other = Reporter("http://other.test", state_dir=str(state_dir), session=fake.session())
    other.session.mount("http://other.test", fake)
    fake.add({**KRR_SPEC, "title": "the other server's fruit"})
    result = other.report("fruit", "apple")  # another server's campaign: its own pin
    assert result.outcome == "delivered" and not result.memoized
    assert len(other.status()["campaigns"]) == 2
    assert SERVER in {c["server"] for c in other.status()["campaigns"]}


def test_an_offline_report_waits_as_long_as_the_server_asked(fake, make_reporter):
    now = [2_000_000.0]
    reporter = make_reporter(clock=lambda: now[0])
    reporter.report("daily", "apple")
    now[0] += 86_400
    fake.mode = "429"
    fake.retry_after = "300"
    assert reporter.report("daily", "banana").outcome == "queued"
    [entry] = reporter.store.read().queue
    assert entry.attempts == 0 and entry.next_attempt_at == now[0] + 300


def test_a_report_in_flight_is_left_to_its_own_process(fake, make_reporter):
    """Another run's opportunistic flush skips a report that is still being sent."""
    now = [3_000_000.0]
    fake.post_mode = "crash"  # the first process dies while sending
    with pytest.raises(Crash):
        make_reporter(clock=lambda: now[0]).report("fruit", "apple")
    fake.post_mode = "up"
    other = make_reporter(clock=lambda: now[0])
    other.report("smoker", "yes")
    assert other.status()["queue"]["pending"] == 1 and fake.count("fruit") == 0
    # The same answer in the period is that report, which is in flight: left to its process.
    waiting = other.report("fruit", "apple")
    assert waiting.outcome == "queued" and waiting.repeat and fake.count("fruit") == 0
    now[0] += IN_FLIGHT_S + 1  # long past any send: the orphan is due
    other.report("smoker", "yes")
    assert other.status()["queue"]["pending"] == 0 and fake.count("fruit") == 1
