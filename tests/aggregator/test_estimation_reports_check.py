"""An estimate against the raw report shares on surveys simulated from it
(estimators.check_against_reports): on a grid for IBU (GridIBU, by a transport distance), over
three k-RR categories or more for the default (KRRCheckedAgainstReports, by total variation),
where k-RR's empirical Bayes is also checked against the maximum-likelihood shares."""

from __future__ import annotations

import math

import numpy as np
import pytest

from aggregator.estimation import budget, channel_for, estimators
from aggregator.estimation.channels import log_likelihood
from aggregator.estimation.compute import estimate
from aggregator.estimation.estimators import (
    IBU,
    KRR_REPORTS_CHECK_MARGIN,
    GridIBU,
    KRRCheckedAgainstReports,
    ReportsCheck,
    cross_validated_ibu,
    default_estimator,
    measured_spread,
)
from aggregator.estimation.transport import dyadic_transport
from aggregator.http.estimates import DEFAULT_MAX_WORK, DEFAULT_TIMEOUT_S
from scripts.bench_estimators import krr_case
from scripts.sweep_defaults import errors, settings
from shared.geo import EARTH_RADIUS_M, Grid, Region
from shared.mechanisms import KRR, PlanarLaplace


def sweep_case(name: str):
    return next(case for case in settings("planar") if case.name == name)


@pytest.mark.parametrize("rows, cols", [(6, 5), (1, 7)])
def test_drawn_reports_follow_the_channel(rows, cols):
    """400,000 users through ``draw_reports`` against ``forward``: every cell within five of
    its binomial standard deviations (a non-square grid, and a single row, fix the index
    arithmetic), and the alias table holds exactly the kernel."""
    degrees = 500.0 / (EARTH_RADIUS_M * math.pi / 180)  # a cell, at the equator
    grid = Grid(Region(0.0, (rows - 0.5) * degrees, 0.0, (cols - 0.5) * degrees), 500.0)
    assert (grid.rows, grid.cols) == (rows, cols)
    channel = channel_for(PlanarLaplace(epsilon=math.log(2) / 300, grid=grid))
    keep, alias = channel._offset_table
    held = keep.copy()
    np.add.at(held, alias, 1.0 - keep)
    np.testing.assert_allclose(held / keep.size, channel.kernel.ravel(), rtol=0, atol=1e-12)

    generator = np.random.default_rng(5)
    shares = generator.dirichlet(np.ones(rows * cols))
    users = generator.multinomial(400_000, shares)
    drawn = channel.draw_reports(users, generator) / users.sum()
    expected = channel.forward(users / users.sum())
    sd = np.sqrt(expected * (1 - expected) / users.sum())
    assert np.all(np.abs(drawn - expected) <= 5 * sd + 1e-9)


def test_dyadic_transport_counts_each_block_by_its_side():
    one_row = np.zeros((2, 4))
    one_row[0, 1] = one_row[1, 0] = 1.0  # one cell apart, in the same block of two
    assert dyadic_transport(one_row[0], one_row[1], 1, 4) == pytest.approx(1.0)
    one_row[1] = np.roll(one_row[0], 1)  # cells 1 and 2: across blocks of two, inside four
    assert dyadic_transport(one_row[0], one_row[1], 1, 4) == pytest.approx((2 + 2 * 2) / 2)
    # Leading axes broadcast; the distance is symmetric and zero between equal arguments.
    grid = np.random.default_rng(0).dirichlet(np.ones(15), size=3)
    distances = dyadic_transport(grid, grid[0], 3, 5)
    assert distances.shape == (3,) and distances[0] == 0.0
    assert distances[1] == pytest.approx(dyadic_transport(grid[0], grid[1], 3, 5))
    with pytest.raises(ValueError, match="expected 15 cells"):
        dyadic_transport(grid[:, :14], grid[0, :14], 3, 5)


def test_the_report_shares_are_kept_where_the_noise_moves_a_report_less_than_a_cell(
    monkeypatch,
):
    """ln 32 per 100 m over 100 m cells, 3,000 reports: cross-validation stops IBU after one
    step from equal shares, a blur of the reports, and that was worse than the reports in
    every seed (1.065 times their mean earth mover's distance over seeds 600-607)."""
    case = sweep_case("planar city ln 32 / 100 m, n=3,000")
    table = errors(case, range(600, 603))
    np.testing.assert_array_equal(table[:, 0], table[:, 1])
    monkeypatch.setattr(estimators, "REPORTS_CHECK_MAX_WORK", 0)
    unchecked = errors(case, range(600, 603))
    assert np.all(unchecked[:, 0] > unchecked[:, 1])


