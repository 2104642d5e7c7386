"""The ledger's own contract: the cap, pins, memoized values, the budget, forgetting."""

from __future__ import annotations

import pytest
from client_fakes import KRR_SPEC, PLANAR_SPEC, SERVER

from client import (
    AlreadyReported,
    BudgetExceeded,
    ClientError,
    EpsilonCapExceeded,
    Policy,
    SpecChanged,
    StateError,
)
from client.ledger import SLACK, Charge, Ledger, pinned_spec
from client.state import PeriodReport, State, campaign_key
from shared.spec import CampaignSpec

KRR = CampaignSpec.from_dict(KRR_SPEC)
KEY = campaign_key(SERVER, KRR.id)


def booked(
    ledger: Ledger, state: State, tag: str, spec: CampaignSpec = KRR, period: str | None = None
) -> Charge:
    """Charge and record a report of ``tag`` in ``period`` (by default one of its own)."""
    period = f"period-of-{tag}" if period is None else period
    charge = ledger.charge(state, KEY, spec, tag, ledger.cost(spec), period)
    if charge.repeat is None:
        report = PeriodReport(period, tag, {"report_id": f"id-{period}", "value": "noisy"})
        ledger.record(state, KEY, SERVER, spec, charge, now=100.0, report=report)
    return charge


def test_cost_is_the_policys_and_a_campaign_above_the_cap_is_refused():
    assert Ledger(Policy(max_epsilon=1.0)).cost(KRR) == KRR.epsilon
    with pytest.raises(EpsilonCapExceeded, match=r"above your cap of 0\.5") as info:
        Ledger(Policy(max_epsilon=0.5)).cost(KRR)
    assert info.value.field == "epsilon"


def test_a_planar_refusal_says_what_the_cost_rests_on():
    planar = CampaignSpec.from_dict(PLANAR_SPEC)
    with pytest.raises(EpsilonCapExceeded, match=r"/m over 200 m and 250 m cells"):
        Ledger(Policy(max_epsilon=0.01, location_radius_m=200.0)).cost(planar)


def test_charging_changes_nothing_and_recording_pins_once():
    ledger, state = Ledger(Policy()), State()
    charge = ledger.charge(state, KEY, KRR, "tag-a", 1.0, "once")
    assert charge == Charge(tag="tag-a", epsilon=1.0, memoized=False)
    assert state == State()
    ledger.record(state, KEY, SERVER, KRR, charge, now=100.0)
    booked(ledger, state, "tag-b")
    record = state.campaigns[KEY]
    assert (record.pinned_at, record.spec_hash, record.charges) == (
        100.0,
        KRR.spec_hash,
        {"tag-a": 1.0, "tag-b": 1.0},
    )
    assert state.total_spent == 2.0


def test_a_value_reported_before_costs_nothing_and_is_not_booked_again():
    ledger, state = Ledger(Policy()), State()
    booked(ledger, state, "tag-a", period="2025-W02")
    again = booked(ledger, state, "tag-a", period="2025-W03")
    assert again == Charge(tag="tag-a", epsilon=0.0, memoized=True)
    assert state.campaigns[KEY].charges == {"tag-a": 1.0}


def test_a_changed_spec_is_refused_even_for_a_value_reported_before():
    ledger, state = Ledger(Policy()), State()
    booked(ledger, state, "tag-a")
    changed = CampaignSpec.from_dict({**KRR_SPEC, "title": "changed"})
    with pytest.raises(SpecChanged, match="forget fruit"):
        ledger.charge(state, KEY, changed, "tag-a", 1.0, "period-of-tag-a")


