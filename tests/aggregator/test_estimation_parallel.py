"""An estimate's folds and refits side by side: same results in the same order, one budget."""

import math
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

from aggregator.estimation import IBU, budget, channel_for, estimate, parallel
from shared.geo import Grid
from shared.mechanisms import KRR, PlanarLaplace
from simulate.populations import Population
from simulate.reproduce import square_region
from simulate.sampling import sample

ROOT = Path(__file__).resolve().parents[2]


def together(parties: int) -> threading.Barrier:
    """A barrier that breaks (and fails the test) unless ``parties`` threads reach it at once."""
    return threading.Barrier(parties, timeout=20)


def test_items_run_on_two_threads_and_come_back_in_order():
    meeting = together(2)
    threads = set()

    def work(item: int) -> int:
        if item < 2:
            meeting.wait()  # the first two items only pass if two threads hold them
        threads.add(threading.get_ident())
        return item * item

    with budget.limited(threads=2):
        assert parallel.map_ordered(work, range(10)) == [i * i for i in range(10)]
    assert len(threads) == 2


def test_a_generator_of_items_is_drawn_in_order():
    def draws(seed: int):
        generator = np.random.default_rng(seed)
        for _ in range(12):
            yield generator.integers(1 << 30)

    with budget.limited(threads=2):
        beside = parallel.map_ordered(lambda x: x, draws(5))
    assert beside == list(draws(5))


def test_one_thread_runs_every_item_in_the_caller():
    caller = threading.get_ident()
    with budget.limited(threads=1):
        seen = parallel.map_ordered(lambda _: threading.get_ident(), range(5))
    assert seen == [caller] * 5


def test_helpers_charge_the_callers_budget():
    meeting = together(2)

    def work(item: int) -> int:
        meeting.wait()
        budget.charge(10)
        return budget.threads()

    with budget.limited(max_work=1000, threads=2):
        assert parallel.map_ordered(work, range(2)) == [2, 2]
        assert budget.spent() == 20


def test_the_work_cap_stops_every_thread():
    ran = []

    def work(item: int) -> None:
        ran.append(item)
        budget.charge(60)

    with budget.limited(max_work=100, threads=2), pytest.raises(budget.WorkLimitExceeded):
        parallel.map_ordered(work, range(50))
    assert len(ran) < 5


def test_an_error_while_drawing_an_item_is_raised():
    def draws():
        yield 1
        raise KeyError("drawn")

    with budget.limited(threads=2), pytest.raises(KeyError, match="drawn"):
        parallel.map_ordered(lambda x: x, draws())


def test_a_map_inside_a_map_runs_inline():
    with budget.limited(threads=2):
        nested = parallel.map_ordered(
            lambda row: parallel.map_ordered(lambda x: x + row, range(3)), range(4)
        )
    assert nested == [[row, row + 1, row + 2] for row in range(4)]


def test_beside_runs_next_to_the_caller_and_raises_its_error():
    meeting = together(2)
    with budget.limited(threads=2):
        result = parallel.beside(lambda: meeting.wait() + 100)
        meeting.wait()
        assert result() in (100, 101)
        failing = parallel.beside(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing()


def test_beside_on_one_thread_runs_when_asked_once():
    calls = []
    with budget.limited(threads=1):
        result = parallel.beside(lambda: calls.append(1) or len(calls))
        assert calls == []
        assert result() == 1
        assert result() == 1
    assert calls == [1]


def planar_case(side_m: float = 1600.0):
    grid = Grid(square_region(37.77, -122.42, side_m), 50.0)
    truth = Population.clustered_city(grid, seed=3).probabilities
    mechanism = PlanarLaplace(epsilon=math.log(2) / 100, grid=grid)
    generator = np.random.default_rng(11)
    users = np.repeat(np.arange(truth.size), generator.multinomial(20_000, truth))
    counts = np.bincount(sample(mechanism, users, generator), minlength=truth.size)
    return mechanism, counts


def test_only_compiled_steps_run_side_by_side():
    """Whole-array numpy steps hold Python's lock: on two threads they were slower."""
    assert not channel_for(KRR(epsilon=1.0, domain=["a", "b", "c"])).steps_run_in_parallel
    channel = channel_for(planar_case()[0])
    assert channel.steps_run_in_parallel == (channel._fftw is not None)


def test_a_planar_estimate_is_the_same_on_one_thread_and_on_two():
    mechanism, counts = planar_case()
    channel = channel_for(mechanism)
    if not channel.steps_run_in_parallel:
        pytest.skip("the planar steps run side by side with the fast extra only")
    results = []
    for threads in (1, 2, 1):
        with budget.limited(threads=threads):
            results.append(estimate(mechanism, counts, channel=channel))
    assert "bootstrap" in results[0].interval_method
    for other in results[1:]:
        assert other.n_iter == results[0].n_iter
        np.testing.assert_array_equal(other.frequencies, results[0].frequencies)
        np.testing.assert_array_equal(other.ci_low, results[0].ci_low)
        np.testing.assert_array_equal(other.ci_high, results[0].ci_high)
        assert other.interval_method == results[0].interval_method


def test_each_bootstrap_refit_has_its_own_estimator(monkeypatch):
    """Refits run at once on several threads: refits sharing one estimator object (as they
    once did) take each other's results whenever two finish together."""
    fitted = []
    fit = IBU.fit

    def recorded(self, counts, channel, n_iter=None):
        fitted.append(self)  # kept alive, so that no two hold the same id
        return fit(self, counts, channel, n_iter)

    monkeypatch.setattr(IBU, "fit", recorded)
    mechanism, counts = planar_case(side_m=400.0)
    with budget.limited(threads=2):
        estimate(mechanism, counts, n_bootstrap=20)
    # the estimate and its 20 refits
    expected = 1 + 20
    assert len(fitted) == expected
    assert len({id(estimator) for estimator in fitted}) == expected


def test_estimates_run_side_by_side_in_a_gevent_patched_process():
    """The server's gevent worker runs estimates in gevent's native thread pool: the helpers
    must be native threads with native locks there, or the estimate would hang."""
    script = textwrap.dedent(
        """
        from gevent import monkey
        monkey.patch_all()
        import gevent
        import numpy as np
        from aggregator.estimation import budget, channel_for, estimate
        from tests.aggregator.test_estimation_parallel import planar_case

        mechanism, counts = planar_case()
        channel = channel_for(mechanism)

        def run(threads):
            with budget.limited(threads=threads):
                return estimate(mechanism, counts, channel=channel)

        pool = gevent.get_hub().threadpool
        one, two = pool.apply(run, (1,)), pool.apply(run, (2,))
        assert np.array_equal(one.ci_high, two.ci_high)
        print("same", one.n_iter)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("same ")