def test_ibu_is_kept_where_it_is_the_better_estimate():
    case = sweep_case("planar city ln 2 / 100 m, n=3,000")
    channel = channel_for(case.mechanism)
    counts, _ = case.reports(600)
    fitted = cross_validated_ibu(channel).fit(counts, channel)
    assert isinstance(fitted, GridIBU) and fitted.check_ is not None
    assert fitted.check_.estimate < 0.7 * fitted.check_.rival and not fitted.kept_reports_
    assert fitted.check_.margin == 0.0
    np.testing.assert_array_equal(fitted.frequencies_, fitted.ibu_.frequencies_)
    assert fitted.n_iter_ == fitted.ibu_.n_iter_ > 1
    assert fitted.describe().startswith("IBU, stopped at ")


def test_the_check_is_left_out_above_its_work(monkeypatch):
    case = sweep_case("planar city ln 32 / 100 m, n=3,000")
    channel = channel_for(case.mechanism)
    counts, _ = case.reports(600)
    monkeypatch.setattr(estimators, "REPORTS_CHECK_MAX_WORK", 16 * 3000 - 1)
    fitted = GridIBU().fit(counts, channel)
    assert fitted.check_ is None and not fitted.kept_reports_
    assert fitted.describe() == fitted.ibu_.describe()


def test_an_estimate_that_keeps_the_report_shares_says_so_and_holds_them_in_its_intervals():
    case = sweep_case("planar city ln 128 / 100 m, n=3,000")
    counts, _ = case.reports(601)
    result = estimate(case.mechanism, counts)
    assert result.method == "ibu" and result.n_iter == 0
    np.testing.assert_allclose(result.frequencies, counts / counts.sum())
    assert result.estimator.startswith("the raw report shares: in 16 surveys simulated from IBU")
    assert "closer to the users' own cells" in result.estimator
    assert np.all(result.ci_low <= result.frequencies) and np.all(
        result.frequencies <= result.ci_high
    )
    assert np.all(result.ci_high > result.ci_low)
    # The same choice on the same counts, whatever the threads.
    again = estimate(case.mechanism, counts)
    np.testing.assert_array_equal(again.ci_low, result.ci_low)


def test_drawn_k_rr_reports_follow_the_channel():
    channel = channel_for(KRR(epsilon=1.5, domain=[f"c{i}" for i in range(7)]))
    generator = np.random.default_rng(3)
    users = generator.multinomial(400_000, generator.dirichlet(np.ones(7)))
    drawn = channel.draw_reports(users, generator) / users.sum()
    expected = channel.forward(users / users.sum())
    sd = np.sqrt(expected * (1 - expected) / users.sum())
    assert np.all(np.abs(drawn - expected) <= 5 * sd)
    assert channel.draw_reports(users, np.random.default_rng(3)).sum() == users.sum()


def test_a_k_rr_survey_is_drawn_per_category_whatever_its_users():
    """A survey of 10^12 users over 5 categories: drawn user by user it could not be held in
    memory; per category it follows the channel, and a check's surveys are charged a unit per
    category, not per user."""
    channel = channel_for(KRR(epsilon=2.0, domain=[f"c{i}" for i in range(5)]))
    users = np.array([4, 3, 2, 1, 0]) * 10**11
    drawn = channel.draw_reports(users, np.random.default_rng(5))
    assert drawn.sum() == users.sum() and channel.draw_work(int(users.sum())) == 5
    expected = channel.forward(users / users.sum())
    sd = np.sqrt(expected * (1 - expected) / users.sum())
    assert np.all(np.abs(drawn / users.sum() - expected) <= 5 * sd)
    with budget.metered() as work:
        estimators.check_against_reports(
            users.astype(float),
            channel,
            users / users.sum(),
            lambda reports: reports / reports.sum(),
            estimators.total_variations,
            surveys=4,
        )
    assert work() == 4 * 5