def test_the_budget_is_spent_exactly_to_its_end_and_not_beyond():
    ledger, state = Ledger(Policy(max_epsilon=1.0, total_budget=2.0)), State()
    booked(ledger, state, "tag-a")
    booked(ledger, state, "tag-b")  # exactly the budget: allowed
    assert ledger.budget(state) == {"total": 2.0, "spent": 2.0, "left": 0.0, "forgotten": 0.0}
    with pytest.raises(BudgetExceeded, match="only 0 of your budget of 2 is left"):
        booked(ledger, state, "tag-c")
    # Float sums within the slack do not refuse a report that fits.
    tiny = Ledger(Policy(total_budget=0.3))
    state = State()
    for tag in ("a", "b"):
        tiny.record(state, KEY, SERVER, KRR, tiny.charge(state, KEY, KRR, tag, 0.1, tag), now=0.0)
    assert tiny.charge(state, KEY, KRR, "c", 0.1 * (1 + SLACK / 10), "c").epsilon > 0


def test_forgetting_keeps_the_spent_budget_counted():
    ledger, state = Ledger(Policy()), State()
    booked(ledger, state, "tag-a")
    assert ledger.forget(state, KEY, SERVER, KRR.id) == 1.0
    assert state.campaigns == {} and state.total_spent == 1.0
    assert ledger.budget(state)["forgotten"] == 1.0
    with pytest.raises(ClientError) as info:
        ledger.forget(state, KEY, SERVER, KRR.id)
    assert info.value.code == "not_pinned"


def test_campaign_rows_and_a_damaged_pin():
    ledger, state = Ledger(Policy()), State()
    booked(ledger, state, "tag-a")
    [row] = ledger.campaigns(state)
    assert row["campaign"] == "fruit" and row["values_reported"] == 1 and row["spent"] == 1.0
    assert pinned_spec(state.campaigns[KEY]) == KRR
    state.campaigns[KEY].spec_hash = "0" * 64
    with pytest.raises(StateError, match="does not match its hash"):
        ledger.campaigns(state)
    state.campaigns[KEY].spec = {"id": "fruit"}
    with pytest.raises(StateError, match="is damaged"):
        pinned_spec(state.campaigns[KEY])


@pytest.mark.parametrize(
    ("period", "key", "when"),
    [
        ("once", "once", "a changed answer is not sent"),
        (
            "day",
            "2025-01-15",
            "today (2025-01-15) with another answer: that report stands, and a "
            "changed answer can be reported from 2025-01-16 00:00 UTC",
        ),
        (
            "week",
            "2025-W03",
            "this week (2025-W03) with another answer: that report stands, and a "
            "changed answer can be reported from 2025-01-20 00:00 UTC",
        ),
    ],
)
def test_one_report_per_period_the_same_answer_is_that_report_another_is_refused(period, key, when):
    spec = CampaignSpec.from_dict({**KRR_SPEC, "period": period})
    ledger, state = Ledger(Policy()), State()
    first = booked(ledger, state, "tag-a", spec, key)
    reported = state.campaigns[KEY].period_report
    assert first.repeat is None and reported is not None and reported.period == key
    again = booked(ledger, state, "tag-a", spec, key)
    assert again == Charge(tag="tag-a", epsilon=0.0, memoized=True, repeat=reported)
    before = State.from_dict(state.to_dict())
    with pytest.raises(AlreadyReported, match="nothing was spent or sent") as info:
        booked(ledger, state, "tag-b", spec, key)
    assert when in str(info.value) and info.value.code == "already_reported"
    assert state == before


def test_a_new_period_is_a_new_report_and_an_unchanged_answer_still_costs_nothing():
    spec = CampaignSpec.from_dict({**KRR_SPEC, "period": "day"})
    ledger, state = Ledger(Policy()), State()
    booked(ledger, state, "tag-a", spec, "2025-01-15")
    next_day = booked(ledger, state, "tag-a", spec, "2025-01-16")
    assert next_day == Charge(tag="tag-a", epsilon=0.0, memoized=True)
    assert state.campaigns[KEY].period_report.period == "2025-01-16"
    changed = booked(ledger, state, "tag-b", spec, "2025-01-17")
    assert changed == Charge(tag="tag-b", epsilon=1.0, memoized=False)
    assert state.total_spent == 2.0
