"""OLH and OUE: their laws on the device and in simulation, OLH's channel and the estimators."""

from __future__ import annotations

import random

import numpy as np
import pytest
from shared_stats import GOF_ALPHA, chi_square_gof, scalar_counts

from aggregator.estimation import channel_for
from aggregator.estimation.oracles import OLHChannel, olh_buckets, oue_estimate
from shared.domain import Domain
from shared.errors import ReportError
from shared.oracles import MAX_HASH_RANGE, OLH, OUE, hash_parameters, hash_range, hash_value
from simulate.sampling import oue_ones, sample

N = 60_000


def olh(k: int = 10, epsilon: float = 1.0, pool_size: int = 8) -> OLH:
    return OLH(epsilon=epsilon, domain_size=k, pool_size=pool_size)


def dense(m: OLH) -> np.ndarray:
    """OLH's channel written from its definition, with the scalar hash."""
    rows = np.full((m.k, m.n_outputs), m.p_other / m.pool_size)
    for x in range(m.k):
        for s in range(m.pool_size):
            rows[x, s * m.g + m.bucket(s, x)] = m.p_keep / m.pool_size
    return rows


def test_hash_range_is_rounded_e_to_the_epsilon_plus_one():
    assert hash_range(1.0) == 4  # round(2.718) + 1
    assert hash_range(0.1) == 2
    assert hash_range(3.0) == 21
    assert hash_range(20.0) == MAX_HASH_RANGE


