"""The ledger's own contract: the cap, pins, memoized values, the budget, forgetting."""

from __future__ import annotations

import pytest
from client_fakes import KRR_SPEC, PLANAR_SPEC, SERVER

from client import BudgetExceeded, ClientError, EpsilonCapExceeded, Policy, SpecChanged, StateError
from client.ledger import SLACK, Charge, Ledger, pinned_spec
from client.state import State, campaign_key
from shared.spec import CampaignSpec

KRR = CampaignSpec.from_dict(KRR_SPEC)
KEY = campaign_key(SERVER, KRR.id)


def booked(ledger: Ledger, state: State, tag: str, spec: CampaignSpec = KRR) -> Charge:
    charge = ledger.charge(state, KEY, spec, tag, ledger.cost(spec))
    ledger.record(state, KEY, SERVER, spec, charge, now=100.0)
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
    charge = ledger.charge(state, KEY, KRR, "tag-a", 1.0)
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
    booked(ledger, state, "tag-a")
    again = booked(ledger, state, "tag-a")
    assert again == Charge(tag="tag-a", epsilon=0.0, memoized=True)
    assert state.campaigns[KEY].charges == {"tag-a": 1.0}


def test_a_changed_spec_is_refused_even_for_a_value_reported_before():
    ledger, state = Ledger(Policy()), State()
    booked(ledger, state, "tag-a")
    changed = CampaignSpec.from_dict({**KRR_SPEC, "title": "changed"})
    with pytest.raises(SpecChanged, match="forget fruit"):
        ledger.charge(state, KEY, changed, "tag-a", 1.0)


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
        tiny.record(state, KEY, SERVER, KRR, tiny.charge(state, KEY, KRR, tag, 0.1), now=0.0)
    assert tiny.charge(state, KEY, KRR, "c", 0.1 * (1 + SLACK / 10)).epsilon > 0


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