def test_the_report_shares_must_win_by_the_margin():
    check = ReportsCheck(surveys=16, estimate=0.012, rival=0.010, se=0.001, margin=2.0)
    assert not check.rival_wins  # closer by 2 standard errors, not more
    assert ReportsCheck(16, 0.0121, 0.010, 0.001, 2.0).rival_wins
    assert ReportsCheck(16, 0.0101, 0.010, 0.001, 0.0).rival_wins


def test_k_rr_keeps_the_report_shares_where_the_prior_pools_shares_they_told_apart(monkeypatch):
    """Near-uniform shares over 300 categories at epsilon 8, 30,000 users: empirical Bayes's
    posterior means were worse than the raw shares in 8 of 8 seeds (1.015 times their mean
    total variation on seeds 600-607, 1.020 on 1000-1199)."""
    case = krr_case("uniform-ish", 300, 8.0, 30_000)
    channel = channel_for(case.mechanism)
    for seed in (600, 601):
        counts, truth = case.reports(seed)
        fitted = default_estimator(channel).fit(counts, channel)
        assert isinstance(fitted, KRRCheckedAgainstReports) and fitted.kept_reports_
        assert fitted.check_.margin == KRR_REPORTS_CHECK_MARGIN
        np.testing.assert_array_equal(fitted.frequencies_, counts / counts.sum())
        assert fitted.describe().startswith("the raw report shares: in 16 surveys simulated from")
        assert "users' own answers" in fitted.describe()
        assert case.error(truth, fitted.inner_.frequencies_) > case.error(
            truth, fitted.frequencies_
        )
    monkeypatch.setattr(estimators, "KRR_REPORTS_CHECK_MAX_WORK", 0)
    unchecked = default_estimator(channel).fit(counts, channel)
    assert unchecked.check_ is None and not unchecked.kept_reports_


def test_k_rr_keeps_its_estimate_where_it_is_the_better_one():
    case = krr_case("zipf", 30, 2.0, 30_000)
    channel = channel_for(case.mechanism)
    counts, _ = case.reports(600)
    fitted = default_estimator(channel).fit(counts, channel)
    assert not fitted.kept_reports_ and fitted.check_.estimate < 0.3 * fitted.check_.rival
    np.testing.assert_array_equal(fitted.frequencies_, fitted.inner_.frequencies_)
    assert fitted.describe() == fitted.inner_.describe()
    result = estimate(case.mechanism, counts)
    assert result.method == "empirical_bayes" and result.n_iter is None
    np.testing.assert_array_equal(result.frequencies, fitted.frequencies_)


def test_a_check_the_estimate_cannot_afford_is_left_out(monkeypatch):
    """Over its cap, or where it would take more than half of what the estimate's work budget
    has left: the estimate is then the estimator's, and it does not fail for the check."""
    case = krr_case("uniform-ish", 300, 8.0, 30_000)
    channel = channel_for(case.mechanism)
    counts, _ = case.reports(600)
    with budget.metered() as work:
        checked = default_estimator(channel).fit(counts, channel)
    assert checked.kept_reports_
    inner = default_estimator(channel).make()
    with budget.metered() as inner_work:
        inner.fit(counts, channel)
    check = 16 * (30_000 + inner_work())
    assert work() >= inner_work() + check  # the surveys' fits cost about as much each
    with budget.limited(max_work=inner_work() + 2 * check - 1):
        fitted = default_estimator(channel).fit(counts, channel)
    assert fitted.check_ is None and not fitted.kept_reports_
    np.testing.assert_array_equal(fitted.frequencies_, inner.frequencies_)
    monkeypatch.setattr(estimators, "KRR_REPORTS_CHECK_MAX_WORK", check - 1)
    assert default_estimator(channel).fit(counts, channel).check_ is None


def test_a_check_that_costs_more_than_expected_is_left_and_the_estimate_comes_back():
    """A check's cost is judged from the estimate's own fit, and a survey's refit can cost far
    more: every report on one of 1,000 categories (flooded clients) makes two distinct counts
    to fit the prior to, a survey drawn from that estimate several hundred. The check took
    the whole work budget and the estimate failed as too costly; it now stops at its share
    (half of what the budget had left) and the estimate is the estimator's, unchecked."""
    mechanism = KRR(epsilon=8.0, domain=[f"c{i}" for i in range(1000)])
    channel = channel_for(mechanism)
    counts = np.zeros(1000)
    counts[0] = 10**7
    with budget.limited(max_work=10**9):
        fitted = default_estimator(channel).fit(counts, channel)
        assert budget.remaining() >= 10**9 // 2 - 10**8
    assert fitted.check_ is None and not fitted.kept_reports_
    np.testing.assert_array_equal(fitted.frequencies_, fitted.inner_.frequencies_)
    assert fitted.frequencies_[0] > 0.999


