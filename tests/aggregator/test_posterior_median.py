"""The posterior median of each category's respondents (aggregator/estimation/posterior_median.py):
randomized response's default, and k-RR's at a high epsilon."""

from __future__ import annotations

import itertools
import math
import tracemalloc

import numpy as np
import pytest
from aggregator_testdata import PLANAR_SPEC

from aggregator.estimation import DenseChannel, KRRChannel, channel_for, estimate
from aggregator.estimation import posterior_median as median_module
from aggregator.estimation.empirical_bayes import KRREmpiricalBayes
from aggregator.estimation.estimators import (
    GEOMETRIC_POSTERIOR_MEDIAN_MAX_NOISE_SHARE,
    KRR_BLEND,
    KRRCheckedAgainstReports,
    cross_validated_ibu,
    default_estimator,
    default_method,
)
from aggregator.estimation.posterior_median import (
    EXACT_MAX_VARIANCE,
    PosteriorMedian,
    geometric_moves,
    noise_share,
    raw_weights,
)
from scripts.bench_estimators import Case, krr_case
from scripts.measure_stopping import geometric_truths
from shared.mechanisms import KRR, Geometric, Mechanism, RandomizedResponse
from shared.spec import MAX_RANGE_VALUES, CampaignSpec


def reports(epsilon: float, share: float, n: int, seed: int) -> tuple[np.ndarray, float]:
    """Report counts of ``n`` users drawn with ``share`` yes, and those users' yes share."""
    generator = np.random.default_rng(seed)
    yes = int(generator.binomial(n, share))
    q = channel_for(RandomizedResponse(epsilon=epsilon)).p_other
    reported = yes - generator.binomial(yes, q) + generator.binomial(n - yes, q)
    return np.array([n - reported, reported], dtype=float), yes / n


def mean_errors(epsilon: float, share: float, n: int, seeds) -> dict[str, float]:
    """Mean absolute error in the yes share (the total variation) of the default, of IBU
    stopped by cross-validation (the default before) and of the raw report shares."""
    # The sweep's draws (python scripts/sweep_defaults.py rr).
    case = Case("rr", np.array([1 - share, share]), RandomizedResponse(epsilon=epsilon), n)
    channel = channel_for(case.mechanism)
    errors: dict[str, list[float]] = {"default": [], "ibu": [], "raw": []}
    for seed in seeds:
        counts, users = case.reports(seed)
        truth = users[1]
        fits = {
            "default": default_estimator(channel).fit(counts, channel).frequencies_,
            "ibu": cross_validated_ibu(channel).fit(counts, channel).frequencies_,
            "raw": counts / counts.sum(),
        }
        for name, fitted in fits.items():
            errors[name].append(abs(fitted[1] - truth))
    return {name: float(np.mean(values)) for name, values in errors.items()}


def test_at_a_high_epsilon_the_default_is_not_worse_than_the_nearly_exact_reports():
    # Epsilon 6: a report is its user's answer with probability 0.9975. Cross-validated IBU,
    # stopped for a population, was 2.1-2.7 times the raw shares' error here; the posterior
    # median keeps a count where no flip is the likeliest explanation (1.000, 0.455, 1.001).
    for share, n in ((0.02, 100), (0.02, 1000), (0.3, 1000)):
        errors = mean_errors(6.0, share, n, range(600, 608))
        assert errors["default"] <= 1.01 * errors["raw"], (share, n, errors)
        assert errors["ibu"] > 2.0 * errors["raw"], (share, n, errors)


def test_with_few_users_the_default_is_not_pulled_towards_one_half():
    # 100 users, p(yes) = 0.3, epsilon 3: IBU stopped early stays near its equal-shares start
    # (1.49 times the raw shares' error); the default is 0.8 times it.
    errors = mean_errors(3.0, 0.3, 100, range(600, 608))
    assert errors["default"] < 0.85 * errors["raw"], errors
    assert errors["ibu"] > 1.4 * errors["raw"], errors


def test_where_the_raw_reports_are_unbiased_the_default_keeps_to_them():
    # p(yes) = 0.5: the raw shares are unbiased and 8 times less noisy than the inversion at
    # epsilon 0.25. The default takes them (within rounding); IBU was 1.23 times their error.
    errors = mean_errors(0.25, 0.5, 30_000, range(600, 608))
    assert errors["default"] <= 1.001 * errors["raw"], errors
    assert errors["ibu"] > 1.2 * errors["raw"], errors


