"""Estimators over channel operators: exact recovery, orientation, IBU's ascent, projection.

Exact-recovery tests feed the *expected* report counts ``n * p C``: the
unbiased inversion must return ``p`` to 1e-9 (only rounding separates them;
the channels here have condition numbers below 1e3), and IBU run to
convergence must return it to 1e-6 (the MLE of noiseless counts is ``p``;
the stopping rule ``tol=1e-13`` leaves an error of about
``tol / (1 - rate)``, far below 1e-6 for the convergence rates here).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize

from aggregator.estimation import (
    IBU,
    METHODS,
    DenseChannel,
    EstimateResult,
    KRRChannel,
    MatrixInversion,
    MaximumLikelihood,
    PlanarLaplaceChannel,
    SingularChannelError,
    channel_for,
    estimate,
    project_to_simplex,
)
from aggregator.estimation.channels import log_likelihood
from aggregator.estimation.ibu import IBUSteps, _Folds, held_out_folds
from shared.mechanisms import KRR, Geometric, HadamardResponse, RandomizedResponse

N = 1_000_000
INVERSION_TOL = 1e-9
IBU_TOL = 1e-6


def asymmetric_channel(n_inputs: int, n_outputs: int, seed: int) -> DenseChannel:
    """A random row-stochastic matrix, far from symmetric, with a dominant diagonal-ish band."""
    rng = np.random.default_rng(seed)
    matrix = rng.random((n_inputs, n_outputs)) ** 2 + 0.02
    for x in range(n_inputs):
        matrix[x, (2 * x + 1) % n_outputs] += 1.5  # each input has its own favourite output
    matrix /= matrix.sum(axis=1, keepdims=True)
    assert n_inputs != n_outputs or np.abs(matrix - matrix.T).max() > 0.1
    return DenseChannel(matrix)


def krr_channel(k: int, epsilon: float) -> KRRChannel:
    return channel_for(KRR(epsilon=epsilon, domain=[f"c{i}" for i in range(k)]))


def interior_distribution(size: int, seed: int) -> np.ndarray:
    p = np.random.default_rng(seed).dirichlet(np.full(size, 4.0))
    return 0.5 * p + 0.5 / size  # every entry at least 1 / (2 size)


def converged_ibu() -> MaximumLikelihood:
    return MaximumLikelihood(tol=1e-13, max_iter=200_000)


# -- the operators -------------------------------------------------------------------------


def test_dense_channel_orientation_on_a_rectangular_matrix():
    channel = asymmetric_channel(5, 7, seed=1)
    matrix = channel.to_dense()
    p = interior_distribution(5, seed=2)
    u = np.random.default_rng(3).random(7)
    forward = channel.forward(p)
    backward = channel.backward(u)
    assert forward.shape == (7,) and backward.shape == (5,)
    # forward(p) = p C (a distribution over reports); backward(u) = C u.
    np.testing.assert_allclose(
        forward, [sum(p[x] * matrix[x, y] for x in range(5)) for y in range(7)]
    )
    np.testing.assert_allclose(
        backward, [sum(matrix[x, y] * u[y] for y in range(7)) for x in range(5)]
    )
    assert forward.sum() == pytest.approx(1.0, abs=1e-12)
    # Adjoint identity: <p C, u> = <p, C u>.
    assert forward @ u == pytest.approx(p @ backward, rel=1e-12)


@pytest.mark.parametrize(
    "matrix",
    [
        [[0.5, 0.6], [0.5, 0.5]],  # a row sums to 1.1
        [[1.2, -0.2], [0.5, 0.5]],  # a negative entry
        [0.5, 0.5],  # not two-dimensional
    ],
)
def test_dense_channel_rejects_non_stochastic_matrices(matrix):
    with pytest.raises(ValueError):
        DenseChannel(np.array(matrix))


@pytest.mark.parametrize(("k", "epsilon"), [(2, 0.5), (5, 1.0), (50, 3.0)])
def test_krr_channel_matches_its_dense_matrix(k, epsilon):
    mechanism = KRR(epsilon=epsilon, domain=[f"c{i}" for i in range(k)])
    channel = channel_for(mechanism)
    dense = channel.to_dense()
    expected = np.full((k, k), mechanism.p_other)
    np.fill_diagonal(expected, mechanism.p_keep)
    np.testing.assert_allclose(dense, expected, rtol=1e-14)
    np.testing.assert_allclose(dense.sum(axis=1), 1.0, atol=1e-14)
    rng = np.random.default_rng(k)
    v = rng.random(k)
    np.testing.assert_allclose(channel.forward(v), v @ expected, rtol=1e-12)
    np.testing.assert_allclose(channel.backward(v), expected @ v, rtol=1e-12)


def test_channel_for_uses_the_sampler_probabilities():
    rr = RandomizedResponse(epsilon=1.0)
    channel = channel_for(rr)
    assert isinstance(channel, KRRChannel)
    assert (channel.p_keep, channel.p_other) == (rr.p_keep, rr.p_other)
    with pytest.raises(TypeError):
        channel_for(object())


# -- matrix inversion ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "channel",
    [
        krr_channel(6, 1.0),
        krr_channel(2, 0.3),
        asymmetric_channel(6, 6, seed=4),
        PlanarLaplaceChannel(epsilon=1.0, cell_size_m=1.0, rows=4, cols=5),
    ],
    ids=["krr-6", "rr", "dense-asymmetric-6x6", "planar-4x5"],
)
def test_inversion_recovers_p_from_expected_counts(channel):
    p = interior_distribution(channel.n_inputs, seed=5)
    counts = N * channel.forward(p)
    fitted = MatrixInversion().fit(counts, channel)
    np.testing.assert_allclose(fitted.unbiased_, p, atol=INVERSION_TOL)
    assert fitted.frequencies_ is fitted.unbiased_
    assert fitted.converged_ and fitted.n_iter_ is None
    # Post-processing leaves an interior solution alone.
    for postprocess in ("clip", "projection"):
        other = MatrixInversion(postprocess=postprocess).fit(counts, channel)
        np.testing.assert_allclose(other.frequencies_, p, atol=INVERSION_TOL)


def test_inversion_is_linear_and_unbiased_with_negative_entries():
    # A point mass far from uniform: noisy counts give negative unbiased entries, which
    # clip and projection turn into distributions in their own ways.
    channel = krr_channel(4, 0.5)
    counts = np.array([400.0, 330.0, 120.0, 150.0])
    unbiased = MatrixInversion().fit(counts, channel).unbiased_
    expected = (counts / counts.sum() - channel.p_other) / (channel.p_keep - channel.p_other)
    np.testing.assert_allclose(unbiased, expected, rtol=1e-12)
    assert unbiased.min() < 0 and unbiased.sum() == pytest.approx(1.0, abs=1e-12)
    clipped = MatrixInversion(postprocess="clip").fit(counts, channel).frequencies_
    np.testing.assert_allclose(clipped, np.maximum(expected, 0) / np.maximum(expected, 0).sum())
    projected = MatrixInversion(postprocess="projection").fit(counts, channel).frequencies_
    np.testing.assert_allclose(projected, project_to_simplex(expected))
    assert projected.min() >= 0 and projected.sum() == pytest.approx(1.0, abs=1e-12)


def test_solve_is_the_transposed_system():
    # p C = q, not C p = q: with an asymmetric square matrix the two differ.
    channel = asymmetric_channel(6, 6, seed=6)
    matrix = channel.to_dense()
    p = interior_distribution(6, seed=7)
    q = p @ matrix
    np.testing.assert_allclose(channel.solve(q), p, atol=1e-12)
    assert np.abs(np.linalg.solve(matrix, q) - p).max() > 1e-3


def test_inversion_of_a_rectangular_channel_is_a_value_error():
    # p C = q has no unique solution with more reports than inputs; it must not pass silently.
    channel = asymmetric_channel(5, 7, seed=1)
    counts = N * channel.forward(interior_distribution(5, seed=2))
    with pytest.raises(ValueError):
        MatrixInversion().fit(counts, channel)


@pytest.mark.filterwarnings("ignore::scipy.linalg.LinAlgWarning")
def test_singular_channels_are_refused():
    with pytest.raises(SingularChannelError):
        KRRChannel(3, 1 / 3, 1 / 3).solve(np.full(3, 1 / 3))
    with pytest.raises(SingularChannelError):
        DenseChannel(np.full((3, 3), 1 / 3)).solve(np.full(3, 1 / 3))


@pytest.mark.parametrize(
    "counts", [[1, 2], [1, 2, 3, -1], [0, 0, 0, 0], [1, np.nan, 1, 1], [1, np.inf, 1, 1]]
)
def test_bad_counts_are_refused(counts):
    channel = krr_channel(4, 1.0)
    for estimator in (MatrixInversion(), IBU()):
        with pytest.raises(ValueError):
            estimator.fit(np.array(counts, dtype=float), channel)


def test_estimator_settings_are_validated():
    with pytest.raises(ValueError):
        MatrixInversion(postprocess="round")
    for kwargs in ({"folds": 2}, {"tol": -1.0}, {"tol": float("nan")}, {"max_iter": 0}):
        with pytest.raises(ValueError):
            IBU(**kwargs)
    for kwargs in ({"tol": -1.0}, {"tol": float("nan")}, {"max_iter": 0}):
        with pytest.raises(ValueError):
            MaximumLikelihood(**kwargs)


# -- IBU -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "channel",
    [
        krr_channel(5, 1.0),
        krr_channel(3, 2.0),
        asymmetric_channel(5, 7, seed=8),
        asymmetric_channel(6, 6, seed=9),
        PlanarLaplaceChannel(epsilon=2.0, cell_size_m=1.0, rows=4, cols=4),
        PlanarLaplaceChannel(epsilon=2.5, cell_size_m=1.0, rows=3, cols=5),
    ],
    ids=["krr-5", "krr-3", "dense-5x7", "dense-6x6", "planar-4x4", "planar-3x5"],
)
def test_ibu_run_to_convergence_recovers_p(channel):
    p = interior_distribution(channel.n_inputs, seed=10)
    fitted = converged_ibu().fit(N * channel.forward(p), channel)
    assert fitted.converged_
    assert fitted.closed_form_ or fitted.n_iter_ < 200_000
    assert fitted.frequencies_.shape == (channel.n_inputs,)
    np.testing.assert_allclose(fitted.frequencies_, p, atol=IBU_TOL)
    assert fitted.frequencies_.sum() == pytest.approx(1.0, abs=1e-12)


def test_ibu_orientation_bug_would_be_visible():
    # On the asymmetric channel, IBU run with the transposed matrix lands far from p.
    channel = asymmetric_channel(6, 6, seed=9)
    p = interior_distribution(6, seed=10)
    counts = N * channel.forward(p)
    transposed = DenseChannel(
        channel.to_dense().T / channel.to_dense().T.sum(axis=1, keepdims=True)
    )
    wrong = converged_ibu().fit(counts, transposed).frequencies_
    assert np.abs(wrong - p).max() > 0.01


@pytest.mark.parametrize(
    "channel",
    [
        krr_channel(8, 0.5),
        asymmetric_channel(5, 7, seed=11),
        PlanarLaplaceChannel(epsilon=0.7, cell_size_m=1.0, rows=6, cols=5),
    ],
    ids=["krr-8", "dense-5x7", "planar-6x5"],
)
def test_ibu_log_likelihood_never_decreases_and_the_mle_is_at_least_as_likely(channel):
    rng = np.random.default_rng(12)
    p = rng.dirichlet(np.full(channel.n_inputs, 0.5))  # some entries near zero
    counts = rng.multinomial(2000, channel.forward(p)).astype(float)
    steps = IBUSteps(channel, counts)
    history = []
    for _ in range(3000):
        _, change = steps.advance(1, 1e-10)
        history.append(log_likelihood(counts, steps.predicted))
        if change <= 1e-10:
            break
    history = np.asarray(history)
    assert history.size >= 10
    # EM's ascent property, up to floating-point rounding of a sum of ~2000 * |log q| terms.
    assert np.all(np.diff(history) >= -1e-9 * np.abs(history[:-1]))
    assert history[-1] > history[0]
    # The MLE (k-RR's in closed form, else IBU to its tolerance) is at least as likely as
    # where IBU's steps got, as the truth, and as the projected inversion (if square).
    fitted = MaximumLikelihood(tol=1e-10, max_iter=3000).fit(counts, channel)
    assert fitted.log_likelihood_ >= history[-1] - 1e-9 * abs(history[-1])
    seen = counts > 0

    def log_lik(q):
        return np.sum(counts[seen] * np.log(channel.forward(q)[seen]))

    assert fitted.log_likelihood_ >= log_lik(p)
    if channel.n_inputs == channel.n_outputs:
        projected = MatrixInversion(postprocess="projection").fit(counts, channel).frequencies_
        assert fitted.log_likelihood_ >= log_lik(projected) - 1e-6


def test_ibu_fixed_iterations_and_cross_validated_stopping():
    channel = krr_channel(5, 1.0)
    rng = np.random.default_rng(13)
    counts = rng.multinomial(5000, channel.forward(interior_distribution(5, seed=14)))
    fixed = IBU().fit(counts, channel, n_iter=7)
    assert fixed.n_iter_ == 7 and fixed.converged_
    # Seven steps from uniform by hand.
    p = np.full(5, 0.2)
    for _ in range(7):
        p = p * channel.backward(counts / channel.forward(p))
        p /= p.sum()
    np.testing.assert_allclose(fixed.frequencies_, p, rtol=1e-12)
    cv = IBU(seed=3, extrapolate=False).fit(counts, channel)
    assert cv.cv_.scores_.size == cv.cv_.iterations_.size
    assert cv.n_iter_ == cv.cv_.iterations_[int(np.argmax(cv.cv_.scores_))] >= 1
    assert cv.converged_
    # The split is seeded: the same seed gives the same estimate.
    again = IBU(seed=3, extrapolate=False).fit(counts, channel)
    np.testing.assert_array_equal(again.frequencies_, cv.frequencies_)


# -- projection onto the simplex -----------------------------------------------------------


def brute_force_projection(v: np.ndarray, weight: float = 1e5) -> np.ndarray:
    """argmin ||x - v||^2 subject to x >= 0 and sum x = 1, by a general solver.

    Lawson-Hanson non-negative least squares (an exact active-set method) on
    ``[I; w 1^T] x ~ [v; w]``: the heavy last row enforces ``sum x = 1`` up to
    ``lambda / w^2``, about 1e-8 here (``lambda``, the constraint's multiplier,
    is at most ``max |v| + 1``).
    """
    matrix = np.vstack([np.eye(v.size), np.full((1, v.size), weight)])
    target = np.concatenate([v, [weight]])
    solution, _ = optimize.nnls(matrix, target)
    return solution


@pytest.mark.parametrize("seed", range(30))
def test_projection_matches_a_brute_force_qp(seed):
    rng = np.random.default_rng(seed)
    size = int(rng.integers(2, 25))
    scale = [0.1, 1.0, 10.0][seed % 3]
    v = rng.normal(size=size) * scale + (1.0 / size if seed % 2 else 0.0)
    projected = project_to_simplex(v)
    reference = brute_force_projection(v)
    assert projected.min() >= 0 and projected.sum() == pytest.approx(1.0, abs=1e-12)
    # The reference is within ~1e-8 of the exact projection (see its docstring); the
    # sort-based projection is exact, so it is never worse in the objective.
    np.testing.assert_allclose(projected, reference, atol=1e-6)
    # (The reference may miss sum = 1 by ~1e-8, which lowers its objective a hair.)
    assert np.sum((projected - v) ** 2) <= np.sum((reference - v) ** 2) * (1 + 1e-9) + 1e-12


def test_projection_fixed_points_and_shift_invariance():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(project_to_simplex(p), p, atol=1e-15)
    np.testing.assert_allclose(project_to_simplex(p + 5.0), p, atol=1e-12)
    np.testing.assert_allclose(project_to_simplex(np.array([2.0, 0.0, -1.0])), [1.0, 0.0, 0.0])
    np.testing.assert_allclose(project_to_simplex(np.array([0.7, 0.7, -3.0])), [0.5, 0.5, 0.0])


# -- the one-call API ----------------------------------------------------------------------


@pytest.mark.parametrize("method", [m for m in METHODS if m != "smoothed_projection"])
def test_estimate_returns_a_complete_result(method):
    mechanism = KRR(epsilon=2.0, domain=["a", "b", "c"])
    channel = channel_for(mechanism)
    p = np.array([0.5, 0.3, 0.2])
    counts = np.random.default_rng(15).multinomial(4000, channel.forward(p))
    result = estimate(mechanism, counts, method=method, n_bootstrap=50, seed=1)
    assert isinstance(result, EstimateResult)
    assert result.method == method and result.n == 4000 and result.confidence == 0.95
    assert result.frequencies.shape == result.ci_low.shape == result.ci_high.shape == (3,)
    assert np.all(result.ci_low < result.ci_high)
    assert result.frequencies.sum() == pytest.approx(1.0, abs=1e-9)
    # 4000 reports at epsilon 2: every estimate is within 0.06 of the truth (> 4 sd).
    np.testing.assert_allclose(result.frequencies, p, atol=0.06)
    assert result.seconds >= 0
    body = result.to_dict(mechanism.domain)
    assert [e["label"] for e in body["estimates"]] == ["a", "b", "c"]
    assert {"method", "n", "confidence", "estimates", "interval_method", "seconds"} <= set(body)
    if method in ("projection", "clip", "inversion"):
        # No IBU iterations to report.
        assert result.n_iter is None
    if method == "ibu":
        assert result.n_iter >= 1 and "cross-validation" in result.estimator
    # Reproducible from its seed.
    again = estimate(mechanism, counts, method=method, n_bootstrap=50, seed=1)
    np.testing.assert_array_equal(again.ci_low, result.ci_low)


def test_estimate_rejects_bad_arguments():
    mechanism = KRR(epsilon=1.0, domain=["a", "b"])
    with pytest.raises(ValueError, match="method"):
        estimate(mechanism, [10, 20], method="empirical_bayes")
    for confidence in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="confidence"):
            estimate(mechanism, [10, 20], confidence=confidence)


@pytest.mark.parametrize(
    "mechanism",
    [Geometric(epsilon=0.3, lo=0, hi=40), HadamardResponse(epsilon=1.0, domain_size=100)],
    ids=["geometric", "hadamard"],
)
def test_channels_whose_products_act_by_row_run_folds_side_by_side_exactly(mechanism):
    """``products_by_row``: forward and backward on a matrix are the same on each row as
    alone, so IBU's ten cross-validation folds run as one set of steps (one product per step
    for all of them) and end where they would one at a time, to the bit."""
    channel = channel_for(mechanism)
    assert channel.products_by_row
    generator = np.random.default_rng(3)
    p = generator.dirichlet(np.ones(channel.n_inputs), size=4)
    u = generator.random((4, channel.n_outputs))
    np.testing.assert_array_equal(channel.forward(p), [channel.forward(row) for row in p])
    np.testing.assert_array_equal(channel.backward(u), [channel.backward(row) for row in u])
    counts = generator.multinomial(2000, channel.forward(p[0])).astype(float)
    train = counts - held_out_folds(counts, 10, 0)
    together = _Folds(channel, train)
    assert together._batch is not None
    together.advance(40)
    for row, fold in zip(together.predicted(), train, strict=True):
        apart = IBUSteps(channel, fold)
        apart.advance(40, 0.0)
        np.testing.assert_array_equal(row, apart.predicted)
