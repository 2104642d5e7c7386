"""k-RR empirical Bayes: where it helps, where it does not, and its bounds.

Reports come from fixed seeds, so every assertion is a fixed computation; the
margins are those measured on these seeds (``scripts/bench_krr_empirical_bayes.py``
gives the wider comparison).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import binom
from test_estimation_default import reports, zipf_krr

from aggregator.estimation import IBU, budget, channel_for, empirical_bayes
from aggregator.estimation.channels import KRRChannel, report_counts
from aggregator.estimation.empirical_bayes import (
    DEFAULT_ATOMS,
    KRREmpiricalBayes,
    exact_count_log_probabilities,
    participant_likelihoods,
    prior_atoms,
)
from aggregator.estimation.estimators import (
    KRR_BLEND,
    KRR_SE_RULE,
    default_estimator,
    project_to_simplex,
)
from scripts.bench_estimators import krr_case
from shared.mechanisms import KRR
from simulate.metrics import total_variation
from simulate.populations import Population


def previous_default() -> IBU:
    """k-RR's default before empirical Bayes: IBU stopped by 10-fold cross-validation."""
    return IBU(se_rule=KRR_SE_RULE)


def mean_errors(mechanism, truth, n, seeds, make) -> tuple[float, float, float]:
    """Mean total variation of ``make()``'s estimate, cross-validated IBU's and the raw shares'."""
    channel = channel_for(mechanism)
    fitted, ibu, raw = [], [], []
    for seed in seeds:
        counts, users = reports(mechanism, truth, n, seed)
        fitted.append(total_variation(users, make().fit(counts, channel).frequencies_))
        ibu.append(total_variation(users, previous_default().fit(counts, channel).frequencies_))
        raw.append(total_variation(users, counts / counts.sum()))
    return float(np.mean(fitted)), float(np.mean(ibu)), float(np.mean(raw))


def uniform_ish(k: int) -> np.ndarray:
    weights = 1 + 0.3 * np.random.default_rng(2024).random(k)
    return weights / weights.sum()


def test_the_estimate_is_a_distribution_and_the_prior_a_distribution_on_its_atoms():
    mechanism = KRR(epsilon=2.0, domain=[f"c{i}" for i in range(50)])
    counts, _ = reports(mechanism, Population.zipf(50, 1.1).probabilities, 2000, 0)
    fitted = KRREmpiricalBayes().fit(counts, channel_for(mechanism))
    assert fitted.frequencies_.shape == (50,)
    assert np.all(fitted.frequencies_ >= 0)
    assert fitted.frequencies_.sum() == pytest.approx(1.0)
    assert fitted.prior_.sum() == pytest.approx(1.0)
    assert fitted.atoms_[0] == 0.0 and fitted.atoms_[-1] == pytest.approx(1.0)
    assert fitted.weight_ == 1.0 and fitted.gain_ > 10  # measured: 20.7
    assert "empirical Bayes" in fitted.describe()


def test_with_signal_it_beats_cross_validated_ibu():
    """Zipf(1.1) over 100 categories at epsilon 4 with 1,000 reports (measured mean total
    variation: 0.176 against cross-validated IBU's 0.208; the raw reports 0.370)."""
    mechanism, truth = zipf_krr(100, 4.0)
    fitted, ibu, raw = mean_errors(mechanism, truth, 1000, range(4), KRREmpiricalBayes)
    assert fitted < 0.95 * ibu
    assert fitted < 0.6 * raw


def test_with_little_signal_its_prior_overfits_and_the_blend_falls_back_to_the_raw_shares():
    """Near-uniform shares over 100 categories at epsilon 1 with 10^4 reports: the prior fitted
    to 100 noisy counts is far too dispersed (measured: 2.6 times the raw shares' mean total
    variation); the blend sees no likelihood gain over a homogeneous population and keeps the
    raw shares."""
    mechanism = KRR(epsilon=1.0, domain=[f"c{i}" for i in range(100)])
    truth = uniform_ish(100)
    plain, _, raw = mean_errors(mechanism, truth, 10_000, range(4), KRREmpiricalBayes)
    assert plain > 1.5 * raw
    blended, _, raw = mean_errors(
        mechanism, truth, 10_000, range(4), lambda: KRREmpiricalBayes(blend=(10.0, 30.0))
    )
    assert blended <= raw * (1 + 1e-12)


