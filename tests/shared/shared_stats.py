"""Statistical helpers of the shared tests: goodness of fit, its power, the privacy audit.

Every test that uses them runs at a fixed seed, so a pass or a failure is
reproducible; the significance levels below say how unlikely a failure of a
correct implementation would be if the seed were drawn at random.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

# Significance level of one goodness-of-fit test: a correct sampler fails it
# with probability 1e-3 under a random seed.
GOF_ALPHA = 1e-3
# Outputs whose expected count is below this are pooled into one bin, so the
# chi-square approximation of the statistic holds.
MIN_EXPECTED = 5.0


@dataclass(frozen=True)
class GoodnessOfFit:
    statistic: float
    dof: int
    p_value: float


def pooled(counts: np.ndarray, probabilities: np.ndarray, n: int):
    """Observed and expected counts, with every output of expected count < MIN_EXPECTED in one bin."""
    counts = np.asarray(counts, dtype=float)
    expected = n * np.asarray(probabilities, dtype=float)
    small = expected < MIN_EXPECTED
    observed_bins = list(counts[~small])
    expected_bins = list(expected[~small])
    if small.any():
        observed_bins.append(counts[small].sum())
        expected_bins.append(expected[small].sum())
    return np.asarray(observed_bins), np.asarray(expected_bins)


def chi_square_gof(counts: Sequence[int], probabilities: Sequence[float]) -> GoodnessOfFit:
    """Pearson's chi-square test of ``counts`` against the exact ``probabilities``.

    An observation in an output of probability 0 is an immediate failure (p = 0).
    """
    counts = np.asarray(counts, dtype=float)
    probabilities = np.asarray(probabilities, dtype=float)
    assert counts.shape == probabilities.shape
    assert abs(probabilities.sum() - 1) < 1e-9
    n = int(counts.sum())
    if np.any(counts[probabilities == 0] > 0):
        return GoodnessOfFit(math.inf, 0, 0.0)
    support = probabilities > 0
    observed, expected = pooled(counts[support], probabilities[support], n)
    statistic = float(((observed - expected) ** 2 / expected).sum())
    dof = observed.size - 1
    return GoodnessOfFit(statistic, dof, float(stats.chi2.sf(statistic, dof)))


def chi_square_power(n: int, dof: int, tv: float, alpha: float = GOF_ALPHA) -> float:
    """A lower bound on the power of the chi-square test against any alternative at total variation ``tv``.

    The noncentrality of Pearson's statistic under an alternative ``p1`` is
    ``n * sum (p1 - p0)^2 / p0``, and by Cauchy-Schwarz
    ``(sum |p1 - p0|)^2 <= sum (p1 - p0)^2 / p0``, i.e. it is at least
    ``n (2 tv)^2``. (``tv`` is measured on the pooled bins, where any
    difference the test can see lives.)
    """
    critical = stats.chi2.isf(alpha, dof)
    return float(stats.ncx2.sf(critical, dof, n * (2 * tv) ** 2))


def detectable_tv(n: int, dof: int, power: float = 0.99, alpha: float = GOF_ALPHA) -> float:
    """The total-variation shift that the test detects with probability >= ``power``."""
    return float(optimize.brentq(lambda tv: chi_square_power(n, dof, tv, alpha) - power, 1e-9, 1.0))


def scalar_counts(mechanism, x: int, n: int, seed: int) -> np.ndarray:
    """Output counts of ``n`` draws of the on-device sampler for input ``x`` (``random.Random(seed)``)."""
    rng = random.Random(seed)
    perturb = mechanism.perturb_index
    draws = [perturb(x, rng) for _ in range(n)]
    return np.bincount(draws, minlength=mechanism.n_outputs)


def location_counts(mechanism, location: dict, n: int, seed: int) -> np.ndarray:
    """Output counts of ``n`` reports of a true ``location`` through the whole device path:
    snapped to its cell, perturbed, put on the wire (``perturb``) and read back as the server
    reads it (``parse_report_value``), with ``random.Random(seed)``."""
    rng = random.Random(seed)
    perturb, parse = mechanism.perturb, mechanism.parse_report_value
    draws = [parse(perturb(location, rng)) for _ in range(n)]
    return np.bincount(draws, minlength=mechanism.n_outputs)


def scalar_hits(mechanism, x: int, output: int, n: int, seed: int) -> int:
    """How many of ``n`` draws of the on-device sampler for input ``x`` report ``output``."""
    rng = random.Random(seed)
    perturb = mechanism.perturb_index
    return sum(perturb(x, rng) == output for _ in range(n))


def clopper_pearson(k: int, n: int, alpha: float) -> tuple[float, float]:
    """Exact one-sided binomial bounds: ``P(p < lower) <= alpha`` and ``P(p > upper) <= alpha``."""
    lower = 0.0 if k == 0 else float(stats.beta.ppf(alpha, k, n - k + 1))
    upper = 1.0 if k == n else float(stats.beta.ppf(1 - alpha, k + 1, n - k))
    return lower, upper


@dataclass(frozen=True)
class RetestedTriple:
    """A (pair, output) triple re-tested on fresh samples: bounds on its log-ratio.

    ``lower`` is below ``ln(P(y | x) / P(y | x'))`` with probability at least
    ``1 - alpha``, and so is the true value below ``upper`` (each bound spends
    ``alpha / 2`` on each of the two proportions).
    """

    x: int
    other: int
    output: int
    hits_x: int
    hits_other: int
    n: int
    lower: float
    upper: float


def log_ratio_bounds(
    x: int, other: int, output: int, hits_x: int, hits_other: int, n: int, alpha: float
) -> RetestedTriple:
    """Clopper-Pearson bounds on ``ln(P(y | x) / P(y | x'))`` from ``n`` fresh draws of each input."""
    low_x, high_x = clopper_pearson(hits_x, n, alpha / 2)
    low_other, high_other = clopper_pearson(hits_other, n, alpha / 2)
    lower = math.log(low_x) - math.log(high_other) if low_x > 0 else -math.inf
    upper = math.log(high_x) - math.log(low_other) if low_other > 0 else math.inf
    return RetestedTriple(x, other, output, hits_x, hits_other, n, lower, upper)


def bonferroni_z(alpha: float, n_tests: int) -> float:
    """One-sided normal quantile with the level ``alpha`` shared over ``n_tests`` tests."""
    return float(stats.norm.isf(alpha / max(n_tests, 1)))


@dataclass(frozen=True)
class LogRatioCheck:
    """The worst output of a log-ratio audit of one ordered pair of inputs."""

    excess: float  # max over outputs of (estimate - bound - tolerance); <= 0 passes
    output: int
    estimate: float
    bound: float
    tolerance: float
    n_checked: int
    largest: float  # the largest log-ratio estimate over the outputs checked


def log_ratio_audit(
    counts_x: np.ndarray,
    counts_other: np.ndarray,
    bound: float,
    z: float,
    min_count: int,
) -> LogRatioCheck:
    """Compare ``ln(P_hat(y | x) / P_hat(y | x'))`` with ``bound`` for every output seen enough.

    The standard error of ``ln(k / n)`` for a binomial count ``k`` is
    ``sqrt((1 - p) / (n p))`` (delta method), estimated with the observed
    ``p``; the two samples are independent, so the variances add. Outputs with
    fewer than ``min_count`` reports under either input are left out (the
    delta method needs the counts to be well above zero).
    """
    counts_x = np.asarray(counts_x, dtype=float)
    counts_other = np.asarray(counts_other, dtype=float)
    n_x, n_other = counts_x.sum(), counts_other.sum()
    usable = (counts_x >= min_count) & (counts_other >= min_count)
    assert usable.any(), "no output has enough reports to audit"
    p_x = counts_x[usable] / n_x
    p_other = counts_other[usable] / n_other
    estimate = np.log(p_x) - np.log(p_other)
    se = np.sqrt((1 - p_x) / (n_x * p_x) + (1 - p_other) / (n_other * p_other))
    bounds = np.broadcast_to(np.asarray(bound, dtype=float), counts_x.shape)[usable]
    excess = estimate - bounds - z * se
    worst = int(np.argmax(excess))
    outputs = np.flatnonzero(usable)
    return LogRatioCheck(
        excess=float(excess[worst]),
        output=int(outputs[worst]),
        estimate=float(estimate[worst]),
        bound=float(bounds[worst]),
        tolerance=float(z * se[worst]),
        n_checked=int(usable.sum()),
        largest=float(estimate.max()),
    )


def ground_distance_m(lat1: float, lon1: float, lat2: float, lon2: float) -> float:
    """Great-circle distance on the sphere of the mean Earth radius (haversine)."""
    from shared.geo import EARTH_RADIUS_M

    phi1, phi2 = math.radians(lat1), math.radians(lat2)
    half_dphi = (phi2 - phi1) / 2
    half_dlambda = math.radians(lon2 - lon1) / 2
    h = math.sin(half_dphi) ** 2 + math.cos(phi1) * math.cos(phi2) * math.sin(half_dlambda) ** 2
    return 2 * EARTH_RADIUS_M * math.asin(min(1.0, math.sqrt(h)))


def small_grid(rows: int, cols: int, cell_size_m: float, lat0: float = 45.0, lon0: float = 7.0):
    """A report grid of exactly ``rows x cols`` cells (the region is half a cell short of it)."""
    from shared.geo import EARTH_RADIUS_M, Grid, Region

    per_deg_lat = EARTH_RADIUS_M * math.pi / 180
    lat_span = (rows - 0.5) * cell_size_m / per_deg_lat
    per_deg_lon = per_deg_lat * math.cos(math.radians(lat0 + lat_span / 2))
    lon_span = (cols - 0.5) * cell_size_m / per_deg_lon
    grid = Grid(Region(lat0, lat0 + lat_span, lon0, lon0 + lon_span), cell_size_m)
    assert (grid.rows, grid.cols) == (rows, cols)
    return grid