def test_far_from_one_half_the_default_corrects_the_raw_reports():
    # p(yes) = 0.02 at epsilon 1 with 30,000 users: the raw shares are biased by 0.26.
    errors = mean_errors(1.0, 0.02, 30_000, range(600, 604))
    assert errors["default"] < 0.05 * errors["raw"], errors


def exact_posterior_median(c: int, n: int, q: float, q_out: float | None = None) -> int:
    """The posterior median of a category's users by enumerating whether each user's report
    is of it (tiny ``n``): its ``m`` users' reports move away with probability ``q_out``
    (``q`` by default), the others' move to it with probability ``q``."""
    q_out = q if q_out is None else q_out
    likelihood = np.zeros(n + 1)
    for m in range(n + 1):
        for flips in itertools.product((0, 1), repeat=n):
            reported = sum((1 - flip) if user < m else flip for user, flip in enumerate(flips))
            if reported == c:
                likelihood[m] += math.prod(
                    (q_out if user < m else q) if flip else (1 - q_out if user < m else 1 - q)
                    for user, flip in enumerate(flips)
                )
    cumulative = np.cumsum(likelihood) / likelihood.sum()
    return int(np.searchsorted(cumulative, 0.5))


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_the_exact_likelihood_matches_an_enumeration_of_every_flip(epsilon):
    channel = channel_for(RandomizedResponse(epsilon=epsilon))
    n = 7
    for c in range(n + 1):
        fitted = PosteriorMedian().fit(np.array([n - c, c], dtype=float), channel)
        assert fitted.exact_.all()
        low = min(c, n - c)
        median = exact_posterior_median(low, n, channel.p_other)
        assert fitted.median_[0 if c > n - c else 1] * n == pytest.approx(median), c