def test_every_em_step_is_charged_to_the_budget():
    mechanism = KRR(epsilon=1.0, domain=[f"c{i}" for i in range(200)])
    counts, _ = reports(mechanism, Population.zipf(200, 1.1).probabilities, 5000, 1)
    channel = channel_for(mechanism)
    with budget.limited():
        fitted = KRREmpiricalBayes(em_steps=64).fit(counts, channel)
        spent = budget.spent()
    rows = np.unique(counts).size
    # Two priors: the multinomial one for the gain, the participants' (on whole numbers of
    # users, fitted.atoms_) for the posterior means.
    assert fitted.em_steps_ == 2 * 64
    binomial_atoms = prior_atoms(report_counts(counts, channel), channel, DEFAULT_ATOMS).size
    assert spent == 64 * rows * (binomial_atoms + fitted.atoms_.size)
    with budget.limited(max_work=spent // 2), pytest.raises(budget.WorkLimitExceeded):
        KRREmpiricalBayes(em_steps=64).fit(counts, channel)


def test_it_rejects_other_channels_and_bad_counts():
    channel = KRRChannel(3, 0.6, 0.2)
    with pytest.raises(ValueError):
        KRREmpiricalBayes().fit([1.0, -1.0, 2.0], channel)
    with pytest.raises(ValueError):
        KRREmpiricalBayes().fit([0.0, 0.0, 0.0], channel)
    with pytest.raises(ValueError):
        KRREmpiricalBayes().fit([1.0, 2.0], channel)
    with pytest.raises(TypeError):
        KRREmpiricalBayes().fit([1.0, 2.0, 3.0], object())
    with pytest.raises(ValueError):
        KRREmpiricalBayes(blend=(5.0, 5.0))


def test_shares_measured_finely_are_not_moved_onto_the_nearest_atom():
    """Five categories at epsilon 4 with 10^5 reports: each share is measured to about 0.0015,
    while the log-spaced atoms near 0.2 are 0.013 apart. A prior confined to those moved every
    posterior mean onto its nearest atom; with atoms as fine as the measurement, near-uniform
    shares are estimated well below the raw shares' error, and Zipf(1.1) shares as well as by
    the projected inversion, which keeps them where they were measured (measured on these
    seeds: 0.34 and 0.97 of those, against 2.3 and 7.2 with the coarse atoms)."""
    mechanism = KRR(epsilon=4.0, domain=[f"c{i}" for i in range(5)])
    channel = channel_for(mechanism)
    for truth, ratio in ((uniform_ish(5), 0.6), (Population.zipf(5, 1.1).probabilities, 1.2)):
        fitted, baseline = [], []
        for seed in range(4):
            counts, users = reports(mechanism, truth, 100_000, seed)
            estimate = KRREmpiricalBayes(blend=KRR_BLEND).fit(counts, channel).frequencies_
            fitted.append(total_variation(users, estimate))
            if ratio < 1:  # against the raw shares
                baseline.append(total_variation(users, counts / counts.sum()))
            else:  # against the projected inversion
                inverse = (counts / counts.sum() - channel.p_other) / (
                    channel.p_keep - channel.p_other
                )
                baseline.append(total_variation(users, project_to_simplex(inverse)))
        assert np.mean(fitted) < ratio * np.mean(baseline)


def test_at_a_high_epsilon_the_estimate_stays_with_the_nearly_exact_reports():
    """Seven categories at epsilon 6 (each report keeps its answer with probability 0.985)
    from 1,000 users: the reports are nearly the users' own answers, and the estimate is of
    those users' shares. Taken under the multinomial model, whose noise also counts the drawing
    of the users, the posterior means pooled shares the reports had measured apart (measured on
    these seeds: 1.55 times the raw shares' mean total variation, worse in 7 of 8); under the
    mechanism's noise alone, 0.80."""
    mechanism = KRR(epsilon=6.0, domain=[f"c{i}" for i in range(7)])
    channel = channel_for(mechanism)
    truth = Population.zipf(7, 1.1).probabilities
    errors: dict[str, list[float]] = {"participants": [], "multinomial": [], "raw": []}
    for seed in range(8):
        counts, users = reports(mechanism, truth, 1000, seed)
        for noise in ("participants", "multinomial"):
            fitted = KRREmpiricalBayes(blend=KRR_BLEND, noise=noise).fit(counts, channel)
            errors[noise].append(total_variation(users, fitted.frequencies_))
        errors["raw"].append(total_variation(users, counts / counts.sum()))
    raw = np.mean(errors["raw"])
    assert np.mean(errors["participants"]) < 0.9 * raw
    assert np.mean(errors["multinomial"]) > 1.3 * raw
    with pytest.raises(ValueError):
        KRREmpiricalBayes(noise="poisson")


def test_small_counts_get_the_exact_probability_of_kept_and_stray_reports():
    # A category holding u of the n users receives Binomial(u, p_keep) of their reports and
    # Binomial(n - u, p_other) stray ones: the full convolution, computed directly.
    channel = channel_for(KRR(epsilon=3.0, domain=[f"c{i}" for i in range(5)]))
    n = 40
    users = np.arange(n + 1)
    exact = np.exp(exact_count_log_probabilities(n, n, channel, users / n))
    for u in users:
        kept = binom.pmf(np.arange(u + 1), u, channel.p_keep)
        stray = binom.pmf(np.arange(n - u + 1), n - u, channel.p_other)
        np.testing.assert_allclose(exact[u], np.convolve(kept, stray), atol=1e-15)
    counts = np.array([0.0, 1.0, 2.0, 35.0])
    rows = participant_likelihoods(counts, n, channel, users / n)
    np.testing.assert_allclose(rows[:3], exact[:, :3].T / exact[:, :3].max(axis=0)[:, None])
    assert rows.max(axis=1).tolist() == [1.0] * 4


def test_few_reports_per_category_at_a_high_epsilon_are_not_worse_than_the_raw_shares():
    """Zipf(1.1) over 300 categories at epsilon 8 from 1,000 users: most categories hold 0, 1
    or 2 users and a stray report or none. Under a normal likelihood a count of 1 was about as
    likely from a stray report as from a user, the posterior means spread fractions of a user
    over those categories, and the default was 1.054 times the raw shares' mean total
    variation (worse in 7 of these 8 seeds); with the small counts' exact likelihood, 0.953."""
    case = krr_case("zipf", 300, 8.0, 1000)
    channel = channel_for(case.mechanism)
    fitted, raw = [], []
    for seed in range(100, 108):
        counts, truth = case.reports(seed)
        fitted.append(
            case.error(truth, default_estimator(channel).fit(counts, channel).frequencies_)
        )
        raw.append(case.error(truth, counts / counts.sum()))
    assert np.mean(fitted) < 0.98 * np.mean(raw)


def test_fractional_counts_keep_the_normal_likelihood(monkeypatch):
    # Weighted reports give fractional counts, which have no exact probability (taking 0.5 as
    # a count of 0 was wrong): their rows are the normal curve's, whole counts' the exact ones.
    channel = channel_for(KRR(epsilon=8.0, domain=[f"c{i}" for i in range(6)]))
    users = np.arange(41) / 40
    counts = np.array([0.5, 1.5, 2.0, 8.0, 10.0, 18.0])
    rows = participant_likelihoods(counts, 40.0, channel, users)
    monkeypatch.setattr(empirical_bayes, "EXACT_COUNT_MAX", -1)
    normal = participant_likelihoods(counts, 40.0, channel, users)
    monkeypatch.undo()
    np.testing.assert_allclose(rows[:2], normal[:2])
    assert not np.allclose(rows[2], normal[2])
    fitted = KRREmpiricalBayes().fit(counts, channel)
    assert np.isclose(fitted.frequencies_.sum(), 1.0) and np.all(fitted.frequencies_ >= 0)


@pytest.mark.parametrize(
    ("k", "epsilon", "counts"),
    [(3, 0.01, [3000, 0, 0]), (3, 0.01, [0, 1500, 1500]), (7, 1.0, [10**7, 0, 0, 0, 0, 0, 0])],
)
def test_counts_no_share_makes_likely_still_get_an_estimate(k, epsilon, counts):
    # At epsilon 0.01 over 3 categories a report lands on any category with probability about
    # 1/3 whatever the users hold, so no category goes without a report from 3,000 users
    # (flooded or broken clients can still store such counts). A count of 0 then had a
    # probability below the smallest float at every atom: its likelihood row was all 0, the
    # prior's EM divided by 0 and the estimate failed on NaN.
    channel = channel_for(KRR(epsilon=epsilon, domain=[f"c{i}" for i in range(k)]))
    counts = np.asarray(counts, dtype=float)
    rows = participant_likelihoods(np.unique(counts), counts.sum(), channel, np.linspace(0, 1, 11))
    assert np.all(np.isfinite(rows)) and rows.max(axis=1).tolist() == [1.0, 1.0]
    with np.errstate(divide="raise", invalid="raise"):
        fitted = default_estimator(channel).fit(counts, channel)
    assert np.all(np.isfinite(fitted.frequencies_)) and np.isclose(fitted.frequencies_.sum(), 1)
    # The estimate follows the reports: the categories they fell on hold every user.
    assert fitted.frequencies_[counts > 0].sum() > 0.99