def test_k_rr_maximum_likelihood_is_where_ibu_converges():
    """The closed form on 60 random k-RR surveys (3-40 categories, epsilon 0.3-5, 20-5,000
    reports, sparse truths): shares on the simplex, optimal by the Karush-Kuhn-Tucker
    conditions (the log-likelihood's slope ``c_x / q_x`` the same on every share above 0 and
    no larger on those at 0; the likelihood is concave, so that is its maximum), and never
    less likely than IBU after 100,000 steps (which creeps towards shares at 0)."""
    generator = np.random.default_rng(1)
    for _ in range(60):
        k = int(generator.integers(3, 41))
        channel = channel_for(
            KRR(epsilon=float(generator.uniform(0.3, 5.0)), domain=[str(i) for i in range(k)])
        )
        users = generator.multinomial(
            int(generator.integers(20, 5001)), generator.dirichlet(np.full(k, 0.3))
        )
        counts = channel.draw_reports(users, generator)
        closed = channel.maximum_likelihood(counts)
        converged = IBU(max_iter=100_000, tol=1e-13).fit(counts, channel).frequencies_
        assert closed.min() >= 0.0 and closed.sum() == pytest.approx(1.0, abs=1e-12)
        gained = log_likelihood(counts, channel.forward(closed)) - log_likelihood(
            counts, channel.forward(converged)
        )
        assert gained >= -1e-9
        slope = counts / channel.forward(closed)
        inside = closed > 0
        np.testing.assert_allclose(slope[inside], slope[inside].max(), rtol=1e-9)
        assert np.all(slope[~inside] <= slope[inside].max() * (1 + 1e-9))


def test_surveys_for_the_likelihood_check_have_the_spread_the_reports_measure():
    channel = channel_for(KRR(epsilon=2.0, domain=[f"c{i}" for i in range(4)]))
    flat = np.array([250.0, 251.0, 249.0, 250.0])
    world = measured_spread(flat, channel, channel.maximum_likelihood(flat))
    np.testing.assert_array_equal(world, np.full(4, 0.25))
    sharp = np.array([7000.0, 2000.0, 600.0, 400.0])
    likelihood = channel.maximum_likelihood(sharp)
    world = measured_spread(sharp, channel, likelihood)
    # Drawn towards equal shares by a factor just under 1: the noise is small beside the spread.
    apart, measured = likelihood - 0.25, world - 0.25
    factor = float(measured @ apart / (apart @ apart))
    np.testing.assert_allclose(measured, factor * apart)
    assert 0.99 < factor < 1.0 and world.sum() == pytest.approx(1.0)
    # Every report on one category at epsilon 0.01: the observed shares have no variance, but
    # the reports measure nothing, so the surveys have equal shares (and the check is not run).
    faint = channel_for(KRR(epsilon=0.01, domain=["a", "b", "c"]))
    piled = np.array([3000.0, 0.0, 0.0])
    np.testing.assert_allclose(
        measured_spread(piled, faint, faint.maximum_likelihood(piled)), np.full(3, 1 / 3)
    )
    fitted = default_estimator(faint).fit(piled, faint)
    assert fitted.inner_.weight_ == 1.0 and fitted.likelihood_check_ is None