def test_the_normal_likelihood_takes_over_within_a_user():
    # Just above the exact likelihood's bound, both give the median to within one user.
    for epsilon, n in ((1.0, 2100), (3.0, 9500), (6.0, 170_000)):
        channel = channel_for(RandomizedResponse(epsilon=epsilon))
        q = channel.p_other
        assert n * q * (1 - q) > EXACT_MAX_VARIANCE
        for c in (int(n * q) - 20, int(0.3 * n), n // 2 - 3):
            assert_the_normal_median_is_within_a_user(np.array([n - c, c], dtype=float), channel)


def assert_the_normal_median_is_within_a_user(counts: np.ndarray, channel) -> None:
    normal = PosteriorMedian().fit(counts, channel)
    assert not normal.exact_.any()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(median_module, "EXACT_MAX_VARIANCE", math.inf)
        patch.setattr(median_module, "EXACT_MAX_TERMS", math.inf)
        exact = PosteriorMedian().fit(counts, channel)
    assert exact.exact_.all()
    assert np.all(np.abs(normal.median_ - exact.median_) * counts.sum() < 1.0), counts


def test_both_labels_are_treated_alike():
    for epsilon, n in ((0.25, 500), (1.0, 1000), (4.0, 50_000)):
        channel = channel_for(RandomizedResponse(epsilon=epsilon))
        for c in (0, 3, n // 10, n // 2, n - 1):
            counts = np.array([n - c, c], dtype=float)
            forward = PosteriorMedian().fit(counts, channel).frequencies_
            mirrored = PosteriorMedian().fit(counts[::-1], channel).frequencies_
            np.testing.assert_array_equal(forward, mirrored[::-1])
            assert forward.sum() == pytest.approx(1.0) and np.all(forward >= 0)


def test_the_raw_weight_leans_to_the_raw_shares_unless_the_reports_show_their_bias():
    q, n = 0.3, 10_000
    slope = 1 - 2 * q
    sd = math.sqrt(q * (1 - q) / n) / slope  # the inversion's standard deviation

    def weights(inversion: float) -> np.ndarray:
        c = n * (q + slope * inversion)
        return raw_weights(np.array([n - c, c]), n, q, q)

    # An inversion at one half, or within two of its standard errors of it: the raw shares.
    for inversion in (0.5, 0.5 + 1.9 * sd):
        np.testing.assert_array_equal(weights(inversion), [1.0, 1.0])
    # Far from it: the weight that minimises the mix's squared error (its noise to first order)
    # at the least bias allowed, the same for both labels.
    inversion = 0.1
    apart = abs(1 - 2 * inversion) - 4 * sd
    expected = 2 * sd**2 / (q * apart**2)
    np.testing.assert_allclose(weights(inversion), [expected, expected])
    assert expected < 0.01


def test_degenerate_channels_and_counts():
    # Reports independent of the answers, or equal to them: the raw shares.
    for channel, why in (
        (KRRChannel(2, 0.5, 0.5), "say nothing"),
        (KRRChannel(2, 1.0, 0.0), "changes no answer"),
    ):
        fitted = PosteriorMedian().fit(np.array([30.0, 70.0]), channel)
        np.testing.assert_array_equal(fitted.frequencies_, [0.3, 0.7])
        assert fitted.describe().startswith("raw report shares") and why in fitted.describe()
    channel = channel_for(RandomizedResponse(epsilon=0.25))
    # Counts no population would give (every report "no", far below the flips alone): a
    # share at the edge, no error.
    fitted = PosteriorMedian().fit(np.array([1600.0, 0.0]), channel)
    assert fitted.exact_.all() and fitted.frequencies_[1] < 0.01
    # Counts that are not whole numbers: the normal likelihood.
    fitted = PosteriorMedian().fit(np.array([300.5, 99.5]), channel)
    assert not fitted.exact_.any() and fitted.frequencies_.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="not all zero"):
        PosteriorMedian().fit(np.zeros(2), channel)
    with pytest.raises(TypeError, match="for k-RR and the geometric mechanism"):
        PosteriorMedian().fit(np.ones(3), DenseChannel(np.eye(3)))


def test_the_estimate_api_names_it_and_gives_well_formed_intervals():
    mechanism = RandomizedResponse(epsilon=1.0)
    for n in (2, 300, 30_000):
        counts, _ = reports(1.0, 0.2, n, 5)
        result = estimate(mechanism, counts)
        assert result.method == "posterior_median"
        assert result.n_iter is None and result.converged is None
        assert result.log_likelihood is not None
        assert np.all(result.ci_low <= result.frequencies)
        assert np.all(result.frequencies <= result.ci_high)
        assert np.all(result.ci_high - result.ci_low > 0)
        assert result.ci_low.min() >= 0 and result.ci_high.max() <= 1
        assert result.interval_method.startswith("Wilson score interval")
    planar = Mechanism.from_spec(CampaignSpec.from_dict(PLANAR_SPEC))
    with pytest.raises(ValueError, match="estimates k-RR and the geometric mechanism"):
        estimate(planar, np.ones(planar.n_outputs), method="posterior_median")


def test_k_rr_takes_it_at_a_high_epsilon_and_empirical_bayes_below():
    # The mechanism's noise against a count's variance at equal shares: under 5% from
    # epsilon 5 over 3 categories, 6 over 7, 7.5 over 30.
    for k, below, above in ((3, 4.5, 5.0), (7, 5.5, 6.0), (30, 7.0, 7.5)):
        domain = [f"c{i}" for i in range(k)]
        assert default_method(KRR(epsilon=below, domain=domain)) == "empirical_bayes"
        channel = channel_for(KRR(epsilon=above, domain=domain))
        assert default_method(channel) == "posterior_median"
        checked = default_estimator(channel)  # checked against the raw report shares
        assert isinstance(checked, KRRCheckedAgainstReports)
        assert isinstance(checked.make(), PosteriorMedian)
    # Randomized response at every epsilon.
    assert default_method(RandomizedResponse(epsilon=0.1)) == "posterior_median"
    assert noise_share(channel_for(RandomizedResponse(epsilon=0.1))) > 0.99


@pytest.mark.parametrize("epsilon", [1.0, 3.0])
def test_k_rr_s_exact_likelihood_matches_an_enumeration(epsilon):
    # Over 4 categories a category's users' reports move away with probability 1 - p_keep,
    # three times the others' moving to it (p_other).
    channel = channel_for(KRR(epsilon=epsilon, domain=["a", "b", "c", "d"]))
    q_in, q_out = channel.p_other, 1 - channel.p_keep
    n = 7
    for counts in ([7, 0, 0, 0], [3, 2, 1, 1], [2, 2, 2, 1], [0, 1, 2, 4]):
        fitted = PosteriorMedian().fit(np.array(counts, dtype=float), channel)
        assert fitted.exact_.all()
        expected = [exact_posterior_median(c, n, q_in, q_out) for c in counts]
        np.testing.assert_allclose(fitted.median_ * n, expected)


def test_k_rr_s_normal_likelihood_takes_over_within_a_user():
    # With many reports at epsilon 6 the count's noise is over the exact likelihood's bound,
    # and the normal approximation, at the inversion's variance, is within a user of it.
    channel = channel_for(KRR(epsilon=6.0, domain=["a", "b", "c"]))
    assert_the_normal_median_is_within_a_user(
        np.array([200_000, 90_000, 10_000], dtype=float), channel
    )


def test_k_rr_at_a_high_epsilon_is_not_worse_than_the_raw_reports():
    # Zipf over 3 categories at epsilon 6 with 1,000 users (the sweep's draws, seeds 600-607):
    # empirical Bayes's posterior means, the default before, are 1.155 times the raw shares'
    # mean total variation (checked against the raw shares on simulated surveys, 0.99-1.06
    # depending on the surveys' draws); each category's posterior median keeps a count where
    # no change is the likeliest explanation (0.90).
    case = krr_case("zipf", 3, 6.0, 1000)
    channel = channel_for(case.mechanism)
    errors: dict[str, list[float]] = {"default": [], "empirical Bayes": [], "raw": []}
    for seed in range(600, 608):
        counts, truth = case.reports(seed)
        posterior_means = KRREmpiricalBayes(blend=KRR_BLEND).fit(counts, channel)
        fits = {
            "default": default_estimator(channel).fit(counts, channel).frequencies_,
            "empirical Bayes": posterior_means.frequencies_,
            "raw": counts / counts.sum(),
        }
        for name, fitted in fits.items():
            errors[name].append(case.error(truth, fitted))
    mean = {name: float(np.mean(values)) for name, values in errors.items()}
    assert mean["default"] < 0.95 * mean["raw"], mean
    assert mean["default"] < 0.9 * mean["empirical Bayes"], mean


def test_k_rr_s_estimate_names_the_mix_by_category():
    channel = channel_for(KRR(epsilon=6.0, domain=["a", "b", "c"]))
    fitted = PosteriorMedian().fit(np.array([700.0, 296.0, 4.0]), channel)
    assert fitted.frequencies_.sum() == pytest.approx(1.0)
    # The smallest category's raw share is biased upwards by the other users' reports moved
    # to it: the reports show it, so its posterior median weighs more than the others'.
    assert fitted.raw_weight_[2] < fitted.raw_weight_[0]
    assert "by category" in fitted.describe()
    result = estimate(KRR(epsilon=6.0, domain=["a", "b", "c"]), [700, 296, 4])
    assert result.method == "posterior_median"
    assert np.all(result.ci_low <= result.frequencies)
    assert np.all(result.frequencies <= result.ci_high)


def test_a_mix_whose_weights_round_alike_is_named_by_one_weight():
    # The demo's flu-shot campaign: both answers' weights are 0.159376..., a rounding apart,
    # and the dashboard read "16% to 16% of each".
    channel = channel_for(RandomizedResponse(epsilon=1.0))
    fitted = PosteriorMedian().fit(np.array([843.0, 657.0]), channel)
    assert fitted.raw_weight_.min() != fitted.raw_weight_.max()
    assert fitted.describe().startswith("84% the posterior median")
    assert "16% the raw report shares" in fitted.describe()


def test_the_exact_likelihood_s_size_is_bounded():
    # 300 categories at epsilon 0.5: a category's reports move away with probability 0.99,
    # so a count says little about its users and the posterior spans most of 0..n. Summed
    # exactly that was 30,000 x 30,000 terms per count (7 GB); the normal likelihood is used.
    channel = channel_for(KRR(epsilon=0.5, domain=[f"c{i}" for i in range(300)]))
    counts = np.full(300, 100.0)
    counts[:5] += 50
    tracemalloc.start()
    try:
        fitted = PosteriorMedian().fit(counts, channel)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not fitted.exact_.any()
    assert fitted.frequencies_.sum() == pytest.approx(1.0)
    assert peak < 50e6


def test_the_exact_likelihood_s_total_size_is_bounded():
    # 100 categories at epsilon 1 with 1,400 reports: each count's exact sum is over a million
    # terms. The smallest sums are exact up to EXACT_MAX_TOTAL_TERMS; the others are normal.
    channel = channel_for(KRR(epsilon=1.0, domain=[f"c{i}" for i in range(100)]))
    counts = np.random.default_rng(0).multinomial(1400, np.full(100, 0.01)).astype(float)
    charged = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(median_module.budget, "charge", charged.append)
        fitted = PosteriorMedian().fit(counts, channel)
    assert 0 < fitted.exact_.mean() < 1
    assert sum(charged) <= 2 * median_module.EXACT_MAX_TOTAL_TERMS
    assert fitted.frequencies_.sum() == pytest.approx(1.0)


def test_the_geometric_mechanism_takes_it_from_about_3_per_unit():
    for epsilon, method in ((1.0, "ibu"), (2.8, "ibu"), (3.0, "posterior_median")):
        assert default_method(Geometric(epsilon=epsilon, lo=0, hi=29)) == method
    # Its noise's share away from the range's ends, against the channel's own.
    for epsilon in (1.0, 3.0, 4.0):
        channel = channel_for(Geometric(epsilon=epsilon, lo=0, hi=199))
        rows = channel.forward(np.eye(200))[50:150]
        interior = (1 - np.sum(rows**2, axis=1)) / (1 - 1 / 200)
        assert noise_share(channel) == pytest.approx(interior.max(), rel=1e-9)
    assert noise_share(channel_for(Geometric(epsilon=3.0, lo=0, hi=9))) < (
        GEOMETRIC_POSTERIOR_MEDIAN_MAX_NOISE_SHARE
    )


def test_geometric_moves_are_the_channel_s():
    channel = channel_for(Geometric(epsilon=2.0, lo=0, hi=6))
    rows = channel.forward(np.eye(7))  # a row per true value
    shares = np.array([0.3, 0.0, 0.1, 0.25, 0.05, 0.1, 0.2])
    q_in, q_out = geometric_moves(channel, shares)
    np.testing.assert_allclose(q_out, 1 - np.diag(rows))
    arriving = shares @ rows - shares * np.diag(rows)
    np.testing.assert_allclose(q_in, arriving / (1 - shares))


def geometric_errors(k: int, n: int, shape: str) -> dict[str, float]:
    """Mean total variation at 4 per unit on the sweep's draws (seeds 600-607) of the default,
    of cross-validated IBU from two starts mixed with the raw reports (the default before) and
    of the raw report shares."""
    mechanism = Geometric(epsilon=4.0, lo=0, hi=k - 1)
    case = Case(shape, geometric_truths(k)[shape], mechanism, n)
    channel = channel_for(mechanism)
    errors: dict[str, list[float]] = {"default": [], "before": [], "raw": []}
    for seed in range(600, 608):
        counts, truth = case.reports(seed)
        fits = {
            "default": default_estimator(channel).fit(counts, channel).frequencies_,
            "before": cross_validated_ibu(channel).fit(counts, channel).frequencies_,
            "raw": counts / n,
        }
        for name, fitted in fits.items():
            errors[name].append(case.error(truth, fitted))
    return {name: float(np.mean(values)) for name, values in errors.items()}


def test_the_geometric_mechanism_at_a_high_epsilon_keeps_to_the_nearly_exact_reports():
    # Uniform shares over 30 values with 300 users: a report moves with probability 0.036, in
    # and out of a value alike, so the raw shares are nearly unbiased. The default before was
    # 1.042 times their error; the posterior median takes them (1.000).
    errors = geometric_errors(30, 300, "uniform")
    assert errors["default"] <= 1.001 * errors["raw"], errors
    assert errors["before"] > 1.03 * errors["raw"], errors
    # Zipf shares over 10 values piled at the high end with 3,000 users: the reports moved off
    # the top value are seen, and corrected (0.83 of the raw shares' error; before, 1.000).
    errors = geometric_errors(10, 3000, "Zipf, high end")
    assert errors["default"] < 0.9 * errors["raw"], errors
    assert errors["before"] > 0.99 * errors["raw"], errors


def test_a_geometric_estimate_names_it_and_holds_its_intervals():
    mechanism = Geometric(epsilon=4.0, lo=0, hi=9)
    counts = np.array([120, 60, 30, 20, 10, 5, 3, 1, 0, 1], dtype=float)
    result = estimate(mechanism, counts)
    assert result.method == "posterior_median"
    assert "each value's" in result.estimator
    assert result.frequencies.sum() == pytest.approx(1.0)
    assert np.all(result.ci_low <= result.frequencies)
    assert np.all(result.frequencies <= result.ci_high)
    assert np.all(result.ci_high - result.ci_low > 0)


def test_over_many_values_the_exact_medians_are_bounded_in_number():
    # Each exact median is a step of its own: over the largest range a geometric campaign may
    # have, most take the normal likelihood, and the default stays IBU above 1,000 values.
    assert default_method(Geometric(epsilon=4.0, lo=0, hi=999)) == "posterior_median"
    assert default_method(Geometric(epsilon=4.0, lo=0, hi=1000)) == "ibu"
    channel = channel_for(Geometric(epsilon=4.0, lo=0, hi=MAX_RANGE_VALUES - 1))
    counts = np.random.default_rng(0).poisson(1.0, MAX_RANGE_VALUES).astype(float)
    fitted = PosteriorMedian().fit(counts, channel)
    assert fitted.exact_.sum() == median_module.EXACT_MAX_COUNTS
    assert fitted.frequencies_.sum() == pytest.approx(1.0)
