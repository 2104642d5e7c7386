"""Hadamard response: its law on the device and in simulation, its channel and inverse."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.linalg import hadamard
from shared_stats import GOF_ALPHA, chi_square_gof, scalar_counts

from aggregator.estimation.oracles import HadamardChannel, walsh_hadamard
from shared.errors import ReportError
from shared.mechanisms import HadamardResponse
from simulate.sampling import sample

N = 100_000


def mechanism(k: int, epsilon: float = 1.0) -> HadamardResponse:
    return HadamardResponse(epsilon=epsilon, domain=[f"v{i}" for i in range(k)])


def dense(m: HadamardResponse) -> np.ndarray:
    """The channel written from the definition, with scipy's Sylvester matrix."""
    h = hadamard(m.size)
    inside, outside = 2 * m.p_in / m.size, 2 * (1 - m.p_in) / m.size
    return np.where(h[1 : m.k + 1] == 1, inside, outside)


@pytest.mark.parametrize(("k", "epsilon"), [(2, 0.5), (5, 1.0), (12, 3.0)])
def test_device_and_vectorised_samplers_follow_the_channel(k, epsilon):
    m = mechanism(k, epsilon)
    rows = dense(m)
    generator = np.random.default_rng(k)
    for x in (0, k - 1):
        fit = chi_square_gof(scalar_counts(m, x, N, seed=40 + x), rows[x])
        assert fit.p_value > GOF_ALPHA, ("device", x, fit)
        drawn = np.bincount(sample(m, np.full(N, x), generator), minlength=m.size)
        fit = chi_square_gof(drawn, rows[x])
        assert fit.p_value > GOF_ALPHA, ("vectorised", x, fit)


def test_channel_products_and_inverse_match_the_matrix():
    m = mechanism(37, 2.0)
    channel = HadamardChannel(m)
    matrix = dense(m)
    assert m.size == 64
    np.testing.assert_allclose(channel.to_dense(), matrix, atol=1e-15)
    np.testing.assert_allclose(matrix.sum(axis=1), 1.0, rtol=1e-12)
    batch = np.random.default_rng(2).random((3, 64))
    np.testing.assert_allclose(channel.backward(batch), batch @ matrix.T, atol=1e-13)
    p = np.random.default_rng(3).dirichlet(np.ones(37))
    np.testing.assert_allclose(channel.solve(channel.forward(p)), p, atol=1e-13)


def test_the_loss_is_the_realised_epsilon_and_never_above_epsilon():
    m = mechanism(20, 1.3)
    logs = np.log(dense(m))
    loss = (logs.max(axis=0) - logs.min(axis=0)).max()
    assert loss == pytest.approx(math.log(m.keep_weight / m.unit_weight), rel=1e-12)
    # Integer weights keep keep / unit <= e^epsilon exactly (tested with k-RR's, the same
    # function); the float channel's logarithm is within rounding of it.
    assert loss <= m.epsilon * (1 + 1e-12)


def test_walsh_hadamard_is_the_sylvester_product():
    values = np.random.default_rng(4).random((2, 32))
    np.testing.assert_allclose(walsh_hadamard(values), values @ hadamard(32), atol=1e-12)
    with pytest.raises(ValueError):
        walsh_hadamard(np.ones(12))


def test_reports_outside_the_outputs_are_refused():
    m = mechanism(5)
    assert m.parse_report_value(7) == 7
    for bad in (-1, 8, 2.0, True, "3"):
        with pytest.raises(ReportError):
            m.parse_report_value(bad)
    with pytest.raises(ReportError):
        m.encode("not a label")
