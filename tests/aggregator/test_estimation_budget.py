"""The per-estimate work budget: a cap on work units and a time limit, per thread."""

import threading
import time

import pytest

from aggregator.estimation import budget


def test_charge_without_a_budget_does_nothing():
    budget.charge(10**12)
    assert budget.spent() == 0


def test_work_beyond_the_cap_is_refused():
    with budget.limited(max_work=100):
        budget.charge(60)
        budget.charge(40)
        assert budget.spent() == 100
        with pytest.raises(budget.WorkLimitExceeded, match="more than 100 units"):
            budget.charge(1)
    assert budget.spent() == 0


def test_the_time_limit_stops_a_running_estimate():
    with budget.limited(timeout_s=0.05), pytest.raises(budget.EstimateTimedOut):
        for _ in range(1000):
            budget.charge(1)
            time.sleep(0.001)


def test_budgets_belong_to_their_thread():
    seen = []

    def other():
        budget.charge(10**9)
        seen.append(budget.spent())

    with budget.limited(max_work=5):
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert budget.spent() == 0
    assert seen == [0]


@pytest.mark.parametrize("kwargs", [{"max_work": 0}, {"timeout_s": 0.0}, {"timeout_s": -1.0}])
def test_a_limit_must_be_positive(kwargs):
    with pytest.raises(ValueError), budget.limited(**kwargs):
        pass


def test_metered_counts_the_block_s_work_with_or_without_a_budget():
    with budget.metered() as outer:
        budget.charge(5)
        with budget.metered() as inner:
            budget.charge(7)
        with budget.limited(max_work=100):
            budget.charge(11)
            assert budget.remaining() == 89
    assert (inner(), outer()) == (7, 23)
    assert budget.remaining() is None
    with budget.limited(max_work=10):
        budget.charge(10)
        assert budget.remaining() == 0
