"""Confidence intervals for every estimator.

* Inversion (unbiased): analytic. The report frequencies ``q`` are
  multinomial, ``Cov(q) = (diag(q) - q q^T) / n``, and ``p = q C^{-1}`` is
  linear, so ``Var(p_x) = (sum_y M[x, y]^2 q_y - p_x^2) / n`` with
  ``M = C^{-T}``, estimated with the observed ``q``; the interval is
  ``p_x +- z sd_x``. k-RR has the closed form ``q_x (1 - q_x) / (n (p - q)^2)``;
  small channels use the explicit inverse; large ones estimate
  ``sum_y M[x, y]^2 q_y`` with random-sign probes (``E[(M D^1/2 z)_x^2]``
  for Rademacher ``z``), one solve per probe, around the exact value for the
  periodic inverse where the channel has one (planar Laplace).
* Clip, projection and IBU (non-linear): parametric bootstrap. Report counts
  are redrawn from ``Multinomial(n, p_hat C)`` and the same estimator is run
  again (IBU for the same number of iterations it chose). Clip and projection
  take the percentile interval of the replicates. IBU takes the *basic*
  (reverse-percentile) interval ``[2 p_hat - hi, 2 p_hat - lo]``, clipped to
  [0, 1]: a replicate starts from uniform and stops early again, so it is
  shrunk towards uniform a second time, and reflecting the quantiles about
  the estimate undoes that first-order shift (percentile intervals covered
  about 86% at a nominal 95% in the tests; basic ones 89-95%).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from scipy.stats import norm

from aggregator.estimation.channels import DENSE_SOLVE_LIMIT, Channel, KRRChannel

VARIANCE_PROBES = 16


def z_value(confidence: float) -> float:
    return float(norm.ppf(0.5 + confidence / 2))


def inversion_variance(
    counts: np.ndarray, channel: Channel, unbiased: np.ndarray, *, seed: int = 0
) -> np.ndarray:
    """Per-entry variance of the unbiased inversion estimate, from the observed counts."""
    n = counts.sum()
    q = counts / n
    if isinstance(channel, KRRChannel):
        return q * (1 - q) / (n * (channel.p_keep - channel.p_other) ** 2)
    if channel.n_inputs <= DENSE_SOLVE_LIMIT:
        second_moment = (channel.inverse_transpose() ** 2) @ q
    else:
        second_moment = _probed_second_moment(q, channel, seed)
    return np.maximum(second_moment - unbiased**2, 0.0) / n


def analytic_interval(
    counts: np.ndarray, channel: Channel, unbiased: np.ndarray, confidence: float, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    sd = np.sqrt(inversion_variance(counts, channel, unbiased, seed=seed))
    z = z_value(confidence)
    return unbiased - z * sd, unbiased + z * sd


def bootstrap_interval(
    counts: np.ndarray,
    channel: Channel,
    fitted: np.ndarray,
    refit: Callable[[np.ndarray], np.ndarray],
    *,
    confidence: float,
    n_bootstrap: int,
    seed: int = 0,
    basic: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of ``refit`` over counts redrawn from ``fitted``'s report distribution."""
    rng = np.random.default_rng(seed)
    n = int(counts.sum())
    predicted = np.maximum(channel.forward(np.maximum(fitted, 0.0)), 0.0)
    predicted /= predicted.sum()
    replicates = np.empty((n_bootstrap, channel.n_inputs))
    for b in range(n_bootstrap):
        replicates[b] = refit(rng.multinomial(n, predicted).astype(float))
    alpha = (1 - confidence) / 2
    low, high = np.quantile(replicates, [alpha, 1 - alpha], axis=0)
    if basic:
        return np.clip(2 * fitted - high, 0.0, 1.0), np.clip(2 * fitted - low, 0.0, 1.0)
    return low, high


def _probed_second_moment(q: np.ndarray, channel: Channel, seed: int) -> np.ndarray:
    """``sum_y M[x, y]^2 q_y`` by random-sign probes, ``E[(M D^1/2 z)_x^2]``.

    Where the channel offers a periodic approximation of its inverse (planar
    Laplace), that approximation's exact value is the baseline and the probes
    only estimate the difference (a control variate): away from the grid's
    edges the difference vanishes and the result is exact; near them the
    probes carry the remapping's correction.
    """
    rng = np.random.default_rng(seed)
    root_q = np.sqrt(q)
    approximate = getattr(channel, "inverse_second_moment", None)
    baseline = approximate(q) if approximate is not None else np.zeros(channel.n_inputs)
    periodic = channel.preconditioner() if approximate is not None else None
    correction = np.zeros(channel.n_inputs)
    for _ in range(VARIANCE_PROBES):
        probe = root_q * rng.choice((-1.0, 1.0), size=channel.n_outputs)
        correction += channel.solve(probe) ** 2
        if periodic is not None:
            correction -= periodic.matvec(probe) ** 2
    return baseline + correction / VARIANCE_PROBES