def test_k_rr_takes_the_maximum_likelihood_shares_where_the_prior_pools_few_categories(
    monkeypatch,
):
    """Zipf(1.1) over 10 categories at epsilon 2, 10,000 users: the prior fitted to ten counts
    pools shares the reports tell apart; the maximum-likelihood shares were closer to the users
    in the seeds where surveys simulated with the measured spread said so."""
    case = krr_case("zipf", 10, 2.0, 10_000)
    channel = channel_for(case.mechanism)
    for seed in (300, 301, 304):
        counts, truth = case.reports(seed)
        fitted = default_estimator(channel).fit(counts, channel)
        assert fitted.took_likelihood_ and fitted.check_ is None and not fitted.kept_reports_
        assert fitted.likelihood_check_.margin == estimators.KRR_LIKELIHOOD_CHECK_MARGIN
        np.testing.assert_array_equal(fitted.frequencies_, channel.maximum_likelihood(counts))
        assert case.error(truth, fitted.frequencies_) < 0.85 * case.error(
            truth, fitted.inner_.frequencies_
        )
        assert fitted.describe().startswith("maximum likelihood (the shares that make the")
        assert "than empirical Bayes: posterior means" in fitted.describe()
    result = estimate(case.mechanism, counts)
    assert result.estimator == fitted.describe()
    np.testing.assert_array_equal(result.frequencies, fitted.frequencies_)
    assert np.all(result.ci_low <= result.frequencies) and np.all(
        result.frequencies <= result.ci_high
    )
    monkeypatch.setattr(estimators, "KRR_LIKELIHOOD_CHECK_MARGIN", None)
    unchecked = default_estimator(channel).fit(counts, channel)
    assert unchecked.likelihood_check_ is None and not unchecked.took_likelihood_
    np.testing.assert_array_equal(unchecked.frequencies_, unchecked.inner_.frequencies_)


def test_the_likelihood_check_reaches_a_million_reports_over_30_categories():
    """Zipf over 30 categories at epsilon 4 with 10^6 users: the refits' atoms are fine, the 16
    surveys come to 3.7 x 10^8 units, and under the service's work budget the check still runs
    (it did not, at a cap of 2.5 x 10^8) and takes the maximum-likelihood shares; over the six
    seeds they are the closer to the users by more than a tenth."""
    case = krr_case("zipf", 30, 4.0, 10**6)
    channel = channel_for(case.mechanism)
    ratios = []
    for seed in range(300, 306):
        counts, truth = case.reports(seed)
        with budget.limited(max_work=DEFAULT_MAX_WORK, timeout_s=DEFAULT_TIMEOUT_S):
            fitted = default_estimator(channel).fit(counts, channel)
        assert fitted.likelihood_check_ is not None and fitted.took_likelihood_
        ratios.append(
            case.error(truth, fitted.frequencies_) / case.error(truth, fitted.inner_.frequencies_)
        )
    assert np.mean(ratios) < 0.9, ratios


def test_k_rr_keeps_empirical_bayes_where_it_pools_many_categories_or_the_prior_is_weak():
    """Zipf over 1,000 categories at epsilon 2 with 10^5 users (the reports measure no spread
    beyond their noise: not checked), over 30 at epsilon 2 with 30,000 (checked, kept), and
    near-uniform shares over 10 at epsilon 0.5 with 500 (the prior not supported: the raw
    shares' blend, not checked)."""
    for args, checked in (
        (("zipf", 1000, 2.0, 100_000), False),
        (("zipf", 30, 2.0, 30_000), True),
        (("uniform-ish", 10, 0.5, 500), False),
    ):
        case = krr_case(*args)
        channel = channel_for(case.mechanism)
        counts, _ = case.reports(600)
        fitted = default_estimator(channel).fit(counts, channel)
        assert (fitted.likelihood_check_ is not None) == checked
        assert not fitted.took_likelihood_ and fitted.check_ is not None


def test_after_an_unaffordable_likelihood_check_the_raw_shares_are_not_tried(monkeypatch):
    """Every report on one of 1,000 categories at epsilon 8, 10^7 reports (flooded clients): a
    survey spreads its reports over hundreds of distinct counts and the refits outrun the
    check's share of the budget. The check of the raw shares refits the same estimator on as
    many users; it is not tried once the first was left unfinished (it took as long again)."""
    channel = channel_for(KRR(epsilon=8.0, domain=[f"c{i}" for i in range(1000)]))
    counts = np.zeros(1000)
    counts[0] = 1e7
    calls = []
    real = estimators.check_against_reports

    def counted(*args, **kwargs):
        calls.append(kwargs.get("rival"))
        return real(*args, **kwargs)

    monkeypatch.setattr(estimators, "check_against_reports", counted)
    fitted = default_estimator(channel).fit(counts, channel)
    assert len(calls) == 1 and calls[0] is not None  # the likelihood check, left unfinished
    assert fitted.likelihood_check_ is None and fitted.check_ is None
    np.testing.assert_array_equal(fitted.frequencies_, fitted.inner_.frequencies_)
