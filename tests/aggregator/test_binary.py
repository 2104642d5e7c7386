"""Randomized response's default, the posterior median of the respondents' share
(aggregator/estimation/binary.py)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from aggregator.estimation import KRRChannel, channel_for, estimate
from aggregator.estimation import binary as binary_module
from aggregator.estimation.binary import EXACT_MAX_VARIANCE, RRPosteriorMedian, raw_weight
from aggregator.estimation.estimators import cross_validated_ibu, default_estimator
from scripts.bench_estimators import Case
from shared.mechanisms import KRR, RandomizedResponse


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


def exact_posterior_median(c: int, n: int, q: float) -> int:
    """The posterior median of the yes count by enumerating every user's flip (tiny ``n``)."""
    likelihood = np.zeros(n + 1)
    for m in range(n + 1):
        for flips in itertools.product((0, 1), repeat=n):
            reported = sum((1 - flip) if user < m else flip for user, flip in enumerate(flips))
            if reported == c:
                likelihood[m] += math.prod(q if flip else 1 - q for flip in flips)
    cumulative = np.cumsum(likelihood) / likelihood.sum()
    return int(np.searchsorted(cumulative, 0.5))


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_the_exact_likelihood_matches_an_enumeration_of_every_flip(epsilon):
    channel = channel_for(RandomizedResponse(epsilon=epsilon))
    n = 7
    for c in range(n + 1):
        fitted = RRPosteriorMedian().fit(np.array([n - c, c], dtype=float), channel)
        assert fitted.exact_
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
            counts = np.array([n - c, c], dtype=float)
            normal = RRPosteriorMedian().fit(counts, channel)
            assert not normal.exact_
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(binary_module, "EXACT_MAX_VARIANCE", math.inf)
                exact = RRPosteriorMedian().fit(counts, channel)
            assert exact.exact_
            assert abs(normal.median_[1] - exact.median_[1]) * n < 1.0, (epsilon, n, c)


def test_both_labels_are_treated_alike():
    for epsilon, n in ((0.25, 500), (1.0, 1000), (4.0, 50_000)):
        channel = channel_for(RandomizedResponse(epsilon=epsilon))
        for c in (0, 3, n // 10, n // 2, n - 1):
            counts = np.array([n - c, c], dtype=float)
            forward = RRPosteriorMedian().fit(counts, channel).frequencies_
            mirrored = RRPosteriorMedian().fit(counts[::-1], channel).frequencies_
            np.testing.assert_array_equal(forward, mirrored[::-1])
            assert forward.sum() == pytest.approx(1.0) and np.all(forward >= 0)


def test_the_raw_weight_leans_to_the_raw_shares_unless_the_reports_show_their_bias():
    q, n = 0.3, 10_000
    slope = 1 - 2 * q
    sd = math.sqrt(q * (1 - q) / n) / slope  # the inversion's standard deviation
    # An inversion at one half, or within two of its standard errors of it: the raw shares.
    for inversion in (0.5, 0.5 + 1.9 * sd):
        assert raw_weight(n * (q + slope * inversion), n, q, slope) == 1.0
    # Far from it: the weight that minimises the mix's squared error (its noise to first order)
    # at the least bias allowed.
    inversion = 0.1
    apart = abs(1 - 2 * inversion) - 4 * sd
    expected = 2 * sd**2 / (q * apart**2)
    assert raw_weight(n * (q + slope * inversion), n, q, slope) == pytest.approx(expected)
    assert expected < 0.01


def test_degenerate_channels_and_counts():
    # Reports independent of the answers, or equal to them: the raw shares.
    for channel, why in (
        (KRRChannel(2, 0.5, 0.5), "say nothing"),
        (KRRChannel(2, 1.0, 0.0), "flips no answer"),
    ):
        fitted = RRPosteriorMedian().fit(np.array([30.0, 70.0]), channel)
        np.testing.assert_array_equal(fitted.frequencies_, [0.3, 0.7])
        assert fitted.describe().startswith("raw report shares") and why in fitted.describe()
    channel = channel_for(RandomizedResponse(epsilon=0.25))
    # Counts no population would give (every report "no", far below the flips alone): a
    # share at the edge, no error.
    fitted = RRPosteriorMedian().fit(np.array([1600.0, 0.0]), channel)
    assert fitted.exact_ and fitted.frequencies_[1] < 0.01
    # Counts that are not whole numbers: the normal likelihood.
    fitted = RRPosteriorMedian().fit(np.array([300.5, 99.5]), channel)
    assert not fitted.exact_ and fitted.frequencies_.sum() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="not all zero"):
        RRPosteriorMedian().fit(np.zeros(2), channel)
    with pytest.raises(TypeError, match="two labels"):
        RRPosteriorMedian().fit(np.ones(3), channel_for(KRR(epsilon=1.0, domain=["a", "b", "c"])))


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
    with pytest.raises(ValueError, match="randomized response"):
        estimate(KRR(epsilon=1.0, domain=["a", "b", "c"]), [3, 4, 5], method="posterior_median")
