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


def test_a_share_counts_in_its_budget_and_runs_out_on_its_own():
    with budget.limited(max_work=100):
        budget.charge(10)
        with pytest.raises(budget.ShareExhausted), budget.share(30):
            budget.charge(20)
            assert (budget.spent(), budget.remaining()) == (20, 10)
            budget.charge(11)
        # The share's work was counted here too, and the estimate goes on with the rest.
        assert (budget.spent(), budget.remaining()) == (41, 59)
        budget.charge(59)
        with pytest.raises(budget.WorkLimitExceeded):
            budget.charge(1)
    with pytest.raises(budget.ShareExhausted), budget.share(5):  # without a budget
        budget.charge(6)
    with budget.share(None):
        budget.charge(10**12)


def test_a_share_has_half_of_the_time_left():
    with budget.limited(timeout_s=2.0):
        started = time.monotonic()
        with pytest.raises(budget.ShareExhausted), budget.share(None):
            while True:
                budget.charge(1)
                time.sleep(0.001)
        # Half of the 2 s, give or take a loaded machine's late wake-ups; the estimate's own
        # time is not over.
        assert 0.95 < time.monotonic() - started < 1.9
        budget.charge(1)


def test_threads_lent_a_share_charge_it_and_its_budget():
    with budget.limited(max_work=100):
        with budget.share(50):
            lent = budget.current()
            thread = threading.Thread(target=lambda: _charge_under(lent, 30))
            thread.start()
            thread.join()
            assert budget.spent() == 30
        assert budget.spent() == 30


def _charge_under(lent, units):
    with budget.lent(lent):
        budget.charge(units)


def test_a_paced_loop_checks_the_budget_before_each_slow_step():
    """Steps slower than budget.CHECK_EVERY_S run one at a time, each charged (and the time limit
    checked) before it; fast ones run in chunks that double."""
    taken = []
    with budget.limited(timeout_s=0.25), pytest.raises(budget.EstimateTimedOut):
        for chunk in budget.Pace().chunks(100, 1):
            taken.append(chunk)
            time.sleep(chunk * 1.5 * budget.CHECK_EVERY_S)
    assert set(taken) == {1} and len(taken) <= 2
    fast = list(budget.Pace().chunks(1000, 1))
    assert sum(fast) == 1000 and fast[0] == 1 and len(fast) < 50
