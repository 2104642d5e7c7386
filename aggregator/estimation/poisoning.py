r"""Poisoning check: could any population of honest users have produced these k-RR counts?

Under k-RR every report is, with probability :math:`kq`, a label drawn
uniformly at random (whatever the user's value) and otherwise the user's
true label (:math:`q` = ``p_other``; :math:`p - q = 1 - kq`). So the counts
are ``c = U + V`` with ``U`` the uniform-noise part, ``U ~ Multinomial(N_U,
1/k)``, ``N_U ~ Binomial(N, kq)``, and ``V >= 0``: whatever the population,
every category receives at least its share of noise. In particular the sum
of the ``j`` smallest counts, :math:`D_j`, is stochastically at least the sum
of the ``j`` smallest components of ``U`` alone. That bound depends only on
``N``, ``k`` and ``q``, and no honest population can fall below it more often
than the bound says.

Fake users who all report one target label (the maximal-gain attack of Cao,
Jia and Gong, USENIX Security 2021) add ``m`` reports to one count and none
to the others: the other categories then hold the noise of only ``N - m``
users, short of the floor by about ``m q`` reports each. When many
categories are rare in the honest population, their total falls measurably
below anything honest users could produce. The check computes

.. math:: z_j = (D_j - \mathrm{E}[D_j^U]) / \mathrm{sd}(D_j^U)

for the cut-offs ``j`` in :func:`cutoffs` (the mean and standard deviation
of the bound are estimated by a seeded simulation), and flags the campaign
when :math:`\min_j z_j < \Phi^{-1}(\alpha / |J|)` (Bonferroni over the
cut-offs, normal approximation of each bound). The false-alarm rate is at
most ``alpha`` for every honest population, up to that approximation.

What it cannot see: if every category holds at least
:math:`\delta q / ((1 - \delta)(p - q))` of the honest population (``delta``
the fake share), the poisoned counts are exactly those of another honest
population, and no test on the counts can tell them apart. RELIABILITY.md
gives the measured power.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.stats import norm

from shared.mechanisms import KRR, Mechanism

DEFAULT_FALSE_ALARM_RATE = 0.001
# Cut-offs at every tenth of the domain, and all but the most reported category.
CUTOFF_FRACTIONS = tuple(i / 10 for i in range(1, 10))
# The expected noise count per category below which the normal approximation is not trusted.
MIN_NOISE_PER_CATEGORY = 10.0
# Simulation size: up to MAX_SIMULATIONS draws of the noise, fewer over many categories (at most
# SIMULATION_BUDGET counts drawn: 500 draws over 1,000 categories, about 0.05 s, the mean and sd of
# a bound within about 5% of its sd), never fewer than MIN_SIMULATIONS.
MAX_SIMULATIONS = 2000
MIN_SIMULATIONS = 100
SIMULATION_BUDGET = 500_000


@dataclass(frozen=True)
class PoisoningCheck:
    """The outcome of the check, as the estimate API serves it.

    ``flagged`` is None when the check could not be made (mechanism or too
    few reports); ``statistic`` and ``threshold`` are z-scores, flagged when
    ``statistic < threshold``.
    """

    flagged: bool | None
    statistic: float | None
    threshold: float | None
    false_alarm_rate: float
    explanation: str
    details: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def not_assessed(cls, false_alarm_rate: float, explanation: str) -> PoisoningCheck:
        """A check that could not be made, and why."""
        return cls(None, None, None, false_alarm_rate, explanation)

    def to_dict(self) -> dict[str, Any]:
        return {
            "flagged": self.flagged,
            "statistic": self.statistic,
            "threshold": self.threshold,
            "false_alarm_rate": self.false_alarm_rate,
            "explanation": self.explanation,
            **self.details,
        }


def cutoffs(k: int) -> list[int]:
    """The numbers ``j`` of least-reported categories whose total is tested."""
    wanted = {round(k * fraction) for fraction in CUTOFF_FRACTIONS} | {k - 1}
    return sorted(j for j in wanted if 1 <= j <= k - 1)


def noise_floor(
    n: int, k: int, p_other: float, js: list[int], *, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sd of the sum of the ``j`` smallest noise-only counts, for each ``j`` in ``js``.

    The simulation depends only on its arguments, so it is kept for the campaigns estimated
    recently (another method or confidence level on the same counts reuses it); the arrays
    returned are read-only.
    """
    return _noise_floor(int(n), int(k), float(p_other), tuple(js), seed)