def test_numpy_hash_is_the_device_hash():
    values = np.arange(0, 2**32, 2**32 // 5000, dtype=np.uint64)
    for seed in (0, 1, 1023):
        a, b = hash_parameters(seed)
        for g in (2, 4, 21, MAX_HASH_RANGE):
            expected = [hash_value(a, b, int(x), g) for x in values]
            np.testing.assert_array_equal(olh_buckets(a, b, values, g), expected)


def test_hash_buckets_are_near_uniform_and_pairs_collide_at_one_over_g():
    m = olh(k=2_000, epsilon=1.0, pool_size=1024)
    channel = OLHChannel(m)
    buckets = np.stack([channel.buckets(s) for s in range(m.pool_size)])
    shares = np.bincount(buckets.ravel(), minlength=m.g) / buckets.size
    np.testing.assert_allclose(shares, 1 / m.g, atol=0.005)
    # Pairs at a few distances (neighbours are the hard case for multiply-shift): their rate
    # of collision over the pool's functions is 1/g within its standard error over seeds.
    for distance in (1, 2, 7, 1000):
        per_seed = (buckets[:, :-distance] == buckets[:, distance:]).mean(axis=1)
        se = per_seed.std(ddof=1) / np.sqrt(m.pool_size)
        assert abs(per_seed.mean() - 1 / m.g) < 4 * se, (distance, per_seed.mean(), se)


@pytest.mark.parametrize(("k", "epsilon", "pool_size"), [(3, 0.5, 4), (10, 1.0, 8), (6, 2.5, 3)])
def test_device_and_vectorised_samplers_follow_the_channel(k, epsilon, pool_size):
    m = olh(k, epsilon, pool_size)
    rows = dense(m)
    np.testing.assert_allclose(rows.sum(axis=1), 1.0, rtol=1e-12)
    generator = np.random.default_rng(k)
    for x in (0, k - 1):
        fit = chi_square_gof(scalar_counts(m, x, N, seed=40 + x), rows[x])
        assert fit.p_value > GOF_ALPHA, ("device", x, fit)
        drawn = np.bincount(sample(m, np.full(N, x), generator), minlength=m.n_outputs)
        fit = chi_square_gof(drawn, rows[x])
        assert fit.p_value > GOF_ALPHA, ("vectorised", x, fit)


@pytest.mark.parametrize("compiled", [True, False])
def test_channel_products_match_the_matrix(compiled):
    m = olh(k=37, epsilon=2.0, pool_size=5)
    channel = channel_for(m)
    assert isinstance(channel, OLHChannel)
    if not compiled:
        channel._loops = None
    matrix = dense(m)
    np.testing.assert_allclose(channel.to_dense(), matrix, atol=1e-15)
    u = np.random.default_rng(2).random(m.n_outputs)
    np.testing.assert_allclose(channel.backward(u), matrix @ u, atol=1e-13)
    p = np.random.default_rng(3).dirichlet(np.ones(37))
    np.testing.assert_allclose(channel.forward(p), p @ matrix, atol=1e-15)


def test_support_estimate_is_unbiased_over_pools_and_its_variance_is_the_closed_form():
    """Fresh pools for every repetition: the estimate's mean is the truth and its spread is
    the multinomial variance plus the pool's collision term."""
    k, n, reps = 30, 20_000, 200
    truth = np.random.default_rng(5).dirichlet(np.ones(k))
    generator = np.random.default_rng(6)
    estimates = []
    for rep in range(reps):
        m = OLH(epsilon=1.0, domain_size=k, pool_size=1)
        # A different single hash function each time: shift the pool's seed index.
        m.__dict__["pool"] = (hash_parameters(rep + 10),)
        channel = OLHChannel(m)
        counts = np.bincount(
            sample(m, generator.choice(k, size=n, p=truth), generator), minlength=m.n_outputs
        )
        estimates.append(channel.solve(counts / n))
    estimates = np.array(estimates)
    error = estimates.mean(axis=0) - truth
    sd = estimates.std(axis=0, ddof=1)
    assert np.all(np.abs(error) < 4 * sd / np.sqrt(reps))


def test_report_values_are_checked():
    m = olh(k=10, pool_size=8)
    assert m.parse_report_value(31) == 31
    for bad in (32, -1, True, "3", 2.0):
        with pytest.raises(ReportError):
            m.parse_report_value(bad)
    with pytest.raises(ReportError):
        m.encode(10)
    labelled = OLH(epsilon=1.0, domain=["a", "b", "c"])
    assert labelled.encode("c") == 2
    with pytest.raises(ReportError):
        labelled.encode(2)


def test_domain_takes_labels_or_a_size():
    with pytest.raises(TypeError):
        Domain()
    with pytest.raises(TypeError):
        Domain(labels=["a", "b"], size=2)
    with pytest.raises(ValueError):
        Domain(size=1)
    with pytest.raises(ValueError):
        Domain(labels=["a", "a"])
    assert Domain(size=5).value(3) == 3
    assert Domain(labels=["x", "y"]).value(1) == "y"


def test_oue_device_bits_follow_p_and_q():
    m = OUE(epsilon=1.0, domain_size=6)
    rng = random.Random(3)
    ones = np.zeros(6)
    reps = 20_000
    for _ in range(reps):
        ones[m.perturb_bits(2, rng)] += 1
    expected = np.full(6, m.q)
    expected[2] = 0.5
    sd = np.sqrt(expected * (1 - expected) / reps)
    assert np.all(np.abs(ones / reps - expected) < 4.5 * sd)
    report = m.perturb(1, rng)
    assert report == sorted(report) and all(0 <= bit < 6 for bit in report)


def test_oue_simulation_and_estimate():
    m = OUE(epsilon=1.0, domain_size=1000)
    generator = np.random.default_rng(8)
    truth = generator.dirichlet(np.ones(1000))
    n = 200_000
    true_counts = generator.multinomial(n, truth)
    estimate, variance = oue_estimate(m, oue_ones(m, true_counts, generator), n)
    z = (estimate - true_counts / n) / np.sqrt(variance)
    assert abs(z.mean()) < 0.15 and 0.85 < z.std() < 1.15


def test_the_pool_correction_removes_the_collision_bias_of_heavy_values():
    """Zipf 1.5 over 2,000 values (38% on the first), 10^6 users, S = 1024: the plain support
    estimate's summed squared error is about 2.5 times its closed form (the pool's collisions
    with the heavy values), the served one within 25% of it; flat data are left alone."""
    k, n = 2_000, 1_000_000
    m = OLH(epsilon=1.0, domain_size=k)
    channel = OLHChannel(m)
    generator = np.random.default_rng(12)
    weights = np.arange(1, k + 1, dtype=float) ** -1.5
    truth = weights / weights.sum()
    excess = m.p_keep - 1 / m.g
    pi = 1 / m.g + truth * excess
    closed = np.sum(pi * (1 - pi)) / (n * excess**2)
    plain, served = [], []
    for _ in range(5):
        users = generator.choice(k, size=n, p=truth)
        counts = np.bincount(sample(m, users, generator), minlength=m.n_outputs)
        plain.append(np.sum((channel.support_estimate(counts / n) - truth) ** 2))
        served.append(np.sum((channel.solve_counts(counts)[0] - truth) ** 2))
    assert np.mean(plain) > 1.6 * closed
    assert np.mean(served) < 1.25 * closed
    flat = np.bincount(
        sample(m, generator.integers(0, k, size=n), generator), minlength=m.n_outputs
    )
    np.testing.assert_array_equal(channel.solve_counts(flat)[0], channel.support_estimate(flat / n))


def test_a_large_epsilon_caps_the_buckets_and_keeps_one_integer_a_report():
    m = OLH(epsilon=20.0, domain_size=1_000_000)
    assert m.g == MAX_HASH_RANGE and m.n_outputs == 1024 * MAX_HASH_RANGE
    rng = random.Random(2)
    reports = [m.perturb(123_456, rng) for _ in range(200)]
    # At this epsilon the true bucket is kept with probability above 0.9999.
    buckets = {divmod(y, m.g)[1] == m.bucket(divmod(y, m.g)[0], 123_456) for y in reports}
    assert buckets == {True}
    assert m.realized_epsilon <= 20.0