# Noise floors kept per process: 64, each a few KB (a k = 1,000 one takes about 0.2 s to simulate).
@functools.lru_cache(maxsize=64)
def _noise_floor(
    n: int, k: int, p_other: float, js: tuple[int, ...], seed: int
) -> tuple[np.ndarray, np.ndarray]:
    n_sim = int(np.clip(SIMULATION_BUDGET // k, MIN_SIMULATIONS, MAX_SIMULATIONS))
    generator = np.random.default_rng(seed)
    noise_total = generator.binomial(n, min(k * p_other, 1.0), size=n_sim)
    noise = generator.multinomial(noise_total, np.full(k, 1.0 / k))
    noise.sort(axis=1)
    sums = np.cumsum(noise, axis=1)[:, np.asarray(js) - 1]
    mean, sd = sums.mean(axis=0), sums.std(axis=0, ddof=1)
    mean.flags.writeable = sd.flags.writeable = False
    return mean, sd


def check_krr(
    counts: np.ndarray,
    mechanism: KRR,
    *,
    false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE,
    seed: int = 0,
) -> PoisoningCheck:
    """The poisoning check of k-RR (and binary RR) report counts, in output order."""
    if not 0 < false_alarm_rate < 1:
        raise ValueError(f"false_alarm_rate must be in (0, 1), got {false_alarm_rate!r}")
    counts = np.asarray(counts, dtype=np.int64)
    k, n, q = mechanism.k, int(counts.sum()), mechanism.p_other
    if n * q < MIN_NOISE_PER_CATEGORY:
        return PoisoningCheck.not_assessed(
            false_alarm_rate,
            f"Not assessed: {n:,} reports are too few (each category is expected to get "
            f"at least {MIN_NOISE_PER_CATEGORY:g} reports of noise first).",
        )
    js = cutoffs(k)
    mean, sd = noise_floor(n, k, q, js, seed=seed)
    observed = np.cumsum(np.sort(counts))[np.asarray(js) - 1]
    z = (observed - mean) / np.maximum(sd, 1e-12)
    worst = int(np.argmin(z))
    statistic = float(z[worst])
    threshold = float(norm.ppf(false_alarm_rate / len(js)))
    flagged = statistic < threshold
    j = js[worst]
    shortfall = float(mean[worst] - observed[worst])
    details = {"categories_tested": j, "reports_below_floor": round(shortfall, 1)}
    if flagged:
        explanation = (
            f"The {j} least reported categories received {observed[worst]:,} reports, "
            f"{shortfall:,.0f} fewer than the noise of {n:,} honest reports alone gives them "
            f"(at least about {mean[worst]:,.0f}, sd {sd[worst]:,.0f}). No population of honest "
            f"users produces this under k-RR (z = {statistic:.2f} < {threshold:.2f}; false-alarm "
            f"rate at most {false_alarm_rate:g}). Likely cause: fake reports concentrated on a "
            "few categories (which ones the counts cannot tell)."
        )
    else:
        explanation = (
            f"Consistent with honest reports (z = {statistic:.2f}, flagged below "
            f"{threshold:.2f}; false-alarm rate at most {false_alarm_rate:g}). Fake reports are "
            "only detectable when they push the rarely reported categories below the noise "
            "floor; they cannot be told from honest ones when every category is common."
        )
    return PoisoningCheck(
        flagged=flagged,
        statistic=statistic,
        threshold=threshold,
        false_alarm_rate=false_alarm_rate,
        explanation=explanation,
        details=details,
    )


def check(
    mechanism: Mechanism,
    counts: np.ndarray,
    *,
    false_alarm_rate: float = DEFAULT_FALSE_ALARM_RATE,
    seed: int = 0,
) -> PoisoningCheck:
    """The poisoning check for any campaign; only k-RR and binary RR are assessed."""
    if isinstance(mechanism, KRR):
        return check_krr(counts, mechanism, false_alarm_rate=false_alarm_rate, seed=seed)
    return PoisoningCheck.not_assessed(
        false_alarm_rate,
        f"Not assessed for {mechanism.name}: the check covers k-RR and randomized response.",
    )
